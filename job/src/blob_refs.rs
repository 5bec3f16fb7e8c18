//! The checks of a spec's blob list ([`JobSpec::blobs`]): they run inside
//! [`crate::spec::check`] (names, and hashes when given) and
//! [`crate::spec::plan`] (every hash filled in). What a blob is, its name
//! and its limits are the protocol's (`loader_proto::blob`).

use loader_proto::batch::MAX_NAME_LEN;
use loader_proto::blob::{MAX_BLOBS, is_sha256_hex};
use loader_proto::pb::{JobSpec, dataset_spec::Kind};

use crate::error::{SpecError, err};

/// Checks the blob list of `spec` as far as it can be checked before the
/// submitter hashed the files: names, their uniqueness, and any hash given.
pub(crate) fn check_refs(spec: &JobSpec) -> Result<(), SpecError> {
    if spec.blobs.len() > MAX_BLOBS {
        return err("blobs", format!("{} blobs exceed the limit of {MAX_BLOBS} a job", spec.blobs.len()));
    }
    let params = match spec.dataset.as_ref().and_then(|d| d.kind.as_ref()) {
        Some(Kind::Custom(c)) => Some(&c.params),
        _ => None,
    };
    for (i, b) in spec.blobs.iter().enumerate() {
        if b.name.is_empty() || b.name.len() > MAX_NAME_LEN {
            return err(format!("blobs[{i}].name"), format!("must be 1 to {MAX_NAME_LEN} bytes"));
        }
        if spec.blobs[..i].iter().any(|o| o.name == b.name) {
            return err(format!("blobs[{i}].name"), format!("`{}` names two blobs", b.name));
        }
        if params.is_some_and(|p| p.contains_key(&b.name)) {
            return err(
                format!("blobs[{i}].name"),
                format!("`{}` is also a dataset param; the worker sets that param to the blob's local path", b.name),
            );
        }
        if !b.sha256.is_empty() && !is_sha256_hex(&b.sha256) {
            return err(format!("blobs[{i}].sha256"), "must be 64 lowercase hex digits");
        }
    }
    Ok(())
}

/// Checks that every blob of `spec` is named by its hash: what the
/// coordinator and the workers look blobs up by.
pub(crate) fn check_filled(spec: &JobSpec) -> Result<(), SpecError> {
    match spec.blobs.iter().position(|b| b.sha256.is_empty()) {
        Some(i) => err(
            format!("blobs[{i}].sha256"),
            "is empty; the submitter fills it in by hashing the blob's file (the SDK's spec builders do)",
        ),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loader_proto::pb::{BlobRef, CustomSpec, DatasetSpec};

    fn spec(blobs: Vec<BlobRef>, params: &[&str]) -> JobSpec {
        JobSpec {
            dataset: Some(DatasetSpec {
                kind: Some(Kind::Custom(CustomSpec {
                    name: "python".into(),
                    num_samples: 4,
                    params: params.iter().map(|p| ((*p).to_owned(), String::new())).collect(),
                    ..Default::default()
                })),
            }),
            blobs,
            ..Default::default()
        }
    }

    fn blob(name: &str, sha256: &str) -> BlobRef {
        BlobRef { name: name.into(), sha256: sha256.into(), size: 3, source: String::new() }
    }

    #[test]
    fn names_are_unique_and_free_and_hashes_well_formed() {
        let sha = "0".repeat(64);
        assert_eq!(check_refs(&spec(vec![blob("pickle_file", &sha)], &["args"])), Ok(()));
        assert_eq!(check_refs(&spec(vec![blob("pickle_file", "")], &[])), Ok(()), "not hashed yet");
        let field = |s: JobSpec| check_refs(&s).expect_err("bad").field;
        assert_eq!(field(spec(vec![blob("", &sha)], &[])), "blobs[0].name");
        assert_eq!(field(spec(vec![blob("a", &sha), blob("a", &sha)], &[])), "blobs[1].name");
        assert_eq!(field(spec(vec![blob("args", &sha)], &["args"])), "blobs[0].name");
        assert_eq!(field(spec(vec![blob("a", "ABC")], &[])), "blobs[0].sha256");
        assert_eq!(field(spec((0..=MAX_BLOBS).map(|i| blob(&i.to_string(), &sha)).collect(), &[])), "blobs");
    }

    #[test]
    fn a_plan_needs_every_hash() {
        assert_eq!(check_filled(&spec(vec![blob("a", &"1".repeat(64))], &[])), Ok(()));
        let e = check_filled(&spec(vec![blob("a", "")], &[])).expect_err("unhashed");
        assert_eq!(e.field, "blobs[0].sha256");
    }
}
