//! The embedded coordinator: `loader_server::serve` on `127.0.0.1:0`, on a
//! thread and runtime of its own so it outlives no one and serves whatever
//! runtime the trainer uses.

use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use loader_server::ServerConfig;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::error::LoaderError;

/// Name of the coordinator's threads (its runtime's and the one that runs
/// it), by which `loaderctl run` tells their CPU time from the trainer's.
pub const THREAD_NAME: &str = "loader-coordinator";

/// How long stopping the coordinator may take before its thread is left to
/// finish on its own.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// A coordinator serving on a background thread until dropped.
#[derive(Debug)]
pub(crate) struct InProcessCoordinator {
    /// `http://127.0.0.1:<port>`.
    address: String,
    /// The coordinator's runtime, for embedded mode's own admin calls.
    handle: Handle,
    /// Resolves `serve`'s shutdown future.
    stop: Option<oneshot::Sender<()>>,
    /// Why `serve` returned early, if it did.
    failure: Arc<Mutex<Option<String>>>,
    /// Signalled when the thread is about to end.
    finished: std::sync::mpsc::Receiver<()>,
    /// Joined on drop when it finished in time.
    thread: Option<JoinHandle<()>>,
}

impl InProcessCoordinator {
    /// Binds `127.0.0.1:0` and starts serving.
    pub(crate) fn start(config: ServerConfig) -> Result<Self, LoaderError> {
        let fail = |what: &str, e: std::io::Error| {
            LoaderError::Embedded(format!(
                "cannot start the embedded coordinator: {what}: {e}"
            ))
        };
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| fail("bind 127.0.0.1:0", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| fail("set_nonblocking", e))?;
        let local = listener.local_addr().map_err(|e| fail("local_addr", e))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(THREAD_NAME)
            .enable_all()
            .build()
            .map_err(|e| fail("runtime", e))?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let (finished_tx, finished) = std::sync::mpsc::channel();
        let failure = Arc::new(Mutex::new(None));
        let failure_slot = failure.clone();
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                let served = runtime.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
                    let shutdown = async move {
                        let _ = stopped.await;
                    };
                    loader_server::serve(listener, config, shutdown)
                        .await
                        .map_err(|e| e.to_string())
                });
                if let Err(e) = served {
                    tracing::error!(error = %e, "embedded coordinator failed");
                    if let Ok(mut slot) = failure_slot.lock() {
                        *slot = Some(e);
                    }
                }
                runtime.shutdown_timeout(Duration::from_secs(1));
                let _ = finished_tx.send(());
            })
            .map_err(|e| fail("thread", e))?;
        Ok(Self {
            address: format!("http://{local}"),
            handle,
            stop: Some(stop),
            failure,
            finished,
            thread: Some(thread),
        })
    }

    /// The coordinator's URL.
    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    /// The coordinator's runtime.
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// An error when the coordinator stopped serving on its own.
    pub(crate) fn check(&self) -> Result<(), LoaderError> {
        let failed = self.failure.lock().ok().and_then(|f| f.clone());
        match failed {
            Some(e) => Err(LoaderError::Embedded(format!(
                "the embedded coordinator stopped: {e}"
            ))),
            None => Ok(()),
        }
    }
}

impl Drop for InProcessCoordinator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Bounded: a stuck shutdown must not hang the trainer's exit.
        match self.finished.recv_timeout(STOP_GRACE) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                if let Some(thread) = self.thread.take() {
                    let _ = thread.join();
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                tracing::warn!(
                    "embedded coordinator did not stop within {STOP_GRACE:?}; leaving it behind"
                );
            }
        }
    }
}
