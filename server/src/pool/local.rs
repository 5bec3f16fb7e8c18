//! The `local` backend (`loader-server --worker-pool local`): the
//! coordinator starts and stops `loader-worker` processes on its own host.
//!
//! Growing starts processes pointed at this coordinator. Shrinking drains
//! the pool's workers with the least outstanding work, through the same
//! drain as `loaderctl drain`: they take no new task, finish and deliver
//! what they hold, and exit, so no batch is lost or delivered twice, and a
//! trainer waits at most for the batch in progress. A worker the pool
//! started that has not registered yet holds nothing and is simply stopped.
//! Exited processes are reaped every half second; stopping the coordinator
//! stops every worker it started (SIGTERM, then SIGKILL after a grace
//! period), so none is left behind.

use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use loader_proto::pb;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::config::LocalPoolConfig;
use crate::coordinator::Coordinator;
use crate::error::CoordinatorError;

/// How long stopped workers get to exit before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often the pool reaps its exited processes: an exited worker's lease
/// tells the coordinator it is gone; this only collects the zombie and
/// counts it out of `running`, which the next scaling decision (at most once
/// a second) reads.
const REAP_EVERY: Duration = Duration::from_millis(500);

/// One process of the pool.
#[derive(Debug)]
struct Member {
    child: Child,
    /// Told to drain (or to stop): no longer counted.
    leaving: bool,
}

/// Worker processes this coordinator started.
#[derive(Debug)]
pub(crate) struct Processes {
    config: LocalPoolConfig,
    /// The coordinator's URL, for the workers' `--coordinator`.
    url: String,
    members: Mutex<Vec<Member>>,
}

impl Processes {
    /// A pool of no process yet; its workers will register at `url`.
    pub(crate) fn new(config: LocalPoolConfig, url: String) -> Self {
        Self { config, url, members: Mutex::new(Vec::new()) }
    }

    /// Workers to start with the coordinator.
    pub(crate) fn initial(&self) -> u32 {
        self.config.initial
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Member>> {
        self.members.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `workers` workers: starts the missing ones, or drains the
    /// surplus (see the module docs).
    pub(crate) fn scale(&self, coordinator: &Coordinator, workers: u32) -> Result<pb::ScaleWorkersResponse, CoordinatorError> {
        let mut members = self.lock();
        reap_exited(&mut members);
        let live = members.iter().filter(|m| !m.leaving).count() as u32;
        let mut response = pb::ScaleWorkersResponse { previous: live, workers, ..Default::default() };
        for _ in live..workers {
            members.push(Member { child: self.spawn()?, leaving: false });
            response.started += 1;
        }
        if workers < live {
            let registered = coordinator.list_workers();
            // Least outstanding work first; processes not registered yet
            // (nothing outstanding, nothing to drain) before any.
            let mut candidates: Vec<(u64, Option<u64>, usize)> = members
                .iter()
                .enumerate()
                .filter(|(_, m)| !m.leaving)
                .map(|(i, m)| {
                    let pid = m.child.id().unwrap_or(0);
                    let found = registered.iter().find(|w| pid != 0 && w.pid == pid && !w.draining);
                    (found.map_or(0, |w| w.outstanding), found.map(|w| w.worker_id), i)
                })
                .collect();
            candidates.sort_by_key(|&(outstanding, id, _)| (id.is_some(), outstanding));
            for &(_, id, i) in candidates.iter().take((live - workers) as usize) {
                let member = &mut members[i];
                member.leaving = true;
                match id {
                    Some(id) => {
                        coordinator.drain_worker(id)?;
                        response.draining.push(id);
                    }
                    None => terminate(&member.child),
                }
            }
        }
        tracing::info!(
            previous = response.previous,
            workers,
            started = response.started,
            draining = ?response.draining,
            "worker pool scaled"
        );
        Ok(response)
    }

    fn spawn(&self) -> Result<Child, CoordinatorError> {
        let mut command = Command::new(&self.config.command);
        command
            .args(["--coordinator", &self.url, "--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            // It announces its address there; the coordinator's own stdout
            // is for the coordinator's announcements.
            .stdout(Stdio::null())
            .kill_on_drop(true);
        command
            .spawn()
            .map_err(|e| CoordinatorError::WorkerStart(format!("{}: {e}", self.config.command.display())))
    }

    /// Workers running (not leaving), after reaping those that exited.
    pub(crate) fn running(&self) -> u32 {
        let mut members = self.lock();
        reap_exited(&mut members);
        members.iter().filter(|m| !m.leaving).count() as u32
    }

    /// Reaps the pool's exited processes every [`REAP_EVERY`] until `stop`.
    pub(crate) async fn reap(&self, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(REAP_EVERY);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {
                    reap_exited(&mut self.lock());
                }
            }
        }
    }

    /// Stops every worker of the pool: SIGTERM (a worker drains what it
    /// holds and exits), SIGKILL for those still running after a grace.
    pub(crate) async fn stop(&self) {
        let mut members = std::mem::take(&mut *self.lock());
        for m in &members {
            terminate(&m.child);
        }
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        for m in &mut members {
            if tokio::time::timeout_at(deadline, m.child.wait()).await.is_err() {
                let _ = m.child.start_kill();
                let _ = m.child.wait().await;
            }
        }
    }
}

/// Drops (and so reaps) the members whose process has exited.
fn reap_exited(members: &mut Vec<Member>) {
    members.retain_mut(|m| !matches!(m.child.try_wait(), Ok(Some(_))));
}

/// Asks a worker process to stop (SIGTERM: it hands back what it holds).
fn terminate(child: &Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
}
