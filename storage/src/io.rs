//! The runtime every object request runs on, and waiting for one from a
//! worker's (synchronous) dataset code.
//!
//! Datasets are read on the workers' producer threads, outside any async
//! context; the requests themselves are async (the store's HTTP client),
//! so they run on a small runtime of their own, started on first use. A
//! caller waits on a channel, never by entering the runtime, so waiting
//! works from any thread, async or not.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Builder, Runtime};

/// Threads of the storage runtime: requests are I/O-bound, and one thread
/// keeps hundreds in flight. A worker's producer makes its batches on one
/// thread; a second thread here only handed the same responses back and
/// forth between threads: one worker core reading 12,800 images from a
/// store used 5% less CPU with one (9.1-9.4 s against 9.7-9.9 s).
const THREADS: usize = 1;

fn runtime() -> Result<&'static Runtime, Stopped> {
    static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            Builder::new_multi_thread()
                .worker_threads(THREADS)
                .thread_name("loader-storage")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Stopped(format!("cannot start the storage runtime: {e}")))
}

/// The storage runtime could not run a request.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Stopped(String);

/// Starts `future` on the storage runtime; it runs whether or not anyone
/// waits for it.
pub fn spawn<F>(future: F) -> Result<(), Stopped>
where
    F: Future<Output = ()> + Send + 'static,
{
    runtime()?.spawn(future);
    Ok(())
}

/// Runs `future` on the storage runtime and waits for its output.
pub fn wait<F, T>(future: F) -> Result<T, Stopped>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime()?.spawn(async move {
        let _ = tx.send(future.await);
    });
    // The sender goes only if the request panicked or the runtime shut down.
    rx.recv().map_err(|_| Stopped("a storage request stopped before it answered".into()))
}
