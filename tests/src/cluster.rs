//! A coordinator and its workers as real processes.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::admin::Admin;
use crate::proc::{Proc, binary};
use crate::scope::Scope;

/// How long workers may take to show up at the coordinator.
const REGISTRATION: Duration = Duration::from_secs(10);

/// How to start a [`Cluster`].
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    /// Workers started at once.
    workers: usize,
    /// `--lease-ttl-ms`, when not the server's default.
    ttl_ms: Option<u64>,
    /// `--state-dir`, for a coordinator that must survive a restart.
    state_dir: Option<PathBuf>,
    /// `--listen` of the coordinator.
    listen: String,
    /// Collect each worker's stderr (see [`Proc::stderr`]).
    capture_worker_stderr: bool,
    /// `RUST_LOG` of the workers, for tests that check what they log below
    /// the default level (warn).
    worker_log: Option<String>,
    /// `--metrics-listen 127.0.0.1:0` on the coordinator and every worker.
    metrics: bool,
    /// Environment of the coordinator and every worker (e.g. the
    /// OpenTelemetry exporter's), on top of the test's.
    env: Vec<(String, String)>,
    /// The coordinator speaks TLS.
    https: bool,
    /// What admin calls present.
    admin_security: loader_process::security::ClientSecurity,
}

impl ClusterBuilder {
    /// Workers to start with the coordinator (default 0).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// Lease TTL of workers and sessions.
    pub fn ttl_ms(mut self, ms: u64) -> Self {
        self.ttl_ms = Some(ms);
        self
    }

    /// Journal directory of the coordinator.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// Collect what workers log on stderr, for [`Proc::stderr`].
    pub fn capture_worker_stderr(mut self) -> Self {
        self.capture_worker_stderr = true;
        self
    }

    /// `RUST_LOG` filter of the workers started by [`Cluster::add_worker`]
    /// (e.g. `loader_worker=info`).
    pub fn worker_log(mut self, filter: impl Into<String>) -> Self {
        self.worker_log = Some(filter.into());
        self
    }

    /// Serve Prometheus metrics from the coordinator and every worker, each
    /// on a port of its own (see [`Proc::announced`] with `"metrics "`).
    pub fn metrics(mut self) -> Self {
        self.metrics = true;
        self
    }

    /// Sets `name=value` in the environment of the coordinator and of every
    /// worker.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// The coordinator speaks TLS (its environment has the files):
    /// its URL is `https://`; admin calls use `admin` (TLS settings and the
    /// admin token).
    pub fn secured(mut self, https: bool, admin: loader_process::security::ClientSecurity) -> Self {
        self.https = https;
        self.admin_security = admin;
        self
    }

    /// Address the coordinator listens on (default `127.0.0.1:0`).
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = addr.into();
        self
    }

    /// Starts the coordinator and the workers, and waits until every worker
    /// has registered.
    pub fn start(self, scope: &Scope) -> Cluster {
        let server = start_server(scope, &self, &self.listen);
        let mut cluster = Cluster { workers: Vec::new(), server, config: self, scope: scope.clone() };
        for _ in 0..cluster.config.workers {
            cluster.add_worker();
        }
        cluster.wait_for_workers(cluster.config.workers);
        cluster
    }
}

fn start_server(scope: &Scope, config: &ClusterBuilder, listen: &str) -> Proc {
    let mut args = vec!["--listen".to_owned(), listen.to_owned()];
    if let Some(ms) = config.ttl_ms {
        args.extend(["--lease-ttl-ms".to_owned(), ms.to_string()]);
    }
    if let Some(dir) = &config.state_dir {
        args.extend(["--state-dir".to_owned(), dir.display().to_string()]);
    }
    if config.metrics {
        args.extend(["--metrics-listen".to_owned(), "127.0.0.1:0".to_owned()]);
    }
    let mut command = Command::new(binary("loader-server"));
    command.args(&args).envs(config.env.iter().map(|(k, v)| (k, v)));
    Proc::spawn(scope, "loader-server", command, true)
}

/// A coordinator and its workers.
#[derive(Debug)]
pub struct Cluster {
    /// The `loader-worker` processes (declared first: dropped, so killed,
    /// before the coordinator, so they do not log its disappearance).
    pub workers: Vec<Proc>,
    /// The `loader-server` process.
    pub server: Proc,
    /// How it was started, for restarts.
    config: ClusterBuilder,
    /// Where new processes are tracked.
    scope: Scope,
}

impl Cluster {
    /// Settings for a new cluster.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder {
            workers: 0,
            ttl_ms: None,
            state_dir: None,
            listen: "127.0.0.1:0".into(),
            capture_worker_stderr: false,
            worker_log: None,
            metrics: false,
            env: Vec::new(),
            https: false,
            admin_security: loader_process::security::ClientSecurity::none(),
        }
    }

    /// A coordinator with default settings and `workers` workers.
    pub fn start(scope: &Scope, workers: usize) -> Cluster {
        Cluster::builder().workers(workers).start(scope)
    }

    /// URL of the coordinator.
    pub fn url(&self) -> String {
        let scheme = if self.config.https { "https" } else { "http" };
        format!("{scheme}://{}", self.server.addr())
    }

    /// The lease TTL the coordinator was started with (the server's default
    /// when none was given).
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.config.ttl_ms.unwrap_or(5000))
    }

    /// An admin client of the coordinator.
    pub fn admin(&self) -> Admin {
        Admin::with_security(&self.url(), &self.config.admin_security)
    }

    /// Starts one more worker on this host.
    pub fn add_worker(&mut self) -> &Proc {
        self.add_worker_with(&[])
    }

    /// Starts one more worker on this host with extra flags.
    pub fn add_worker_with(&mut self, extra: &[&str]) -> &Proc {
        let mut command = Command::new(binary("loader-worker"));
        command.args(["--coordinator", &self.url(), "--listen", "127.0.0.1:0"]).args(extra);
        if self.config.metrics {
            command.args(["--metrics-listen", "127.0.0.1:0"]);
        }
        if let Some(filter) = &self.config.worker_log {
            command.env("RUST_LOG", filter);
        }
        command.envs(self.config.env.iter().map(|(k, v)| (k, v)));
        self.add_worker_command(command)
    }

    /// Starts a worker from a prepared command (e.g. inside a network
    /// namespace); it must print its `listening` line.
    pub fn add_worker_command(&mut self, command: Command) -> &Proc {
        let worker = if self.config.capture_worker_stderr {
            Proc::spawn_capturing_stderr(&self.scope, "loader-worker", command, true)
        } else {
            Proc::spawn(&self.scope, "loader-worker", command, true)
        };
        self.workers.push(worker);
        self.workers.last().expect("just pushed")
    }

    /// Waits (bounded) until the coordinator lists at least `n` workers.
    pub fn wait_for_workers(&self, n: usize) {
        self.admin().wait_for(&format!("{n} workers registered"), REGISTRATION, |a| {
            Ok((a.workers()?.len() >= n).then_some(()))
        });
    }

    /// SIGKILLs the coordinator, waits `down`, then starts it again with the
    /// same flags on the same address (so clients and workers find it where
    /// it was).
    pub fn restart_server(&mut self, down: Duration) {
        self.server.kill();
        std::thread::sleep(down);
        let addr = self.server.addr().to_owned();
        self.server = start_server(&self.scope, &self.config, &addr);
        assert_eq!(self.server.addr(), addr, "the restarted coordinator must listen where the first one did");
    }
}
