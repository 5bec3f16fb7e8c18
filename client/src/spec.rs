//! Convenient construction of [`JobSpec`]s, validated locally with
//! [`loader_proto::spec::plan`] so a bad spec fails before any network call,
//! with the same one-line message the coordinator would give.

use std::path::{Path, PathBuf};

use loader_proto::pb::{
    DatasetSpec, Dtype, JobSpec, SamplerSpec, SyntheticSpec, TokensSpec, dataset_spec::Kind,
};
use loader_proto::sampler::Plan;

use crate::error::LoaderError;

/// Validates `spec` exactly as the coordinator will.
pub fn validate(spec: &JobSpec) -> Result<Plan, LoaderError> {
    Ok(loader_proto::spec::plan(spec)?)
}

/// A job spec under construction. Start from [`synthetic`] or [`tokens`].
#[derive(Debug, Clone)]
pub struct JobSpecBuilder {
    /// Everything but the token count, which `build` reads from the file.
    spec: JobSpec,
    /// The token file to stat in `build`, for a `tokens` dataset.
    token_file: Option<PathBuf>,
}

/// Generated samples: `data` of `shape`/`dtype` and an int64 `label` per
/// sample. No files; the transport-only benchmark.
pub fn synthetic(num_samples: u64, shape: &[u64], dtype: Dtype) -> JobSpecBuilder {
    JobSpecBuilder::new(Kind::Synthetic(SyntheticSpec {
        num_samples,
        shape: shape.to_vec(),
        dtype: dtype as i32,
        cost_ns: 0,
    }))
}

/// Windows of `context_length + 1` token ids from a flat binary file of
/// `dtype` (uint16 or uint32) ids. The file is stat'ed in
/// [`JobSpecBuilder::build`] to fill in the token count.
pub fn tokens(path: impl AsRef<Path>, dtype: Dtype, context_length: u64) -> JobSpecBuilder {
    let path = path.as_ref();
    // Workers may run elsewhere in the same tree: send an absolute path.
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut b = JobSpecBuilder::new(Kind::Tokens(TokensSpec {
        path: path.to_string_lossy().into_owned(),
        dtype: dtype as i32,
        context_length,
        num_tokens: 0,
    }));
    b.token_file = Some(path);
    b
}

impl JobSpecBuilder {
    fn new(kind: Kind) -> Self {
        Self {
            spec: JobSpec {
                name: String::new(),
                dataset: Some(DatasetSpec { kind: Some(kind) }),
                sampler: Some(SamplerSpec::default()),
                batch_size: 64,
                epochs: 1,
                consumers: 1,
                ..Default::default()
            },
            token_file: None,
        }
    }

    /// Names the job, so other ranks (or a restarted trainer) attach to it.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.spec.name = name.into();
        self
    }

    /// Samples per batch (default 64).
    pub fn batch_size(mut self, batch_size: u32) -> Self {
        self.spec.batch_size = batch_size;
        self
    }

    /// Number of epochs (default 1).
    pub fn epochs(mut self, epochs: u32) -> Self {
        self.spec.epochs = epochs;
        self
    }

    /// Data-parallel ranks (default 1); [`crate::LoaderBuilder::world_size`]
    /// overrides it.
    pub fn consumers(mut self, consumers: u32) -> Self {
        self.spec.consumers = consumers;
        self
    }

    /// Shuffles each epoch with a permutation seeded by `seed`.
    pub fn shuffle(mut self, seed: u64) -> Self {
        let sampler = self.spec.sampler.get_or_insert_default();
        sampler.shuffle = true;
        sampler.seed = seed;
        self
    }

    /// Drops the incomplete tail instead of padding (DataLoader's `drop_last`).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.spec.sampler.get_or_insert_default().drop_last = drop_last;
        self
    }

    /// Busy CPU time per synthetic sample, standing in for decode/augment.
    pub fn cost_ns(mut self, cost_ns: u64) -> Self {
        if let Some(DatasetSpec {
            kind: Some(Kind::Synthetic(s)),
        }) = &mut self.spec.dataset
        {
            s.cost_ns = cost_ns;
        }
        self
    }

    /// Reads the token count (for `tokens`) and validates the spec.
    pub fn build(mut self) -> Result<JobSpec, LoaderError> {
        if let (
            Some(path),
            Some(DatasetSpec {
                kind: Some(Kind::Tokens(t)),
            }),
        ) = (&self.token_file, &mut self.spec.dataset)
        {
            t.num_tokens = count_tokens(path, t.dtype)?;
        }
        validate(&self.spec)?;
        Ok(self.spec)
    }
}

/// Tokens in the file at `path`, from its size.
fn count_tokens(path: &Path, dtype: i32) -> Result<u64, LoaderError> {
    let bad = |cause: String| LoaderError::TokenFile {
        path: path.to_path_buf(),
        cause,
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    let size = match Dtype::try_from(dtype) {
        Ok(d @ (Dtype::U16 | Dtype::U32)) => d.size() as u64,
        // Let spec validation give its usual message for the dtype.
        _ => return Ok(0),
    };
    if meta.len() % size != 0 {
        return Err(bad(format!(
            "{} bytes is not a whole number of {size}-byte tokens",
            meta.len()
        )));
    }
    Ok(meta.len() / size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_builds_and_validates() {
        let spec = synthetic(100, &[3, 4], Dtype::U8)
            .batch_size(8)
            .epochs(2)
            .shuffle(5)
            .build()
            .expect("valid");
        assert_eq!(validate(&spec).expect("plan").batches_per_epoch(), 13);
        assert_eq!(spec.sampler.map(|s| (s.shuffle, s.seed)), Some((true, 5)));
        let e = synthetic(100, &[3], Dtype::U8)
            .batch_size(0)
            .build()
            .expect_err("batch 0");
        assert_eq!(e.to_string(), "invalid job spec: batch_size: must be > 0");
    }

    #[test]
    fn tokens_reads_the_count_from_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("toks.bin");
        std::fs::write(&path, vec![0u8; 2 * 1000]).expect("write");
        let spec = tokens(&path, Dtype::U16, 99)
            .batch_size(2)
            .build()
            .expect("valid");
        match spec.dataset.and_then(|d| d.kind) {
            Some(Kind::Tokens(t)) => assert_eq!(t.num_tokens, 1000),
            other => panic!("unexpected dataset {other:?}"),
        }
        std::fs::write(&path, vec![0u8; 2001]).expect("write");
        let e = tokens(&path, Dtype::U16, 99).build().expect_err("odd size");
        assert!(e.to_string().contains("2001 bytes"), "{e}");
    }

    #[test]
    fn missing_token_file_names_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nope.bin");
        let e = tokens(&path, Dtype::U16, 16).build().expect_err("missing");
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("token file {}: ", path.display())),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }
}
