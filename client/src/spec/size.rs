//! How many bytes a job's batch takes, told from its spec before any batch
//! exists, so the trainer can size its ring and its prefetch window by bytes
//! (see [`loader_proto::window`]): a ring of slots the size of the batch,
//! and many of them when batches are small.
//!
//! An estimate with a margin, not the layout itself: the layout belongs to
//! the worker that writes the batch. A batch that turns out larger than its
//! slot still reaches the trainer, over gRPC. `None` for a dataset only a
//! custom worker knows (the default geometry then applies).

use std::path::Path;

use loader_proto::batch::{FIXED_HEADER_LEN, MAX_NDIM, MAX_NAME_LEN, tensor_bytes};
use loader_proto::pb::{Dtype, JobSpec, dataset_spec::Kind};

/// Bytes of the int64 label the image and synthetic datasets add per sample.
const LABEL: u64 = 8;

/// Upper bound on one tensor's table entry and its payload's alignment.
const PER_TENSOR: u64 = (24 + 8 * MAX_NDIM + MAX_NAME_LEN + 8 + 64) as u64;

/// Upper bound on the bytes of one full batch of `spec`.
pub(crate) fn batch_bytes(spec: &JobSpec) -> Option<u64> {
    let kind = spec.dataset.as_ref()?.kind.as_ref()?;
    let (per_sample, tensors) = sample_bytes(kind, &spec.transforms)?;
    let batch = u64::from(spec.batch_size);
    let header = FIXED_HEADER_LEN as u64 + 8 * batch + PER_TENSOR * tensors;
    per_sample.checked_mul(batch)?.checked_add(header)
}

/// Bytes of one sample and the number of tensors it has.
fn sample_bytes(kind: &Kind, transforms: &[loader_proto::pb::Transform]) -> Option<(u64, u64)> {
    match kind {
        Kind::Synthetic(s) => {
            let dtype = Dtype::try_from(s.dtype).ok()?;
            Some((tensor_bytes(dtype, &s.shape)?.checked_add(LABEL)?, 2))
        }
        Kind::Tokens(t) => {
            let dtype = Dtype::try_from(t.dtype).ok()?;
            Some((tensor_bytes(dtype, &[t.context_length.checked_add(1)?])?, 1))
        }
        Kind::ImageFolder(_) | Kind::Webdataset(_) => {
            let (dtype, shape) = loader_proto::transforms::output(transforms).ok()?;
            Some((tensor_bytes(dtype, &shape)?.checked_add(LABEL)?, 2))
        }
        Kind::Npy(n) => {
            let mut total = 0u64;
            for a in &n.arrays {
                let header = loader_listing::npy::read_header(Path::new(&a.path)).ok()?;
                total = total.checked_add(header.row_bytes()?)?;
            }
            Some((total, n.arrays.len() as u64))
        }
        Kind::Custom(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use loader_proto::batch::{BatchLayout, TensorDesc};

    use super::*;

    /// The estimate bounds the real layout from above, with little slack.
    #[test]
    fn bounds_the_layout_of_a_synthetic_and_a_token_batch() {
        let synthetic = crate::spec::synthetic(1000, &[3, 32, 32], Dtype::U8).batch_size(64).build().expect("spec");
        let real = BatchLayout::new(
            64,
            vec![
                TensorDesc { name: "data".into(), dtype: Dtype::U8, shape: vec![64, 3, 32, 32] },
                TensorDesc { name: "label".into(), dtype: Dtype::I64, shape: vec![64] },
            ],
        )
        .expect("layout")
        .total_len() as u64;
        let estimate = batch_bytes(&synthetic).expect("known");
        assert!(estimate >= real && estimate < real + 2048, "{estimate} vs {real}");

        let mut tokens = synthetic.clone();
        tokens.dataset = Some(loader_proto::pb::DatasetSpec {
            kind: Some(Kind::Tokens(loader_proto::pb::TokensSpec {
                path: "unused".into(),
                dtype: Dtype::U16 as i32,
                context_length: 2048,
                num_tokens: 1 << 20,
            })),
        });
        tokens.batch_size = 1;
        let real = BatchLayout::new(1, vec![TensorDesc { name: "tokens".into(), dtype: Dtype::U16, shape: vec![1, 2049] }])
            .expect("layout")
            .total_len() as u64;
        let estimate = batch_bytes(&tokens).expect("known");
        assert!(estimate >= real && estimate < real + 1024, "{estimate} vs {real}");
    }

    #[test]
    fn a_custom_dataset_has_no_estimate() {
        let spec = crate::spec::custom("squares", 10, Vec::<(String, String)>::new()).batch_size(4).build().expect("spec");
        assert_eq!(batch_bytes(&spec), None);
    }
}
