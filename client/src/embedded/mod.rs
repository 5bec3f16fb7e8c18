//! Embedded mode: [`Loader::local`] starts a coordinator in-process and N
//! local worker processes, then opens the loader against them — one machine,
//! no deployment, the same protocol and code paths as a real deployment.
//!
//! - `coordinator`: `loader_server::serve` on a background thread.
//! - `workers`: finding, starting, watching and stopping worker processes.

mod coordinator;
mod workers;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use loader_proto::pb::JobSpec;
use loader_proto::pb::ListWorkersRequest;
use loader_proto::pb::admin_service_client::AdminServiceClient;
use loader_server::ServerConfig;

use crate::connect;
use crate::error::LoaderError;
use crate::event::{Event, EventTx};
use crate::loader::{Loader, LoaderBuilder};
use crate::state::LoaderState;

pub(crate) use self::coordinator::THREAD_NAME as COORDINATOR_THREAD;
use self::coordinator::InProcessCoordinator;
pub use self::workers::WORKER_BIN_ENV;
use self::workers::{CommandSources, WorkerProcesses};

/// How long workers get to register unless told otherwise.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The coordinator and workers behind an embedded [`Loader`]. Dropping it
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

/// Settings of an embedded loader; start with [`Loader::local_builder`].
#[derive(Debug, Clone)]
pub struct LocalBuilder {
    /// The loader's own settings (prefetch, order, ring, resume, start), as
    /// for a coordinator elsewhere; `build` sets the coordinator and the rank
    /// (0 of 1).
    loader: LoaderBuilder,
    /// The job; its `consumers` is forced to 1 (this process is the only rank).
    spec: JobSpec,
    /// Worker processes to start.
    workers: usize,
    /// Program and leading arguments that start a worker; see
    /// [`LocalBuilder::worker_command`].
    worker_command: Option<Vec<OsString>>,
    /// The embedded coordinator's settings.
    server: ServerConfig,
    /// How long workers get to register.
    ready_timeout: Duration,
}

impl LocalBuilder {
    /// Batches each worker may send ahead of consumption; see
    /// [`LoaderBuilder::prefetch`].
    pub fn prefetch(mut self, prefetch: u32) -> Self {
        self.loader = self.loader.prefetch(prefetch);
        self
    }

    /// Yield strictly in sequence order (default) or as batches arrive.
    pub fn in_order(mut self, in_order: bool) -> Self {
        self.loader = self.loader.in_order(in_order);
        self
    }

    /// Whether the workers deliver through a shared-memory ring (default
    /// true: they run on this machine) or stream over gRPC (false).
    pub fn shared_memory(mut self, enabled: bool) -> Self {
        self.loader = self.loader.shared_memory(enabled);
        self
    }

    /// Geometry of the shared-memory ring; see [`LoaderBuilder::ring`].
    pub fn ring(mut self, slot_count: u32, slot_size: u64) -> Self {
        self.loader = self.loader.ring(slot_count, slot_size);
        self
    }

    /// Where the ring's socket directory goes; see [`LoaderBuilder::ring_dir`].
    pub fn ring_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.loader = self.loader.ring_dir(dir);
        self
    }

    /// The command that starts a worker (program, then leading arguments;
    /// `--coordinator URL --listen 127.0.0.1:0` are appended). Without it:
    /// `$LOADER_WORKER_BIN`, else `loader-worker` next to the current
    /// executable or in its parent directory, else `loader-worker` on `PATH`.
    pub fn worker_command(mut self, command: Option<Vec<OsString>>) -> Self {
        self.worker_command = command;
        self
    }

    /// Settings of the embedded coordinator (lease TTL, range length...).
    pub fn server_config(mut self, config: ServerConfig) -> Self {
        self.server = config;
        self
    }

    /// Continues where the loader that produced `state` left off; see
    /// [`LoaderBuilder::resume`]. The state's job replaces the one given to
    /// [`Loader::local_builder`]; it must be a single-rank state.
    pub fn resume(mut self, state: LoaderState) -> Self {
        self.loader = self.loader.resume(state);
        self
    }

    /// Starts at batch `seq` instead of 0; see [`LoaderBuilder::start_at`].
    pub fn start_at(mut self, seq: u64) -> Self {
        self.loader = self.loader.start_at(seq);
        self
    }

    /// How long the workers get to register (default 10 s).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Starts the coordinator and the workers, waits until every worker has
    /// registered, and opens the loader as consumer 0 of 1. Blocking; from
    /// async code, call it inside `spawn_blocking`.
    pub fn build(self) -> Result<Loader, LoaderError> {
        let resume = self.loader.resume_state();
        let mut spec = match resume {
            Some(state) if state.world_size() != 1 => {
                return Err(LoaderError::InvalidArgument(format!(
                    "embedded mode runs one rank, but the loader state is rank {} of {}; resume it against a coordinator",
                    state.rank(),
                    state.world_size()
                )));
            }
            Some(state) => state.spec()?,
            None => self.spec,
        };
        spec.consumers = 1;
        // Fail on a bad spec, start or ring before starting any process.
        let plan = crate::spec::validate(&spec)?;
        if let (None, Some(seq)) = (resume, self.loader.start_seq())
            && seq > plan.total_batches()
        {
            return Err(LoaderError::InvalidArgument(format!(
                "cannot start at batch {seq}: this job has only {} batches",
                plan.total_batches()
            )));
        }
        let loader = self.loader.job(spec).rank(0).world_size(1);
        loader.check_ring()?;
        if self.workers == 0 {
            return Err(LoaderError::InvalidArgument(
                "embedded mode needs at least one worker".into(),
            ));
        }
        let command = CommandSources::from_process(self.worker_command).resolve()?;
        let coordinator = InProcessCoordinator::start(self.server)?;
        let workers = WorkerProcesses::spawn(command, coordinator.address(), self.workers)?;
        let mut cluster = LocalCluster {
            supervisor: None,
            workers: Arc::new(Mutex::new(workers)),
            coordinator,
        };
        cluster.wait_ready(self.workers, self.ready_timeout)?;
        let mut loader = loader.coordinator(cluster.coordinator.address()).build()?;
        cluster.supervisor = Some(Supervisor::start(Arc::clone(&cluster.workers), loader.events.clone())?);
        loader.cluster = Some(cluster);
        Ok(loader)
    }
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
    /// Waits until the coordinator lists `count` workers, failing fast when a
    /// worker process or the coordinator dies.
    fn wait_ready(&mut self, count: usize, timeout: Duration) -> Result<(), LoaderError> {
        let address = self.coordinator.address().to_owned();
        // A lazy channel spawns its connection task on the current runtime.
        let channel = {
            let _runtime = self.coordinator.handle().enter();
            connect::endpoint(&address)?.connect_lazy()
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

impl Loader {
    /// Process ids of the workers embedded mode started (empty for a loader
    /// fed by a coordinator elsewhere): for diagnostics and for tests that
    /// check no worker outlives its loader.
    pub fn worker_pids(&self) -> Vec<u32> {
        self.cluster
            .as_ref()
            .map(|c| lock(&c.workers).pids())
            .unwrap_or_default()
    }

    /// A loader over a coordinator started in-process and `workers` local
    /// worker processes: the drop-in for `DataLoader(num_workers=N)`.
    pub fn local(spec: JobSpec, workers: usize) -> Result<Loader, LoaderError> {
        Self::local_builder(spec, workers).build()
    }

    /// Like [`Loader::local`], with settings.
    pub fn local_builder(spec: JobSpec, workers: usize) -> LocalBuilder {
        LocalBuilder {
            loader: LoaderBuilder::new(String::new()),
            spec,
            workers,
            worker_command: None,
            server: ServerConfig::default(),
            ready_timeout: DEFAULT_READY_TIMEOUT,
        }
    }
}

#[cfg(test)]
mod tests {
    use loader_proto::pb::Dtype;

    use super::*;

    #[test]
    fn a_start_past_the_job_is_one_line_before_any_process_starts() {
        // 64 samples in batches of 16: 4 batches. A worker command that
        // cannot run shows that nothing was started before the check.
        let spec = crate::spec::synthetic(64, &[4], Dtype::U8)
            .batch_size(16)
            .build()
            .expect("spec");
        let e = Loader::local_builder(spec, 1)
            .worker_command(Some(vec![OsString::from("/nonexistent/loader-worker")]))
            .start_at(5)
            .build()
            .expect_err("past the end");
        assert_eq!(
            e.to_string(),
            "cannot start at batch 5: this job has only 4 batches"
        );
    }
}
