//! The runtime policy every Loader process follows, in one place.
//!
//! - **The data path** runs on the runtime its owner sizes for it: a
//!   worker's production and serving (`loader-worker`), a coordinator's
//!   calls (`loader-server`, or the embedded coordinator of a trainer), a
//!   trainer's receiving (the SDK picks one thread or two by batch size).
//!   Their sizes are decisions about batches, made where batches are known.
//! - **Everything beside it** (the `/metrics` endpoint, OTLP trace export,
//!   `loaderctl`'s signal watch) shares one small [`background`] runtime:
//!   one thread, started on first use, kept for the process's life. Before,
//!   each of those built a runtime of its own, and `loaderctl run` with
//!   metrics and tracing on ran five.
//!
//! A process forked from one that had started the background runtime (the
//! Python SDK's worker template forks workers) inherits the runtime's state
//! but none of its threads: [`background`] notices the new process id and
//! starts a runtime of its own there, leaving the inherited one untouched.

use std::sync::Mutex;

use tokio::runtime::{Builder, Handle, Runtime};

/// The background runtime, with the process id that started it.
static BACKGROUND: Mutex<Option<(u32, Runtime)>> = Mutex::new(None);

/// The process's background runtime (see the module docs), started on
/// first use. Err only when the runtime cannot start (no threads left).
pub fn background() -> std::io::Result<Handle> {
    let mut slot = BACKGROUND.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if let Some((owner, runtime)) = slot.as_ref()
        && *owner == pid
    {
        return Ok(runtime.handle().clone());
    }
    let runtime = Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("loader-background")
        .enable_all()
        .build()?;
    let handle = runtime.handle().clone();
    // An inherited runtime has no threads in this process: dropping it
    // would wait on them, so it is left as it is.
    if let Some(inherited) = slot.replace((pid, runtime)) {
        std::mem::forget(inherited);
    }
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_background_runtime_serves_every_caller() {
        let a = background().expect("starts");
        let b = background().expect("again");
        assert_eq!(a.id(), b.id());
        let (tx, rx) = std::sync::mpsc::channel();
        a.spawn(async move { tx.send(std::thread::current().name().map(str::to_owned)).expect("send") });
        let name = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the task ran");
        assert_eq!(name.as_deref(), Some("loader-background"));
    }
}
