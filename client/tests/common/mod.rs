//! Helpers shared by the integration tests: worker commands, time bounds,
//! an in-process coordinator, and what `/proc` and `/dev/shm` say about the
//! ring.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::ops::Range;
use std::sync::mpsc;
use std::time::Duration;

use loader_server::ServerConfig;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

/// This package's `loaderctl`, as a worker.
pub fn worker_command() -> Option<Vec<OsString>> {
    Some(vec![
        env!("CARGO_BIN_EXE_loaderctl").into(),
        "__worker".into(),
    ])
}

/// Runs `f` on a thread and fails the test if it takes longer than `limit`.
pub fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|e| panic!("test did not finish within {limit:?}: {e}"))
}

/// A coordinator served in this process on `127.0.0.1:0`; stopped on drop.
pub struct Coordinator {
    /// Its URL.
    pub url: String,
    _stop: oneshot::Sender<()>,
    /// Dropped last: ends the server's tasks.
    _runtime: Runtime,
}

impl Coordinator {
    pub fn start(config: ServerConfig) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = oneshot::channel::<()>();
        runtime.spawn(loader_server::serve(listener, config, async move {
            let _ = stopped.await;
        }));
        Self {
            url,
            _stop: stop,
            _runtime: runtime,
        }
    }
}

/// Descriptors of this process that are ring memfds.
pub fn ring_memfds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("/memfd:loader-ring"))
        .count()
}

/// Address ranges where this process maps a ring memfd.
pub fn ring_mappings() -> Vec<Range<usize>> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines()
        .filter(|l| l.contains("/memfd:loader-ring"))
        .filter_map(|l| {
            let (start, end) = l.split_whitespace().next()?.split_once('-')?;
            let start = usize::from_str_radix(start, 16).ok()?;
            let end = usize::from_str_radix(end, 16).ok()?;
            Some(start..end)
        })
        .collect()
}

/// Names in `/dev/shm` (empty when it does not exist).
pub fn dev_shm() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default()
}
