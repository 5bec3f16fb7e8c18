//! Embedded mode: [`Loader::local`](crate::Loader::local) starts a
//! coordinator in-process and N local worker processes, then opens the
//! loader against them — one machine, no deployment, the same protocol and
//! code paths as a real deployment. This module starts and supervises the
//! cluster (`LocalCluster`); the builder opens the loader on its address and
//! hands the cluster to the loader, which drops it last.
//!
//! - `coordinator`: `loader_server::serve` on a background thread.
//! - `launch`: how a worker process is started ([`WorkerLauncher`]: a
//!   command by default; the Python SDK forks workers from a template).
//! - `workers`: finding the worker command, starting, watching and stopping
//!   worker processes.

mod coordinator;
mod launch;
mod workers;

use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use loader_proto::pb::ListWorkersRequest;
use loader_proto::pb::admin_service_client::AdminServiceClient;
use loader_server::ServerConfig;

use crate::connect;
use crate::error::LoaderError;
use crate::event::{Event, EventTx};

pub use self::coordinator::THREAD_NAME as COORDINATOR_THREAD;
use self::coordinator::InProcessCoordinator;
pub use self::launch::{CommandLauncher, WORKER_ID_VARIABLE, WorkerLauncher, WorkerProcess, worker_defaults, worker_index};
pub use self::workers::WORKER_BIN_ENV;
use self::workers::{CommandSources, WorkerProcesses};

/// How long workers get to register unless told otherwise.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// What embedded mode starts, as set by the embedded-only setters of
/// [`LoaderBuilder`](crate::LoaderBuilder).
#[derive(Debug, Clone)]
pub(crate) struct ClusterConfig {
    /// Worker processes to start.
    pub(crate) workers: usize,
    /// Program and leading arguments that start a worker; see
    /// [`LoaderBuilder::worker_command`](crate::LoaderBuilder::worker_command).
    pub(crate) worker_command: Option<Vec<OsString>>,
    /// Starts the workers instead of `worker_command`; see
    /// [`LoaderBuilder::worker_launcher`](crate::LoaderBuilder::worker_launcher).
    pub(crate) launcher: Option<Arc<dyn WorkerLauncher>>,
    /// The embedded coordinator's settings.
    pub(crate) server: ServerConfig,
    /// How long workers get to register.
    pub(crate) ready_timeout: Duration,
}

impl ClusterConfig {
    /// `workers` worker processes found the default way, a coordinator with
    /// default settings.
    pub(crate) fn new(workers: usize) -> Self {
        Self {
            workers,
            worker_command: None,
            launcher: None,
            server: ServerConfig::default(),
            ready_timeout: DEFAULT_READY_TIMEOUT,
        }
    }
}

/// The coordinator and workers behind an embedded loader. Dropping it
/// stops the workers first (they are clients of the coordinator), then the
/// coordinator.
#[derive(Debug)]
pub(crate) struct LocalCluster {
    /// Restarts workers that exit; declared first: stopped before the
    /// workers are.
    supervisor: Option<Supervisor>,
    /// Dropped (terminated and reaped) once the supervisor is stopped.
    workers: Arc<Mutex<WorkerProcesses>>,
    /// Stopped once the workers are gone.
    coordinator: InProcessCoordinator,
}

/// How often the supervisor looks at the workers.
const SUPERVISE_EVERY: Duration = Duration::from_millis(100);

fn lock(workers: &Mutex<WorkerProcesses>) -> MutexGuard<'_, WorkerProcesses> {
    workers.lock().unwrap_or_else(|p| p.into_inner())
}

/// The thread that supervises the workers for as long as the loader lives
/// (see [`WorkerProcesses::supervise`]); when they keep dying it ends the
/// iteration with the error, so a run fails in one line instead of hanging.
#[derive(Debug)]
struct Supervisor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Supervisor {
    fn start(workers: Arc<Mutex<WorkerProcesses>>, events: EventTx) -> Result<Self, LoaderError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("loader-supervisor".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    if let Err(e) = lock(&workers).supervise(Instant::now()) {
                        tracing::error!("{e}");
                        let _gone = events.send(Event::Fatal(e));
                        return;
                    }
                    std::thread::sleep(SUPERVISE_EVERY);
                }
            })
            .map_err(|e| LoaderError::Embedded(format!("cannot start the worker supervisor: {e}")))?;
        Ok(Self { stop, thread: Some(thread) })
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl LocalCluster {
    /// Starts the coordinator and the workers, and waits until every worker
    /// has registered. Blocking.
    pub(crate) fn start(config: ClusterConfig) -> Result<Self, LoaderError> {
        if config.workers == 0 {
            return Err(LoaderError::InvalidArgument(
                "embedded mode needs at least one worker".into(),
            ));
        }
        let launcher = match config.launcher {
            Some(launcher) => launcher,
            None => {
                let command = CommandSources::from_process(config.worker_command).resolve()?;
                Arc::new(CommandLauncher::new(command)?) as Arc<dyn WorkerLauncher>
            }
        };
        let coordinator = InProcessCoordinator::start(config.server)?;
        let workers = WorkerProcesses::spawn(launcher, coordinator.address(), config.workers)?;
        let mut cluster = LocalCluster {
            supervisor: None,
            workers: Arc::new(Mutex::new(workers)),
            coordinator,
        };
        cluster.wait_ready(config.workers, config.ready_timeout)?;
        Ok(cluster)
    }

    /// The coordinator's URL.
    pub(crate) fn address(&self) -> &str {
        self.coordinator.address()
    }

    /// Restarts workers that exit for as long as the cluster lives; when
    /// they keep dying, ends the loader's iteration through `events`.
    pub(crate) fn supervise(&mut self, events: EventTx) -> Result<(), LoaderError> {
        self.supervisor = Some(Supervisor::start(Arc::clone(&self.workers), events)?);
        Ok(())
    }

    /// Process ids of the workers, restarted ones included.
    pub(crate) fn pids(&self) -> Vec<u32> {
        lock(&self.workers).pids()
    }

    /// Waits until the coordinator lists `count` workers, failing fast when a
    /// worker process or the coordinator dies.
    fn wait_ready(&mut self, count: usize, timeout: Duration) -> Result<(), LoaderError> {
        let address = self.coordinator.address().to_owned();
        // A lazy channel spawns its connection task on the current runtime.
        let channel = {
            let _runtime = self.coordinator.handle().enter();
            connect::endpoint(&address, loader_process::security::Role::Admin)?.connect_lazy()
        };
        let admin = AdminServiceClient::new(channel);
        let deadline = Instant::now() + timeout;
        let mut listed = 0;
        loop {
            lock(&self.workers).check()?;
            self.coordinator.check()?;
            let mut admin = admin.clone();
            let reply = self.coordinator.handle().block_on(async move {
                tokio::time::timeout(
                    Duration::from_secs(1),
                    admin.list_workers(ListWorkersRequest {}),
                )
                .await
            });
            match reply {
                Ok(Ok(r)) => listed = r.into_inner().workers.len(),
                Ok(Err(s)) => {
                    tracing::debug!(error = %LoaderError::rpc(&address, "ListWorkers", s), "waiting for workers")
                }
                Err(_) => tracing::debug!("ListWorkers timed out"),
            }
            if listed >= count {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(LoaderError::Embedded(format!(
                    "only {listed} of {count} workers registered with the embedded coordinator within {:.1}s",
                    timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
