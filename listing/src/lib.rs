//! What a dataset on disk holds, read the same way by the process that
//! submits a job (to fill in sample counts and the fingerprint) and by every
//! worker (to find the samples and to refuse a dataset that changed).
//!
//! A crate of its own rather than a module of `loader-proto`: it reads files
//! (directory walks, tar headers, npy headers), which the protocol crate and
//! the coordinator have no business doing — the coordinator plans from the
//! counts in the spec and never opens a dataset file. The client and the
//! worker both depend on it, so the listing rules exist exactly once.
//!
//! # Layout
//! - [`image_folder`]: class folders (torchvision's `ImageFolder` order) or
//!   a manifest of `path<TAB>label` lines, and the fingerprint of a listing.
//! - [`bucket_listing`]: a folder in a bucket, listed by the submitter, as
//!   the blob its workers read instead of listing the store again.
//! - [`shard`]: the index of one WebDataset tar shard: members grouped into
//!   samples by key, with the byte range of each member.
//! - [`npy`]: the header of a `.npy` file (versions 1-3): dtype, shape and
//!   where the data starts.
//! - [`parquet`]: the footer of a Parquet file: rows per row group, and the
//!   tensor a row of each column is.
//! - [`source`]: a file or an object in a store (`s3://`), read alike
//!   (and as Parquet readers take them).

pub mod bucket_listing;
pub mod image_folder;
pub mod npy;
pub mod parquet;
pub mod shard;
pub mod source;

/// Why a dataset's files cannot be listed: one line naming the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct ListingError {
    /// The file or folder at fault, as given.
    pub path: String,
    /// What is wrong with it, and what was expected.
    pub problem: String,
}

impl ListingError {
    pub(crate) fn new(path: &std::path::Path, problem: impl Into<String>) -> Self {
        Self { path: path.display().to_string(), problem: problem.into() }
    }

    pub(crate) fn io(path: &std::path::Path, e: &std::io::Error) -> Self {
        Self::new(path, e.to_string())
    }
}
