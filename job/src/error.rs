//! The job model's one error, [`Error`]: why a spec could not be written
//! down or was refused — a field the protocol refuses ([`SpecError`], the
//! payload of [`Error::Spec`] and what every check of a spec returns, the
//! coordinator's own message), a dataset file that cannot be read or
//! counted, a spec file that does not parse. Each message is one line that
//! says what was wrong; the trainer SDK wraps these in its `LoaderError`
//! (in `client/src/error.rs`) with the same words.

use std::path::PathBuf;

use loader_listing::ListingError;

/// A job spec field that holds an impossible value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid job spec: {field}: {problem}")]
pub struct SpecError {
    /// Dotted path of the field, e.g. `batch_size`, `dataset.tokens.path` or
    /// `transforms[1].random_resized_crop.size`.
    pub field: String,
    /// What was wrong and what was expected.
    pub problem: String,
}

/// Fails with a [`SpecError`] naming `field` and what was wrong with it.
pub(crate) fn err<T>(field: impl Into<String>, problem: impl Into<String>) -> Result<T, SpecError> {
    Err(SpecError { field: field.into(), problem: problem.into() })
}


/// Everything that can go wrong while a spec is authored: parsed, counted,
/// hashed or validated.
///
/// Not `#[non_exhaustive]`: the trainer SDK maps every variant onto one of
/// its own with an exhaustive match, so a new variant cannot slip through
/// that mapping unnoticed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec is invalid (the coordinator's message, word for word).
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A dataset's files cannot be listed (missing folder, a file that is
    /// no tar shard or npy array, arrays of different lengths).
    #[error(transparent)]
    Listing(#[from] ListingError),
    /// The token file of a `tokens` dataset cannot be used.
    #[error("token file {}: {cause}", path.display())]
    TokenFile {
        /// Path of the file.
        path: PathBuf,
        /// What is wrong with it.
        cause: String,
    },
    /// The file of a job's blob (a spec's `pickle_file`) cannot be read.
    #[error("blob `{name}` {}: {cause}", path.display())]
    BlobFile {
        /// The blob's name in the spec.
        name: String,
        /// Its file.
        path: PathBuf,
        /// What is wrong with it.
        cause: String,
    },
    /// A spec file (YAML or JSON) does not parse or names a bad value.
    #[error("{origin}: {message}")]
    SpecFile {
        /// The file, or `spec` for text handed in directly.
        origin: String,
        /// The field at fault and what was expected, on one line.
        message: String,
    },
}
