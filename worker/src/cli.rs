//! The `loader-worker` command line. `loaderctl` reuses it for its hidden
//! `__worker` subcommand, so it builds its own runtime and never calls
//! `std::process::exit`.

use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::config::WorkerConfig;
use crate::dataset::Datasets;
use crate::error::WorkerError;

/// Loader worker: builds batches for the jobs its coordinator assigns and
/// serves them to trainers.
#[derive(Debug, Parser)]
#[command(name = "loader-worker", version)]
struct Args {
    /// Coordinator URL, e.g. http://10.0.0.2:5000.
    #[arg(long, env = "LOADER_COORDINATOR", value_name = "URL")]
    coordinator: String,
    /// Address to serve batches on, e.g. 0.0.0.0:7070 (port 0 picks one).
    #[arg(long, env = "LOADER_LISTEN", value_name = "ADDR")]
    listen: String,
    /// URL trainers use to reach this worker [default: http://<listen address>].
    #[arg(long, env = "LOADER_ADVERTISE", value_name = "URL")]
    advertise: Option<String>,
    /// Node identity for co-location, e.g. the Kubernetes node name
    /// [default: hostname + boot id].
    #[arg(long, env = "LOADER_NODE", value_name = "NODE")]
    node: Option<String>,
    /// Batches held undelivered per consumer.
    #[arg(long, default_value_t = WorkerConfig::default().max_outstanding, value_name = "K",
          value_parser = clap::value_parser!(u32).range(1..))]
    max_outstanding: u32,
    /// Memory the batches this worker holds may take, e.g. 8GiB, at most
    /// the container's memory limit (or RAM); a job whose batches do not
    /// fit fails with an error naming the sizes [default: half the
    /// container's memory limit, or of RAM].
    #[arg(long, env = "LOADER_MEMORY_BUDGET", value_name = "SIZE", value_parser = crate::budget::parse_budget)]
    memory_budget: Option<u64>,
    /// Memory for batches of shared streams kept after they were sent, so
    /// that a subscriber trailing the others (started later, or slower)
    /// gets them without their being made again, e.g. 2GiB; 0 keeps none.
    /// Each is kept at most 30 s.
    #[arg(long, env = "LOADER_KEEP_SHARED", value_name = "SIZE", value_parser = parse_size_or_zero,
          default_value = "1GiB")]
    keep_shared: u64,
    /// Keep each image of an image_folder or webdataset job decoded, up to
    /// this size (8GiB, 512MiB), so its epochs after the first decode
    /// nothing: the same batches, faster (docs/images.md, "Kept frames").
    /// One job at a time keeps its frames; a job whose keeping does not
    /// pay turns it off. Workers spawned by a trainer's cache use that
    /// cache instead.
    #[arg(long, env = "LOADER_WORKER_CACHE", value_name = "SIZE", value_parser = crate::budget::parse_bytes)]
    cache: Option<u64>,
    /// Keep the cache in an unnamed file in DIR (its pages spill to that
    /// disk) instead of memory.
    #[arg(long, env = "LOADER_WORKER_CACHE_DIR", value_name = "DIR", requires = "cache", value_parser = parse_dir)]
    cache_dir: Option<std::path::PathBuf>,
    /// Share each job's cache with the other workers of this node started
    /// with the same --cache-dir and this flag: every image is kept once
    /// on the node, and read by whichever worker makes its sample. The
    /// first worker to need a job's cache makes it, of its --cache size;
    /// the last to let go removes it. Point --cache-dir at a tmpfs
    /// (/dev/shm) to keep it in memory.
    #[arg(long, env = "LOADER_WORKER_CACHE_SHARED", requires = "cache_dir")]
    cache_shared: bool,
    /// Keep the bytes of datasets read from object storage (s3:// URLs)
    /// in DIR, for the job's later epochs (docs/storage.md) [default:
    /// the system's temporary directory].
    #[arg(long, env = "LOADER_STORAGE_CACHE_DIR", value_name = "DIR", value_parser = parse_dir)]
    storage_cache_dir: Option<std::path::PathBuf>,
    /// At most this much of them (50GiB, 0 keeps nothing on disk)
    /// [default: half the free space of the directory].
    #[arg(long, env = "LOADER_STORAGE_CACHE", value_name = "SIZE", value_parser = parse_size_or_zero)]
    storage_cache: Option<u64>,
    /// Keep an image folder's objects once for every worker of this node
    /// given the same --storage-cache-dir, not once per worker: a
    /// shuffled epoch then reads from local disk the images any of them
    /// fetched.
    #[arg(long, env = "LOADER_STORAGE_CACHE_SHARED", value_parser = clap::builder::BoolishValueParser::new(), num_args = 0, default_missing_value = "true")]
    storage_cache_shared: bool,
    /// Seconds to keep retrying the first registration.
    #[arg(long, default_value_t = 5.0, value_name = "SECS", value_parser = parse_secs, allow_hyphen_values = true)]
    connect_timeout: f64,
    /// Serve Prometheus metrics on this address, at /metrics (e.g.
    /// 0.0.0.0:9464; port 0 picks a free one, printed as `metrics <addr>`).
    /// Off by default.
    #[arg(long, env = "LOADER_METRICS_LISTEN", value_name = "ADDR", value_parser = loader_process::telemetry::metrics::parse_listen)]
    metrics_listen: Option<SocketAddr>,
    /// The host's blob directory, where the blobs of jobs (pickled Python
    /// datasets) are fetched once per host [default:
    /// $XDG_RUNTIME_DIR/loader-blobs, else $TMPDIR/loader-blobs-<uid>].
    #[arg(long, env = loader_process::blobs::BLOB_DIR_ENV, value_name = "DIR")]
    blob_dir: Option<std::path::PathBuf>,
    /// TLS and tokens (docs/security.md).
    #[command(flatten)]
    security: loader_process::security::SecurityArgs,
    /// Test knob: every batch takes this many milliseconds longer (a
    /// straggler, as on a slow disk or a noisy host).
    #[arg(long, hide = true, default_value_t = 0, value_name = "MS")]
    slow_batch_ms: u64,
}

/// A size as [`crate::budget::parse_bytes`] reads it, or 0.
fn parse_size_or_zero(s: &str) -> Result<u64, String> {
    if s.trim() == "0" { Ok(0) } else { crate::budget::parse_bytes(s) }
}

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!("expected seconds between 0 and 86400, got {s:?}")),
    }
}

/// Runs the whole CLI: parses `args`, binds, prints `listening <addr>` on
/// stdout once bound, and serves until SIGTERM/SIGINT (exit 0) or a fatal
/// error (one line `loader-worker: error: <message>` on stderr, exit 1).
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    main_with_datasets(args, Datasets::new())
}

/// [`main_with_args`] for a custom worker binary: the same flags and
/// behaviour, also serving the custom datasets registered in `datasets`.
pub fn main_with_datasets<I, T>(args: I, datasets: Datasets) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Args = match loader_process::args::parse("loader-worker", args) {
        Ok(args) => args,
        Err(code) => return code,
    };
    let _telemetry = loader_process::telemetry::init("loader-worker");
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    match runtime.block_on(serve(args, datasets)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e.to_string()),
    }
}

async fn serve(args: Args, datasets: Datasets) -> Result<(), WorkerError> {
    // Unusable TLS files or tokens fail before the address is announced.
    crate::security_settings(&args.security)?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|source| WorkerError::Listen { addr: args.listen.clone(), source })?;
    let local = listener
        .local_addr()
        .map_err(|source| WorkerError::Listen { addr: args.listen.clone(), source })?;
    let metrics = args.metrics_listen.map(loader_process::telemetry::metrics::serve).transpose()?;
    {
        let mut out = std::io::stdout().lock();
        // A closed stdout (parent not reading) must not stop the worker.
        let _ = writeln!(out, "listening {local}").and_then(|()| out.flush());
        if let Some(addr) = metrics {
            let _ = writeln!(out, "metrics {addr}").and_then(|()| out.flush());
        }
    }
    loader_storage::local_copy::configure(args.storage_cache_dir.clone(), args.storage_cache, args.storage_cache_shared);
    loader_storage::node_pile::sweep_leftovers();
    // A worker's batches wait out a store's throttling or restart.
    loader_storage::stores::ride_out_outages();
    let config = WorkerConfig {
        coordinator: args.coordinator,
        advertise: args.advertise,
        node: args.node,
        max_outstanding: args.max_outstanding,
        memory_budget: args.memory_budget,
        connect_timeout: Duration::from_secs_f64(args.connect_timeout),
        blob_dir: Some(args.blob_dir.unwrap_or_else(loader_process::blobs::path_from_env)),
        security: args.security,
        keep_shared: args.keep_shared,
        cache: args.cache,
        cache_dir: args.cache_dir,
        cache_shared: args.cache_shared,
        slow_batch: Duration::from_millis(args.slow_batch_ms),
    };
    crate::run_with_datasets(listener, config, datasets, loader_process::signals::stop_requested()).await
}

/// A directory that exists (`--cache-dir`): a typo fails at start-up, not
/// at the first image job.
fn parse_dir(s: &str) -> Result<std::path::PathBuf, String> {
    let path = std::path::PathBuf::from(s);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_dir() => Ok(path),
        Ok(_) => Err(format!("{s}: not a directory")),
        Err(e) => Err(format!("{s}: {e}")),
    }
}

/// Clap's report up to its first blank line (the error, and for a missing
/// argument the arguments it lists), on one line, plus a hint.
fn fail(message: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr().lock(), "loader-worker: error: {message}");
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_metrics_address_is_one_line_naming_the_flag() {
        let base = ["loader-worker", "--coordinator", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"];
        let ok = Args::try_parse_from(base.iter().chain(&["--metrics-listen", "127.0.0.1:0"])).expect("port 0");
        assert_eq!(ok.metrics_listen, Some(SocketAddr::from(([127, 0, 0, 1], 0))));
        assert_eq!(Args::try_parse_from(base).expect("off").metrics_listen, None);
        let e = Args::try_parse_from(base.iter().chain(&["--metrics-listen", "localhost:9464"])).expect_err("host name");
        let message = loader_process::args::one_line(&e);
        assert!(message.contains("--metrics-listen"), "{message}");
        assert!(message.contains("invalid metrics address \"localhost:9464\": expected IP:PORT"), "{message}");
        assert!(!message.contains('\n'), "{message}");
    }
}
