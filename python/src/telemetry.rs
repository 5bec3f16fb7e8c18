//! Trace export from a Python trainer. When `OTEL_EXPORTER_OTLP_ENDPOINT`
//! is set as the first loader opens, the process exports its spans (each
//! batch's `batch.consume`, and an embedded coordinator's) like every
//! Loader process; otherwise nothing is installed, as before. The package
//! flushes them at exit (`atexit` calls [`flush_telemetry`]); the worker
//! processes set up their own, as `loader-worker` does.

use std::sync::Mutex;

use loader_process::telemetry::{Telemetry, trace};
use pyo3::prelude::*;

/// Held while the interpreter runs; taken (flushing it) at exit.
static TELEMETRY: Mutex<Option<Telemetry>> = Mutex::new(None);
/// Whether [`start`] already looked at the environment.
static STARTED: std::sync::Once = std::sync::Once::new();

/// Starts export once per process, when the environment asks for it.
pub(crate) fn start() {
    STARTED.call_once(|| {
        if trace::wanted() {
            let telemetry = loader_process::telemetry::init("loader-trainer");
            *TELEMETRY.lock().unwrap_or_else(|p| p.into_inner()) = Some(telemetry);
        }
    });
}

/// Exports the spans not yet sent and stops export (at interpreter exit).
#[pyfunction]
pub(crate) fn flush_telemetry(py: Python<'_>) {
    let telemetry = TELEMETRY.lock().unwrap_or_else(|p| p.into_inner()).take();
    py.detach(move || drop(telemetry));
}
