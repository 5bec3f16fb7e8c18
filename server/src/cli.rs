//! The `loader-server` command line: parse flags, bind, announce, serve.

use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::ServerConfig;
#[cfg(feature = "kubernetes")]
use crate::config::KubernetesPoolConfig;
use crate::config::{LocalPoolConfig, WorkerPoolConfig};
use loader_process::security::{Role, SecurityArgs};

/// Loader's coordinator: hands out batch ranges to workers and tracks every
/// batch until it is delivered.
#[derive(Debug, Parser)]
#[command(name = "loader-server", version)]
struct Args {
    /// Address to listen on; port 0 picks a free one (printed as `listening <addr>`).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: String,
    /// Lease length of workers and trainer sessions, in milliseconds.
    #[arg(long, default_value_t = crate::config::DEFAULT_LEASE_TTL.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(100..))]
    lease_ttl_ms: u64,
    /// Directory of the journal (jobs and delivery watermarks), so that a
    /// restarted coordinator resumes where it stopped. Without it, state is
    /// kept in memory only.
    #[arg(long)]
    state_dir: Option<std::path::PathBuf>,
    /// Batches per task handed to a worker.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    range_len: u64,
    /// Serve Prometheus metrics on this address, at /metrics (e.g.
    /// 0.0.0.0:9464; port 0 picks a free one, printed as `metrics <addr>`).
    /// Off by default.
    #[arg(long, value_name = "ADDR", value_parser = loader_process::telemetry::metrics::parse_listen)]
    metrics_listen: Option<SocketAddr>,
    /// Size the workers here, as `loaderctl scale` / `autoscale` ask:
    /// `local` starts `loader-worker` processes on this host;
    /// `kubernetes` (builds with the `kubernetes` feature) sets the
    /// replicas of the worker Deployment. Without it, workers are started by
    /// whoever deploys them.
    #[arg(long, env = "LOADER_WORKER_POOL", value_enum, value_name = "BACKEND")]
    worker_pool: Option<PoolBackend>,
    /// The worker Deployment (`--worker-pool kubernetes`).
    #[arg(long, env = "LOADER_WORKER_DEPLOYMENT", value_name = "NAME")]
    worker_deployment: Option<String>,
    /// Its namespace (default: the in-cluster or kubeconfig namespace).
    #[arg(long, env = "LOADER_NAMESPACE", value_name = "NS")]
    namespace: Option<String>,
    /// Workers the pool starts with (`--worker-pool local`).
    #[arg(long, default_value_t = 1, value_name = "N", requires = "worker_pool")]
    workers: u32,
    /// The `loader-worker` executable the pool starts (default: the one
    /// next to this `loader-server`).
    #[arg(long, value_name = "PATH", requires = "worker_pool")]
    worker_command: Option<std::path::PathBuf>,
    /// Memory the blobs of jobs (pickled Python datasets, uploaded by
    /// trainers and fetched once per worker host) may take, e.g. 8GiB; a
    /// larger blob is refused naming the sizes.
    #[arg(long, env = "LOADER_BLOB_BUDGET", value_name = "SIZE", default_value_t = crate::blobs::DEFAULT_BUDGET,
          value_parser = loader_process::size::parse_bytes)]
    blob_budget: u64,
    /// TLS and tokens (docs/security.md).
    #[command(flatten)]
    security: SecurityArgs,
}

/// Where pool workers run.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PoolBackend {
    /// Processes on the coordinator's host.
    Local,
    /// The replicas of a Kubernetes Deployment.
    Kubernetes,
}

/// Runs the CLI with `args` (including the program name); returns the exit code.
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Args = match loader_process::args::parse("loader-server", args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let _telemetry = loader_process::telemetry::init("loader-server");
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("loader-server: error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    let addr: SocketAddr = args
        .listen
        .parse()
        .map_err(|e| format!("invalid --listen address {:?}: {e} (expected HOST:PORT, e.g. 127.0.0.1:7070)", args.listen))?;
    let metrics = args.metrics_listen;
    let ttl = Duration::from_millis(args.lease_ttl_ms);
    let security = args.security.server(&Role::ALL).map_err(|e| e.to_string())?;
    if let Some(tls) = &security.tls {
        // Refuse unusable files before announcing the address.
        tls.load().map_err(|e| e.to_string())?;
    }
    let config = ServerConfig {
        security,
        lease_ttl: ttl,
        heartbeat_interval: crate::config::heartbeat_interval(ttl),
        range_len: args.range_len,
        state_dir: args.state_dir,
        blob_budget: args.blob_budget,
        worker_pool: match args.worker_pool {
            Some(PoolBackend::Local) => Some(WorkerPoolConfig::Local(LocalPoolConfig {
                command: match args.worker_command {
                    Some(path) => path,
                    None => sibling_worker()?,
                },
                initial: args.workers,
            })),
            #[cfg(feature = "kubernetes")]
            Some(PoolBackend::Kubernetes) => Some(WorkerPoolConfig::Kubernetes(KubernetesPoolConfig {
                deployment: args.worker_deployment.ok_or_else(|| {
                    "--worker-pool kubernetes needs --worker-deployment NAME (or LOADER_WORKER_DEPLOYMENT)".to_owned()
                })?,
                namespace: args.namespace,
            })),
            #[cfg(not(feature = "kubernetes"))]
            Some(PoolBackend::Kubernetes) => {
                return Err("--worker-pool kubernetes: this loader-server was built without Kubernetes support \
                            (cargo feature `kubernetes`)"
                    .to_owned());
            }
            None => None,
        },
    };
    let runtime = tokio::runtime::Runtime::new().map_err(|e| format!("cannot start runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local = listener.local_addr().map_err(|e| format!("cannot read listening address: {e}"))?;
        let metrics = metrics
            .map(|addr| loader_process::telemetry::metrics::serve(addr).map_err(|e| format!("--metrics-listen: {e}")))
            .transpose()?;
        println!("listening {local}");
        if let Some(addr) = metrics {
            println!("metrics {addr}");
        }
        let _ = std::io::stdout().flush();
        crate::serve(listener, config, loader_process::signals::stop_requested()).await.map_err(|e| e.to_string())
    })
}

/// `loader-worker` next to this executable, for `--worker-pool local`.
fn sibling_worker() -> Result<std::path::PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("--worker-pool local: cannot find this executable: {e}"))?;
    let worker = exe.with_file_name("loader-worker");
    if worker.is_file() {
        Ok(worker)
    } else {
        Err(format!(
            "--worker-pool local: no loader-worker next to {} (give --worker-command PATH)",
            exe.display()
        ))
    }
}
