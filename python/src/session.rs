//! [`NativeLoader`]: one `loader_client::Loader` for Python. Its waits
//! release the GIL (other Python threads run while a batch is awaited) and
//! check for signals every [`SIGNAL_CHECK`], so Ctrl-C raises
//! `KeyboardInterrupt` at once instead of when the next batch arrives; the
//! interrupted wait loses nothing, and the next call yields the batch it
//! was waiting for. [`NativeLoader::close`] works from any thread, even
//! while another one is blocked in `next` (an `atexit` hook while a daemon
//! thread iterates): the blocked call sees the flag within one check and
//! returns, then the loader is dropped, which stops the embedded workers.

use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use loader_client::{Loader, LoaderState};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::batch::Batch;
use crate::errors::{LoaderError, to_py};
use crate::spec::decode;
use crate::sample_cache::PySampleCache;
use crate::template::WorkerTemplate;

/// How often a blocked `next` checks for signals and for `close`.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// One loader: a session on a coordinator, or embedded mode's coordinator
/// and worker processes too.
#[pyclass(frozen, module = "loader._native")]
pub(crate) struct NativeLoader {
    /// None once closed. Locked for the whole of a `next`, so calls from
    /// several threads take turns.
    inner: Mutex<Option<Loader>>,
    /// Set by `close`; a blocked `next` gives up its lock when it sees it.
    closing: AtomicBool,
    /// Fixed at start, so reading them never waits for a blocked `next`.
    worker_pids: Vec<u32>,
    /// Embedded mode's coordinator URL (None for a deployment's).
    coordinator_address: Option<String>,
    /// Batches per epoch for this rank, as the coordinator planned the job.
    batches_per_epoch: u64,
    /// Batches over all epochs for this rank.
    total_batches: u64,
}

/// Why a blocked `next` stopped early.
enum Stop {
    /// A signal handler raised (KeyboardInterrupt).
    Signal(PyErr),
    /// `close` was called meanwhile.
    Closed,
    /// No batch came within the caller's timeout (DataLoader's `timeout`).
    TimedOut(Duration),
}

/// The saved state to resume from, checked.
fn resume_state(resume: Option<&str>) -> PyResult<Option<LoaderState>> {
    resume
        .map(|json| LoaderState::from_json(json).map_err(to_py))
        .transpose()
}

fn closed() -> PyErr {
    LoaderError::new_err("the loader is closed")
}

impl NativeLoader {
    fn wrap(loader: Loader) -> Self {
        Self {
            worker_pids: loader.worker_pids(),
            coordinator_address: loader.coordinator_address(),
            batches_per_epoch: loader.batches_per_epoch(),
            total_batches: loader.total_batches(),
            inner: Mutex::new(Some(loader)),
            closing: AtomicBool::new(false),
        }
    }

    /// The loader, or an error once closed. A poisoned lock (a panic in an
    /// earlier call) is still usable: the loader holds no invariant the
    /// panicking call could have broken half-way.
    fn lock(&self) -> MutexGuard<'_, Option<Loader>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the loader, after any `next` running in another thread.
    /// The lock is taken with the GIL released: a blocked `next` holds it
    /// and needs the GIL to check for signals, so waiting for it with the
    /// GIL held would deadlock.
    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&Loader) -> T + Send) -> PyResult<T> {
        py.detach(|| self.lock().as_ref().map(f)).ok_or_else(closed)
    }
}

#[pymethods]
impl NativeLoader {
    /// Opens a loader on the job `spec` with `options` (the JSON of
    /// `LoaderOptions`, passed whole to the SDK): fed by the coordinator at
    /// `coordinator`, or with `local = (workers, worker_command,
    /// ready_timeout)` by embedded mode's coordinator in this process and
    /// `workers` worker processes started with `worker_command`, or forked
    /// by `template = (WorkerTemplate, threads, cache)` (`loader._template`)
    /// under the thread policy `threads`, each inheriting the sample cache
    /// `cache` when there is one. See
    /// `loader.Loader`. `resume` is a saved state (JSON), else `start_at`
    /// the first batch to yield (the first of the epoch that `set_epoch`
    /// chose before the first iteration).
    #[staticmethod]
    #[pyo3(signature = (spec, options, *, coordinator=None, rank=None, world_size=None, resume=None, start_at=None, local=None, template=None))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        spec: &[u8],
        options: &str,
        coordinator: Option<String>,
        rank: Option<u32>,
        world_size: Option<u32>,
        resume: Option<&str>,
        start_at: Option<u64>,
        local: Option<(usize, Vec<String>, f64)>,
        template: Option<(PyRef<'_, WorkerTemplate>, u32, Option<Py<PySampleCache>>)>,
    ) -> PyResult<Self> {
        crate::telemetry::start();
        let spec = decode(spec)?;
        let mut builder = match (coordinator, local) {
            (Some(coordinator), None) => Loader::builder(coordinator).job(spec),
            (None, Some((workers, command, ready_timeout))) => {
                let ready = Duration::try_from_secs_f64(ready_timeout).map_err(|_| {
                    PyValueError::new_err("ready_timeout must be a positive number of seconds")
                })?;
                let builder = Loader::local_builder(spec, workers).ready_timeout(ready);
                match template {
                    Some((template, threads, cache)) => builder.worker_launcher(template.launcher(threads, cache)),
                    None => builder.worker_command(Some(command.into_iter().map(OsString::from).collect())),
                }
            }
            _ => {
                return Err(PyValueError::new_err(
                    "give either a coordinator or local=(workers, worker_command, ready_timeout)",
                ));
            }
        };
        builder = builder.options(crate::options::parse(options)?);
        if let Some(r) = rank {
            builder = builder.rank(r);
        }
        if let Some(w) = world_size {
            builder = builder.world_size(w);
        }
        if let Some(state) = resume_state(resume)? {
            builder = builder.resume(state);
        }
        if let Some(seq) = start_at {
            builder = builder.start_at(seq);
        }
        let loader = py.detach(move || builder.build()).map_err(to_py)?;
        Ok(Self::wrap(loader))
    }

    /// The next batch, or None after the job's last one. Blocks with the GIL
    /// released; raises KeyboardInterrupt (or whatever a signal handler
    /// raises) within [`SIGNAL_CHECK`] of the signal, and `LoaderError`
    /// when `timeout` seconds pass without a batch (DataLoader's
    /// `timeout`). An interrupted or timed-out wait loses nothing: the next
    /// call yields the batch it was waiting for.
    #[pyo3(signature = (timeout=None))]
    fn next(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Batch>> {
        let closing = &self.closing;
        let limit = timeout
            .filter(|t| *t > 0.0)
            .map(|t| Duration::try_from_secs_f64(t).map_err(|_| PyValueError::new_err("timeout must be a number of seconds")))
            .transpose()?;
        let item = py.detach(|| {
            let started = std::time::Instant::now();
            let mut guard = self.lock();
            let Some(loader) = guard.as_mut() else {
                return Err(Stop::Closed);
            };
            loader.next_interruptible(SIGNAL_CHECK, || {
                if closing.load(Ordering::Acquire) {
                    return Err(Stop::Closed);
                }
                if let Some(limit) = limit
                    && started.elapsed() >= limit
                {
                    return Err(Stop::TimedOut(limit));
                }
                Python::attach(|py| py.check_signals()).map_err(Stop::Signal)
            })
        });
        match item {
            Ok(None) => Ok(None),
            Ok(Some(Ok(batch))) => Ok(Some(Batch::new(batch))),
            Ok(Some(Err(e))) => Err(to_py(e)),
            Err(Stop::Signal(e)) => Err(e),
            Err(Stop::Closed) => Err(closed()),
            Err(Stop::TimedOut(limit)) => Err(LoaderError::new_err(format!(
                "no batch came within timeout={} s; the wait can be retried (nothing was lost), or raise the timeout",
                limit.as_secs_f64()
            ))),
        }
    }

    /// The loader's state as JSON (`LoaderState`), for `state_dict()`.
    fn state(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |l| l.state().to_json())
    }

    /// Batches yielded so far, counting those of the loaders it resumed.
    fn yielded(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, Loader::yielded)
    }

    /// Where batches land: "cpu", "cuda:N" or "host"; for `device="auto"`
    /// the device it resolved to.
    fn device(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |l| l.device().to_string())
    }

    /// Why `device="auto"` stayed on the host, or None.
    fn device_fallback(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.with(py, |l| l.device_fallback().map(str::to_owned))
    }

    /// Batches per epoch for this rank, as the coordinator planned the job.
    fn batches_per_epoch(&self) -> u64 {
        self.batches_per_epoch
    }

    /// Batches over all epochs for this rank.
    fn total_batches(&self) -> u64 {
        self.total_batches
    }

    /// Slots of the shared-memory ring by state `(free, granted, held)`, or
    /// None without a ring. Waits for a `next` running in another thread.
    fn ring_slots(&self, py: Python<'_>) -> PyResult<Option<(usize, usize, usize)>> {
        self.with(py, |l| l.ring_slots().map(|s| (s.free, s.granted, s.held)))
    }

    /// The Unix socket co-located workers attach to the ring through (a
    /// path under `ring_dir`, or an abstract name starting with NUL), or
    /// None without a ring. Waits for a `next` running in another thread.
    fn ring_socket(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.with(py, |l| {
            l.ring_socket()
                .map(|p| p.to_string_lossy().into_owned())
        })
    }

    /// Process ids of embedded mode's workers (empty for a deployment's).
    fn worker_pids(&self) -> Vec<u32> {
        self.worker_pids.clone()
    }

    /// Embedded mode's coordinator URL (None for a deployment's).
    fn coordinator_address(&self) -> Option<String> {
        self.coordinator_address.clone()
    }

    /// True once closed.
    #[getter]
    fn closed(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Stops the loader: its session, and in embedded mode its workers
    /// (SIGTERM, then SIGKILL after a grace period) and coordinator.
    /// Idempotent, callable from any thread; a `next` blocked in another
    /// thread raises `LoaderError("the loader is closed")`. Batches already
    /// yielded stay readable.
    fn close(&self, py: Python<'_>) {
        self.closing.store(true, Ordering::Release);
        py.detach(|| {
            let loader = self.lock().take();
            drop(loader);
        });
    }
}
