//! Embedded mode's worker processes: finding the executable, starting N of
//! them against the embedded coordinator (through a `launch::WorkerLauncher`),
//! noticing an early exit, supervising them (a worker that exits is started
//! again, one that keeps exiting fails the run), and stopping them (SIGTERM,
//! then SIGKILL) when dropped.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use loader_process::retry::{Backoff, Pauses};
use nix::sys::signal::Signal;

use super::launch::{WorkerLauncher, WorkerProcess};
use crate::error::LoaderError;

/// Environment variable naming the worker executable.
pub const WORKER_BIN_ENV: &str = "LOADER_WORKER_BIN";
/// File name of the worker executable.
const WORKER_BIN: &str = "loader-worker";
/// Time between SIGTERM and SIGKILL: workers stop in well under it (their
/// trainer's connections are closed first), and a stopped `loaderctl run`
/// must leave no worker behind within 2 s.
const TERM_GRACE: Duration = Duration::from_secs(1);

/// Where the worker command may come from, gathered by the caller so the
/// resolution itself reads no process state (and tests set none).
#[derive(Debug, Default, Clone)]
pub(crate) struct CommandSources {
    /// An explicit command (program and leading arguments).
    pub(crate) explicit: Option<Vec<OsString>>,
    /// The value of `LOADER_WORKER_BIN`.
    pub(crate) env: Option<OsString>,
    /// `std::env::current_exe()`.
    pub(crate) current_exe: Option<PathBuf>,
    /// The value of `PATH`.
    pub(crate) path: Option<OsString>,
}

impl CommandSources {
    /// The sources of this process.
    pub(crate) fn from_process(explicit: Option<Vec<OsString>>) -> Self {
        Self {
            explicit,
            env: std::env::var_os(WORKER_BIN_ENV).filter(|v| !v.is_empty()),
            current_exe: std::env::current_exe().ok(),
            path: std::env::var_os("PATH"),
        }
    }

    /// The worker command: the explicit one; else `LOADER_WORKER_BIN`; else
    /// `loader-worker` next to the current executable or in its parent
    /// directory (test binaries live in `target/<profile>/deps`); else
    /// `loader-worker` on `PATH`.
    pub(crate) fn resolve(self) -> Result<Vec<OsString>, LoaderError> {
        if let Some(cmd) = self.explicit.filter(|c| !c.is_empty()) {
            return Ok(cmd);
        }
        if let Some(bin) = self.env {
            return Ok(vec![bin]);
        }
        let beside_exe = self
            .current_exe
            .as_deref()
            .and_then(Path::parent)
            .into_iter()
            .flat_map(|dir| {
                let parent = dir.parent().map(Path::to_path_buf);
                std::iter::once(dir.to_path_buf()).chain(parent)
            });
        let on_path = self
            .path
            .iter()
            .flat_map(std::env::split_paths)
            .collect::<Vec<_>>();
        beside_exe
            .chain(on_path)
            .map(|dir| dir.join(WORKER_BIN))
            .find(|p| is_executable(p))
            .map(|p| vec![p.into_os_string()])
            .ok_or_else(|| {
                LoaderError::Embedded(format!(
                    "cannot find the {WORKER_BIN} executable for embedded mode: build it \
                     (`cargo build -p loader-worker`), set {WORKER_BIN_ENV}=/path/to/{WORKER_BIN}, \
                     put it on PATH, or pass a worker command"
                ))
            })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Exits a worker slot may have within `RESTART_WINDOW` before the run
/// fails instead of restarting it again.
const MAX_RESTARTS: usize = 5;
/// How far back exits count towards `MAX_RESTARTS`.
const RESTART_WINDOW: Duration = Duration::from_secs(60);
/// Pauses before the restarts of a slot: 100 ms, doubling up to 2 s.
const RESTART_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));

/// The worker processes of an embedded cluster, supervised as a Deployment
/// would be: a worker that exits is started again (after a backoff that
/// doubles), and one that keeps exiting fails the run with a line naming
/// it. Its batches meanwhile go to the others, or to the replacement, when
/// its lease expires (the coordinator requeues them).
#[derive(Debug)]
pub(crate) struct WorkerProcesses {
    /// Starts every worker, replacements included.
    launcher: Arc<dyn WorkerLauncher>,
    /// The embedded coordinator's URL, for replacements.
    coordinator: String,
    /// One slot per worker the user asked for.
    slots: Vec<Slot>,
}

/// One worker of the cluster and its restarts.
#[derive(Debug)]
struct Slot {
    /// The running process; None between an exit and its restart.
    child: Option<Box<dyn WorkerProcess>>,
    /// When it exited lately, within `RESTART_WINDOW`.
    exits: VecDeque<Instant>,
    /// When to start it again, after an exit.
    restart_at: Option<Instant>,
    /// The pauses before this slot's next restarts.
    pauses: Pauses,
}

impl WorkerProcesses {
    /// Starts `count` workers with `launcher` against `coordinator`.
    pub(crate) fn spawn(launcher: Arc<dyn WorkerLauncher>, coordinator: &str, count: usize) -> Result<Self, LoaderError> {
        let mut procs = WorkerProcesses {
            launcher,
            coordinator: coordinator.to_owned(),
            slots: Vec::with_capacity(count),
        };
        for i in 0..count {
            let child = procs.start(i)?;
            procs.slots.push(Slot {
                child: Some(child),
                exits: VecDeque::new(),
                restart_at: None,
                pauses: RESTART_BACKOFF.pauses(),
            });
        }
        Ok(procs)
    }

    /// Starts the worker of slot `i`.
    fn start(&self, i: usize) -> Result<Box<dyn WorkerProcess>, LoaderError> {
        let args = ["--coordinator", &self.coordinator, "--listen", "127.0.0.1:0"].map(str::to_owned);
        // The embedded cluster is plaintext and token-less on loopback: the
        // trainer's own TLS and token settings are not the workers'.
        self.launcher.launch(i + 1, &args, &loader_process::security::config::VARIABLES)
    }

    /// Process ids of the running workers.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.slots.iter().filter_map(|s| s.child.as_ref()).map(|c| c.id()).collect()
    }

    /// Fails if a worker has exited: while the cluster starts, an exit is a
    /// broken worker command, not something to restart.
    pub(crate) fn check(&mut self) -> Result<(), LoaderError> {
        let count = self.slots.len();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let Some(child) = &mut slot.child
                && let Some(status) = child.try_wait()
            {
                return Err(LoaderError::Embedded(format!(
                    "worker {} of {count} ({}) exited early with {status}",
                    i + 1,
                    self.launcher.describe()
                )));
            }
        }
        Ok(())
    }

    /// One round of supervision at `now`: notes workers that exited, starts
    /// again those whose backoff is over, and fails when one exited
    /// `MAX_RESTARTS` times within `RESTART_WINDOW`.
    pub(crate) fn supervise(&mut self, now: Instant) -> Result<(), LoaderError> {
        let count = self.slots.len();
        for i in 0..count {
            let slot = &mut self.slots[i];
            if let Some(child) = &mut slot.child
                && let Some(status) = child.try_wait()
            {
                slot.child = None;
                slot.exits.push_back(now);
                while slot.exits.front().is_some_and(|&t| now.duration_since(t) > RESTART_WINDOW) {
                    slot.exits.pop_front();
                }
                if slot.exits.len() >= MAX_RESTARTS {
                    return Err(LoaderError::Embedded(format!(
                        "worker {} of {count} ({}) keeps dying: it exited {} times within {}s, last with {status}",
                        i + 1,
                        self.launcher.describe(),
                        slot.exits.len(),
                        RESTART_WINDOW.as_secs()
                    )));
                }
                let pause = slot.pauses.next().unwrap_or(RESTART_BACKOFF.max);
                tracing::warn!(worker = i + 1, %status, "embedded worker exited; starting another in {pause:?}");
                slot.restart_at = Some(now + pause);
            }
            let slot = &self.slots[i];
            if slot.child.is_none() && slot.restart_at.is_some_and(|t| t <= now) {
                let child = self.start(i)?;
                let slot = &mut self.slots[i];
                slot.child = Some(child);
                slot.restart_at = None;
            }
        }
        Ok(())
    }
}

impl Drop for WorkerProcesses {
    fn drop(&mut self) {
        for child in self.slots.iter_mut().filter_map(|s| s.child.as_mut()) {
            child.signal(Signal::SIGTERM);
        }
        let deadline = Instant::now() + TERM_GRACE;
        for child in self.slots.iter_mut().filter_map(|s| s.child.as_mut()) {
            loop {
                if child.try_wait().is_some() {
                    break;
                }
                if Instant::now() >= deadline {
                    child.kill_and_reap();
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_bin(dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(WORKER_BIN);
        std::fs::write(&p, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    }

    #[test]
    fn resolution_order() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let deps = tmp.path().join("debug/deps");
        std::fs::create_dir_all(&deps).expect("mkdir");
        let bin = fake_bin(&tmp.path().join("debug"));
        let exe = Some(deps.join("some_test-1234"));

        let explicit = CommandSources {
            explicit: Some(vec!["x".into(), "__worker".into()]),
            env: Some("y".into()),
            ..Default::default()
        };
        assert_eq!(
            explicit.resolve().expect("explicit"),
            vec![OsString::from("x"), "__worker".into()]
        );
        let env = CommandSources {
            env: Some("y".into()),
            current_exe: exe.clone(),
            ..Default::default()
        };
        assert_eq!(env.resolve().expect("env"), vec![OsString::from("y")]);
        let parent = CommandSources {
            current_exe: exe,
            ..Default::default()
        };
        assert_eq!(
            parent.resolve().expect("parent dir"),
            vec![bin.into_os_string()]
        );

        let other = tempfile::tempdir().expect("tempdir");
        let on_path = fake_bin(other.path());
        let path = CommandSources {
            current_exe: Some(tmp.path().join("nowhere/exe")),
            path: Some(other.path().as_os_str().to_owned()),
            ..Default::default()
        };
        assert_eq!(
            path.resolve().expect("PATH"),
            vec![on_path.into_os_string()]
        );
    }

    #[test]
    fn missing_worker_says_how_to_fix_it() {
        // Nested two deep, so neither directory searched beside the
        // executable is the shared temporary directory itself.
        let tmp = tempfile::tempdir().expect("tempdir");
        let bin_dir = tmp.path().join("target/debug");
        std::fs::create_dir_all(&bin_dir).expect("mkdir");
        let none = CommandSources {
            current_exe: Some(bin_dir.join("exe")),
            path: Some(bin_dir.as_os_str().to_owned()),
            ..Default::default()
        };
        let e = none.resolve().expect_err("nothing to find").to_string();
        assert!(
            e.contains(WORKER_BIN_ENV) && e.contains("cargo build -p loader-worker"),
            "{e}"
        );
    }

    #[test]
    fn early_exit_is_named() {
        let launcher = Arc::new(super::super::launch::CommandLauncher::new(vec!["false".into()]).expect("command"));
        let mut procs = WorkerProcesses::spawn(launcher, "http://127.0.0.1:1", 1).expect("spawn");
        let started = Instant::now();
        loop {
            match procs.check() {
                Err(e) => {
                    let e = e.to_string();
                    assert!(e.starts_with("worker 1 of 1 (false) exited early"), "{e}");
                    break;
                }
                Ok(()) => {
                    assert!(
                        started.elapsed() < Duration::from_secs(5),
                        "false did not exit"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
}
