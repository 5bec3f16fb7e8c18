//! Helpers shared by the integration tests: worker commands, time bounds,
//! an in-process coordinator, and what `/proc` and `/dev/shm` say about the
//! ring.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use loader_server::ServerConfig;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

/// The workspace's `loader-worker`, built next to this test executable:
/// `cargo test --workspace` builds it (alone: `cargo build -p loader-worker`).
/// The SDK does not link the worker crate, so its tests start the real
/// binary, as embedded mode does.
pub fn worker_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/loader-worker
    let path = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target directory")
        .join("loader-worker");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p loader-worker` (`cargo test --workspace` does)",
        path.display()
    );
    path
}

/// The worker command embedded mode runs in these tests.
pub fn worker_command() -> Option<Vec<OsString>> {
    Some(vec![worker_bin().into()])
}

/// Logs of this process (the SDK, the in-process coordinator) in the test's
/// captured output, filtered by `RUST_LOG`, warnings by default.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
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

/// A coordinator on a fixed address that can be killed and started again on
/// the same address (and `state_dir`), like a restarted process.
pub struct RestartableCoordinator {
    /// Where it listens, every time.
    pub addr: SocketAddr,
    /// Its URL.
    pub url: String,
    config: ServerConfig,
    /// The running instance's runtime; None while it is down.
    runtime: Option<Runtime>,
}

impl RestartableCoordinator {
    /// Starts one on a port of its own.
    pub fn start(config: ServerConfig) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut c = Self {
            addr,
            url: format!("http://{addr}"),
            config,
            runtime: None,
        };
        c.serve(Some(listener));
        c
    }

    /// Stops it the hard way: its runtime goes, with every task (the server,
    /// its connections, the lease reaper), so clients see their connections
    /// reset and nothing it held in memory survives; only its journal does.
    pub fn kill(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }

    /// Starts it again on the same address and state directory.
    pub fn restart(&mut self) {
        self.kill();
        self.serve(None);
    }

    fn serve(&mut self, listener: Option<std::net::TcpListener>) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        // While nothing listens, a client reconnecting to the port can briefly
        // hold it itself (a loopback self-connect): try again for a while.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let listener = listener.unwrap_or_else(|| {
            loop {
                match std::net::TcpListener::bind(self.addr) {
                    Ok(l) => break l,
                    Err(e) if std::time::Instant::now() < deadline => {
                        eprintln!("cannot bind {} again yet: {e}", self.addr);
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => panic!("cannot bind {} again: {e}", self.addr),
                }
            }
        });
        listener.set_nonblocking(true).expect("nonblocking");
        let listener = {
            let _rt = runtime.enter();
            tokio::net::TcpListener::from_std(listener).expect("tokio listener")
        };
        runtime.spawn(loader_server::serve(
            listener,
            self.config.clone(),
            std::future::pending(),
        ));
        self.runtime = Some(runtime);
    }
}

impl Drop for RestartableCoordinator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Worker processes (`loader-worker`) against a coordinator, each in a
/// process group of its own, killed when dropped.
pub struct WorkerProcesses(pub Vec<Child>);

impl WorkerProcesses {
    pub fn start(coordinator: &str, count: usize) -> Self {
        Self(
            (0..count)
                .map(|_| {
                    Command::new(worker_bin())
                        .args(["--coordinator", coordinator])
                        .args(["--listen", "127.0.0.1:0"])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .process_group(0)
                        .spawn()
                        .expect("start a worker")
                })
                .collect(),
        )
    }
}

impl Drop for WorkerProcesses {
    fn drop(&mut self) {
        for child in &mut self.0 {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = child.wait();
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
