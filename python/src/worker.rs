//! The worker entry point inside the extension module, so that `pip install`
//! ships the worker too: `Loader.local` starts `python -m loader._worker`,
//! which calls [`run_worker`]. No separate binary to find or install. It
//! serves Python datasets too (`python: {...}` jobs, see `dataset`).

use std::process::ExitCode;
use std::sync::Arc;

use loader_job::authoring::file::PYTHON_DATASET;
use loader_proto::pb::CustomSpec;
use loader_worker::{Dataset, Datasets};

use pyo3::prelude::*;

use crate::dataset::PythonDataset;

/// Runs `loader-worker` with `argv` (program name first) until it is told to
/// stop; returns its exit status (0 on a clean stop, 1 on a fatal error,
/// reported on stderr). The GIL is released for the whole run.
#[pyfunction]
pub(crate) fn run_worker(py: Python<'_>, argv: Vec<String>) -> i32 {
    // This interpreter is only the worker's host: its malloc is ours to set.
    loader_process::heap::keep_batch_buffers();
    let datasets = Datasets::new().register(PYTHON_DATASET, |spec: &CustomSpec| {
        Ok(Arc::new(PythonDataset::open(spec)?) as Arc<dyn Dataset>)
    });
    let code = py.detach(move || loader_worker::main_with_datasets(argv, datasets));
    if code == ExitCode::SUCCESS { 0 } else { 1 }
}

/// Writes `message` to this worker's log (info level, target
/// `loader_worker::sample_cache`; shown with `RUST_LOG=info`): what the
/// Python half decided (`loader._cache`).
#[pyfunction]
pub(crate) fn worker_log(message: &str) {
    tracing::info!(target: "loader_worker::sample_cache", "{message}");
}
