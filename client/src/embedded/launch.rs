//! How embedded mode starts a worker process: [`WorkerLauncher`], with
//! [`CommandLauncher`] (a new process of a worker executable, the default)
//! and, from other crates, launchers of their own: the Python SDK's forks
//! workers from a template process that has already imported the trainer's
//! modules (`python/src/template.rs`), so a worker is running in
//! milliseconds instead of the seconds a fresh interpreter takes to import
//! torch.
//!
//! The supervision around a launched worker (restarts, the message when one
//! keeps dying, SIGTERM then SIGKILL on drop) is `workers`' and the same
//! whichever launcher started the process.

use std::ffi::{OsStr, OsString};
use std::fmt::Debug;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::LoaderError;

/// The environment variable a launched worker finds its index in (0 ..
/// workers - 1, [`worker_index`]): what a Python dataset's
/// `get_worker_info().id` says.
pub const WORKER_ID_VARIABLE: &str = "LOADER_WORKER_ID";

/// The 0-based index of worker number `worker` (1-based, as
/// [`WorkerLauncher::launch`] numbers them).
pub fn worker_index(worker: usize) -> usize {
    worker.saturating_sub(1)
}

/// Starts worker processes for an embedded cluster.
pub trait WorkerLauncher: Send + Sync + Debug {
    /// Starts worker number `worker` (1-based, for messages) with `args`
    /// (`--coordinator URL --listen ADDR`, the worker's command line after
    /// its program), with the variables `env_remove` taken out of its
    /// environment (the trainer's own TLS and token settings are not the
    /// embedded workers').
    fn launch(&self, worker: usize, args: &[String], env_remove: &[&str]) -> Result<Box<dyn WorkerProcess>, LoaderError>;

    /// What starts the workers, for messages (`python -m loader._worker`).
    fn describe(&self) -> String;
}

/// A worker process a [`WorkerLauncher`] started.
pub trait WorkerProcess: Send + Debug {
    /// Its process id.
    fn id(&self) -> u32;

    /// How it exited (`exit status: 1`, `signal: 9 (SIGKILL)`), once it
    /// has; None while it runs. Never blocks.
    fn try_wait(&mut self) -> Option<String>;

    /// Sends it `signal` if it still runs.
    fn signal(&mut self, signal: Signal);

    /// Kills it (SIGKILL) and waits until it is gone.
    fn kill_and_reap(&mut self);
}

/// The workers' setting that keeps objects read from a store once per
/// machine (`loader-worker --storage-cache-shared`).
const STORAGE_CACHE_SHARED: &str = "LOADER_STORAGE_CACHE_SHARED";

/// The environment an embedded worker gets beyond the trainer's, where the
/// trainer's does not set it: embedded workers share a machine, so an
/// image folder read from a store is kept once for all of them
/// (docs/storage.md). Every launcher passes it.
pub fn worker_defaults() -> impl Iterator<Item = (&'static str, &'static str)> {
    [(STORAGE_CACHE_SHARED, "true")].into_iter().filter(|(name, _)| std::env::var_os(name).is_none())
}

/// The default launcher: a new process running `program leading-args...
/// args...`, its stdout drained into the trace log (a worker prints its
/// address there), its stderr the trainer's.
#[derive(Debug, Clone)]
pub struct CommandLauncher {
    /// Program and leading arguments.
    command: Vec<OsString>,
    /// Variables set in each worker's environment.
    env: Vec<(OsString, OsString)>,
}

impl CommandLauncher {
    /// Launches `command` (program, then leading arguments).
    pub fn new(command: Vec<OsString>) -> Result<Self, LoaderError> {
        if command.is_empty() {
            return Err(LoaderError::Embedded("the worker command is empty".into()));
        }
        Ok(Self { command, env: Vec::new() })
    }

    /// Sets `env` in each worker's environment (`loaderctl run --cache`
    /// names the sample cache its workers inherit).
    pub fn with_env(mut self, env: Vec<(OsString, OsString)>) -> Self {
        self.env = env;
        self
    }
}

impl WorkerLauncher for CommandLauncher {
    fn launch(&self, worker: usize, args: &[String], env_remove: &[&str]) -> Result<Box<dyn WorkerProcess>, LoaderError> {
        let (program, leading) = self
            .command
            .split_first()
            .ok_or_else(|| LoaderError::Embedded("the worker command is empty".into()))?;
        let mut command = Command::new(program);
        for var in env_remove {
            command.env_remove(var);
        }
        command.env(WORKER_ID_VARIABLE, worker_index(worker).to_string());
        command.envs(worker_defaults());
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut child = command
            .args(leading)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| LoaderError::Embedded(format!("cannot start worker {worker} ({}): {e}", display(program))))?;
        if let Some(stdout) = child.stdout.take() {
            drain(worker, stdout);
        }
        Ok(Box::new(ChildProcess(child)))
    }

    fn describe(&self) -> String {
        self.command.iter().map(|a| display(a)).collect::<Vec<_>>().join(" ")
    }
}

/// A worker this process started itself (and so reaps itself).
#[derive(Debug)]
struct ChildProcess(Child);

impl WorkerProcess for ChildProcess {
    fn id(&self) -> u32 {
        self.0.id()
    }

    fn try_wait(&mut self) -> Option<String> {
        match self.0.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            // Already reaped elsewhere: gone all the same.
            Err(e) => Some(format!("an unknown status ({e})")),
        }
    }

    fn signal(&mut self, signal: Signal) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
        if let Ok(pid) = i32::try_from(self.0.id()) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    fn kill_and_reap(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn drain(n: usize, stdout: std::process::ChildStdout) {
    let spawned = std::thread::Builder::new()
        .name(format!("loader-worker-{n}-stdout"))
        .spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(line) => tracing::debug!(worker = n, "{line}"),
                    Err(_) => break,
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(worker = n, error = %e, "cannot drain worker stdout");
    }
}

fn display(s: &OsStr) -> String {
    s.to_string_lossy().into_owned()
}
