//! [`SpecError`], the one error of spec validation, shared by the checks of
//! a job spec ([`crate::spec`]) and of its image pipeline
//! ([`crate::transforms`]) so that neither needs the other to report a bad
//! field.

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
