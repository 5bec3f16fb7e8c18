//! How many bytes a job's batch takes ([`loader_job::footprint`]), with the
//! npy arrays' row sizes read from their headers, so the trainer can size its
//! ring and its prefetch window by bytes (see [`loader_job::window`]).

use std::path::Path;

use loader_proto::pb::JobSpec;

/// Upper bound on the bytes of one full batch of `spec`; `None` for a
/// dataset only a custom worker knows (the default geometry then applies).
pub(crate) fn batch_bytes(spec: &JobSpec) -> Option<u64> {
    loader_job::footprint::batch_bytes_with(spec, |a| {
        loader_listing::npy::read_header(Path::new(&a.path)).ok()?.row_bytes()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_custom_dataset_has_no_estimate() {
        let spec = loader_job::authoring::custom("squares", 10, Vec::<(String, String)>::new()).batch_size(4).build().expect("spec");
        assert_eq!(batch_bytes(&spec), None);
    }
}
