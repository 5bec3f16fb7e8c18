//! The one place a [`loader_client::LoaderError`] becomes a Python
//! exception: what a user got wrong (a bad spec, argument or saved state) is
//! a `ValueError`; everything that went wrong while loading is a
//! `loader.LoaderError`. Messages stay the SDK's one-line messages.

use loader_client::LoaderError as ClientError;
use pyo3::PyErr;
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};

create_exception!(
    loader,
    LoaderError,
    PyRuntimeError,
    "Loading failed: a worker or the coordinator could not deliver, or the job failed."
);

/// The Python exception for `e`: a [`ClientError`], or an error that
/// becomes one (a `loader_job::Error`, through the SDK's one mapping), so
/// spec errors are classified here like every other.
pub(crate) fn to_py(e: impl Into<ClientError>) -> PyErr {
    let e = e.into();
    match e {
        ClientError::InvalidArgument(_)
        | ClientError::InvalidAddress { .. }
        | ClientError::Spec(_)
        | ClientError::Job(_)
        | ClientError::Listing(_)
        | ClientError::State(_) => PyValueError::new_err(e.to_string()),
        other => LoaderError::new_err(other.to_string()),
    }
}
