//! Loader options for Python: the Python SDK passes its keyword options as
//! the JSON of `loader_client::LoaderOptions`, so the names, the defaults and
//! the checks are the Rust SDK's own and Python holds no copy of them.

use loader_client::LoaderOptions;
use pyo3::prelude::*;

use crate::errors::to_py;

/// Every option with its default, as JSON: what `loader.Loader` accepts.
#[pyfunction]
pub(crate) fn default_options() -> PyResult<String> {
    LoaderOptions::default().to_json().map_err(to_py)
}

/// Checks options written as JSON (a missing one keeps its default) and
/// returns them whole, as JSON. Raises `ValueError` in one line naming a bad
/// or unknown option (listing the known ones).
#[pyfunction]
pub(crate) fn check_options(options: &str) -> PyResult<String> {
    parse(options)?.to_json().map_err(to_py)
}

/// The options `json` describes, checked.
pub(crate) fn parse(json: &str) -> PyResult<LoaderOptions> {
    LoaderOptions::from_json(json).map_err(to_py)
}
