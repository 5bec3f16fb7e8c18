//! What a submitter reads from a dataset's files so the coordinator can
//! plan without opening them: the token count, the image listing's size and
//! fingerprint, the samples of each shard, the rows of the npy arrays. The
//! rules come from `loader_listing`, the same code the workers run.

use std::path::Path;

use loader_listing::ListingError;
use loader_proto::pb::{Dtype, JobSpec, dataset_spec::Kind};

use crate::error::LoaderError;

/// Fills in the counts of `kind` from its files.
pub(super) fn fill(kind: &mut Kind) -> Result<(), LoaderError> {
    match kind {
        Kind::Synthetic(_) | Kind::Custom(_) => {}
        Kind::Tokens(t) => t.num_tokens = count_tokens(Path::new(&t.path), t.dtype)?,
        Kind::ImageFolder(f) => {
            let manifest = Some(Path::new(&f.manifest)).filter(|m| !m.as_os_str().is_empty());
            let listing = loader_listing::image_folder::list(Path::new(&f.path), manifest)?;
            f.num_samples = listing.samples.len() as u64;
            f.fingerprint = listing.fingerprint();
        }
        Kind::Webdataset(w) => {
            w.shard_samples = w
                .shards
                .iter()
                .map(|s| loader_listing::shard::index(Path::new(s)).map(|i| i.samples.len() as u64))
                .collect::<Result<_, _>>()?;
        }
        Kind::Npy(n) => {
            let mut rows: Option<(u64, &str)> = None;
            for a in &n.arrays {
                let h = loader_listing::npy::read_header(Path::new(&a.path))?;
                match rows {
                    None => rows = Some((h.rows(), &a.name)),
                    Some((r, first)) if r != h.rows() => {
                        return Err(ListingError {
                            path: a.path.clone(),
                            problem: format!("holds {} rows, array `{first}` holds {r}; every array needs the same rows", h.rows()),
                        }
                        .into());
                    }
                    Some(_) => {}
                }
            }
            n.num_samples = rows.map_or(0, |(r, _)| r);
        }
        Kind::Mix(m) => {
            for source in &mut m.sources {
                if let Some(kind) = source.dataset.as_mut().and_then(|d| d.kind.as_mut()) {
                    fill(kind)?;
                }
            }
            if m.samples_per_epoch == 0 {
                m.samples_per_epoch = loader_proto::spec::mix_default_epoch(m)?;
            }
        }
    }
    Ok(())
}

/// Records the global batch a mixture's blocks are cut by, when the spec
/// leaves it to the job (0): what the job opens with, which a resume on
/// another world size must keep.
pub(crate) fn fix_mix_block(spec: &mut JobSpec) {
    if let Some(Kind::Mix(m)) = spec.dataset.as_mut().and_then(|d| d.kind.as_mut())
        && m.block == 0
    {
        m.block = u64::from(spec.batch_size) * u64::from(spec.consumers.max(1));
    }
}

/// Tokens in the file at `path`, from its size.
fn count_tokens(path: &Path, dtype: i32) -> Result<u64, LoaderError> {
    let bad = |cause: String| LoaderError::TokenFile { path: path.to_path_buf(), cause };
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
        return Err(bad(format!("{} bytes is not a whole number of {size}-byte tokens", meta.len())));
    }
    Ok(meta.len() / size)
}
