//! `loaderctl`, the operator's CLI, as a library: flag definitions and the
//! subcommands, so the binary itself only calls [`main`]. It sits above the
//! trainer SDK (`loader-client`), which it drives like any trainer, and
//! links the worker crate for one reason: `loaderctl run` starts its
//! workers as `loaderctl __worker ...`, so one binary is all a user needs.
//!
//! # Layout
//! - `run`: the embedded one-command demo/benchmark.
//! - `consume`: the same measurement against an external coordinator.
//! - `measure`: what both share: the job from flags, the consuming loop and
//!   its report.
//! - `status`: tables (or one JSON object) of a coordinator's workers,
//!   sessions and jobs, the AdminService poll `top` shares, and `drain`.
//! - `scale`: sets how many workers a coordinator's worker pool runs.
//! - `top`: the live view: rates from successive polls, one frame's text,
//!   the redraw loop.
//! - `storage`: the workers' reads from object stores, as `status` and
//!   `top` show them (only when a worker read from one).
//! - `terminal`: the terminal while `top` runs: alternate screen, keys
//!   without Enter, restored on every way out.
//! - `table`: plain aligned text tables.
//! - `signals`: SIGTERM and SIGINT stop `run`, `consume` and `top` cleanly.
//! - `cpu`: this process's CPU time, less the embedded coordinator's
//!   threads, for the per-batch figures of the reports.

mod consume;
mod cpu;
mod kept;
mod measure;
mod run;
mod scale;
mod signals;
mod status;
mod storage;
mod table;
mod terminal;
mod top;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use loader_process::security::{ClientSecurity, Role, SecurityArgs};

/// loaderctl: operate a Loader deployment, or run a job on this machine.
#[derive(Debug, Parser)]
#[command(name = "loaderctl", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a job in embedded mode (an in-process coordinator and local
    /// worker processes) and report throughput.
    Run(RunArgs),
    /// Consume a job from an external coordinator (whose workers are
    /// already running) and report throughput and client CPU time.
    Consume(ConsumeArgs),
    /// Show a coordinator's workers, trainer sessions and jobs.
    Status(StatusArgs),
    /// A live view of a coordinator's workers, sessions and jobs, with
    /// rates, redrawn every interval.
    Top(TopArgs),
    /// Tell a worker to drain: it finishes what it holds, takes no new
    /// tasks, and exits.
    Drain(DrainArgs),
    /// Set how many workers the coordinator's worker pool runs
    /// (`loader-server --worker-pool local`): starts new ones, or drains
    /// those with the least outstanding work.
    Scale(ScaleArgs),
    /// Let the coordinator size its worker pool on the trainers' stall:
    /// grow while they wait more than the target (and it helps), shrink
    /// when workers idle.
    Autoscale(AutoscaleArgs),
    /// Merge the loader states every rank of a job saved (at the same step
    /// or not) into one that any number of new ranks resume from with
    /// `consume --resume`: each sample of the epoch is then delivered once
    /// over the whole run.
    MergeStates(MergeStatesArgs),
    /// Internal: run as a worker process (how `run` starts its workers).
    #[command(name = "__worker", hide = true)]
    Worker {
        /// The `loader-worker` flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

/// Flags of `loaderctl run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Worker processes to start.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub workers: u64,
    /// The job.
    #[command(flatten)]
    pub dataset: DatasetArgs,
    /// How batches travel and what is printed.
    #[command(flatten)]
    pub measure: MeasureArgs,
    /// Keep each image of an image_folder or webdataset job decoded in a
    /// sample cache of this size that the workers share (8GiB, 512MiB, a
    /// number of bytes), so epochs after the first decode nothing: the
    /// same batches, faster (docs/images.md, "Kept frames"). It turns
    /// itself off when keeping does not pay for the job's epochs, and for
    /// one epoch; the report says how it did.
    #[arg(long, value_name = "SIZE", value_parser = loader_process::size::parse_bytes)]
    pub cache: Option<u64>,
    /// Keep the cache in an unnamed file in DIR (its pages spill to that
    /// disk) instead of memory.
    #[arg(long, value_name = "DIR", requires = "cache")]
    pub cache_dir: Option<PathBuf>,
}

/// A `--step-ms` value: a finite number of milliseconds, 0 or more.
fn parse_step_ms(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(ms) if ms.is_finite() && (0.0..=3_600_000.0).contains(&ms) => Ok(ms),
        _ => Err(format!("expected milliseconds from 0 to 3600000, got {s:?}")),
    }
}

/// Flags of `loaderctl consume`.
#[derive(Debug, Clone, Args)]
pub struct ConsumeArgs {
    /// Coordinator URL.
    #[arg(long, env = "LOADER_COORDINATOR", value_name = "URL")]
    pub coordinator: String,
    /// Name of the job, so that every rank (and a restarted trainer)
    /// attaches to the same one; they must pass the same dataset flags.
    #[arg(long, value_name = "NAME")]
    pub job_name: Option<String>,
    /// Subscribe to the named job as a shared stream: every trainer that
    /// passes it receives every batch, made once (docs/sharing.md).
    #[arg(long, requires = "job_name")]
    pub shared: bool,
    /// This trainer's rank [default: 0, or the saved one with --resume].
    #[arg(long)]
    pub rank: Option<u32>,
    /// Number of ranks [default: 1, or the saved one with --resume; another
    /// one re-plans the rest of the job for it].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub world_size: Option<u32>,
    /// After yielding this many batches (in this run), write the loader's
    /// state to --state-file (atomically), then keep consuming.
    #[arg(long, value_name = "K", requires = "state_file")]
    pub save_state_after: Option<u64>,
    /// Where --save-state-after writes the state (JSON).
    #[arg(long, value_name = "PATH", requires = "save_state_after")]
    pub state_file: Option<PathBuf>,
    /// Continue exactly after the last batch of a saved state (written by
    /// --save-state-after, or merged with `loaderctl merge-states`): the job
    /// comes from it, so the job and dataset flags must not be given; the
    /// rank and world size too unless --rank and --world-size say others
    /// (every new rank then loads the same state, and each sample of the
    /// epoch is delivered once over the whole run).
    #[arg(
        long,
        value_name = "PATH",
        conflicts_with_all = [
            "job_name", "shared", "epochs", "batch_size", "dataset",
            "path", "samples", "shape", "dtype", "context_length", "spec", "on_corrupt",
        ]
    )]
    pub resume: Option<PathBuf>,
    /// With --resume: samples per batch of the resumed job [default: the
    /// saved one]. Keeping batch size x world size keeps the global batches.
    #[arg(long, value_name = "B", requires = "resume")]
    pub resume_batch_size: Option<u32>,
    /// The job.
    #[command(flatten)]
    pub dataset: DatasetArgs,
    /// How batches travel and what is printed.
    #[command(flatten)]
    pub measure: MeasureArgs,
    /// TLS and tokens (docs/security.md).
    #[command(flatten)]
    pub security: SecurityArgs,
}

/// The job's dataset and shape, shared by `run` and `consume`.
#[derive(Debug, Clone, Args)]
pub struct DatasetArgs {
    /// A whole job from a spec file (YAML or JSON: dataset, transforms,
    /// batch size, sampler, corrupt-sample policy), instead of the dataset
    /// flags.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = [
            "epochs", "batch_size", "dataset", "path", "samples", "shape", "dtype",
            "context_length", "on_corrupt", "shuffle",
        ]
    )]
    pub spec: Option<PathBuf>,
    /// Epochs to run.
    #[arg(long, default_value_t = 1)]
    pub epochs: u32,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    pub batch_size: u32,
    /// Dataset kind: synthetic, tokens, or imagefolder (the standard
    /// training pipeline: decode, RandomResizedCrop(224), horizontal flip;
    /// uint8 [3, 224, 224] images and int64 labels).
    #[arg(long, default_value = "synthetic")]
    pub dataset: String,
    /// Token file for --dataset tokens [default: a generated temporary
    /// file]; the root of the class folders for --dataset imagefolder.
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// What workers do with a corrupt image: fail the job, or skip the
    /// image (its batch is one shorter; the worker logs the path).
    #[arg(long, value_enum, default_value = "fail")]
    pub on_corrupt: OnCorruptArg,
    /// Samples of the synthetic dataset.
    #[arg(long, default_value_t = 10_000)]
    pub samples: u64,
    /// Shape of one synthetic sample, comma-separated.
    #[arg(long, default_value = "3,224,224")]
    pub shape: String,
    /// Element type [default: uint8 for synthetic, uint16 for tokens].
    #[arg(long)]
    pub dtype: Option<String>,
    /// Tokens per context for --dataset tokens.
    #[arg(long, default_value_t = 2048)]
    pub context_length: u64,
    /// Shuffles the samples with this seed, in a new order each epoch
    /// (`DataLoader(shuffle=True)`); without it, every epoch reads them in
    /// dataset order, as DataLoader's default does.
    #[arg(long, value_name = "SEED")]
    pub shuffle: Option<u64>,
}

/// `--on-corrupt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnCorruptArg {
    /// The job fails with the file's path in the error.
    Fail,
    /// The sample is left out and its path logged.
    Skip,
}

/// How batches reach the trainer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    /// Workers on this machine write batches into a shared-memory ring;
    /// remote ones stream over gRPC.
    Shm,
    /// Every batch streams over gRPC.
    Grpc,
}

/// Transport, prefetch and output, shared by `run` and `consume`.
#[derive(Debug, Clone, Args)]
pub struct MeasureArgs {
    /// Batches each worker may send ahead, at least: small batches get more
    /// (32 MiB of them, up to 256).
    #[arg(long, default_value_t = loader_client::DEFAULT_PREFETCH)]
    pub prefetch: u32,
    /// How co-located workers deliver batches.
    #[arg(long, value_enum, default_value = "shm")]
    pub transport: TransportArg,
    /// Print one JSON object on stdout instead of the summary (no progress
    /// bar). Its `client_cpu_us_per_batch` is this process's CPU time (user +
    /// sys, getrusage) over the consuming loop per batch; under `run` that
    /// includes the embedded coordinator, which runs in this process (use
    /// `consume` against an external coordinator to measure the client alone).
    #[arg(long)]
    pub json: bool,
    /// Write one line per batch to FILE, as it is yielded:
    /// `<seq> <epoch> <idx0>,<idx1>,...` (the batch's sample indices), so
    /// runs can be compared batch for batch. Each line is flushed.
    #[arg(long, value_name = "FILE")]
    pub dump: Option<PathBuf>,
    /// Serve this trainer's Prometheus metrics on ADDR (`/metrics`; port 0
    /// picks one, printed as `metrics <addr>` on stderr). Under `run` the
    /// embedded coordinator's metrics are served there too.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Where batches land: cpu, cuda, cuda:N (copied to that GPU straight
    /// from the shared-memory ring; each batch's copy is waited for, so the
    /// rate is the host-to-device rate; needs a build with the feature
    /// `cuda`), auto (a GPU if usable, else the host) or host (the device
    /// path with host memory as the device: checks it without a GPU).
    #[arg(long, value_name = "DEVICE", default_value = "cpu")]
    pub device: loader_client::Device,
    /// The shared-memory ring as `SLOTS,SLOT_BYTES` [default: slots the
    /// size of the batch, at most 16 MiB: a larger batch streams over gRPC
    /// unless its slots are given here].
    #[arg(long, value_name = "SLOTS,SLOT_BYTES", value_parser = parse_ring)]
    pub ring: Option<RingGeometry>,
    /// Host-to-device copies queued ahead of the batch being consumed.
    #[arg(long, value_name = "N", default_value_t = loader_client::DEFAULT_DEVICE_PREFETCH)]
    pub device_prefetch: u32,
    /// Write one line per batch to FILE: `<seq> <fnv1a-64 of the batch's
    /// bytes>`; for a batch on a device, of its bytes read back from the
    /// device. Two runs of one job (say `--device cpu` and `--device
    /// cuda`) must write the same file.
    #[arg(long, value_name = "FILE")]
    pub checksum: Option<PathBuf>,
    /// After each batch, wait MS milliseconds, as a training step would
    /// (the GPU busy with the batch): the report then says whether the
    /// loader keeps up with a trainer of that pace (wait_p50_us and
    /// wait_p99_us near zero, samples/s the step's). 0: consume as fast as
    /// batches come.
    #[arg(long, value_name = "MS", default_value_t = 0.0, value_parser = parse_step_ms)]
    pub step_ms: f64,
}

/// Flags of `loaderctl drain`.
#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// Coordinator URL.
    #[arg(long, env = "LOADER_COORDINATOR", value_name = "URL")]
    pub coordinator: String,
    /// Id of the worker to drain (the ID column of `loaderctl status`).
    #[arg(long, value_name = "ID")]
    pub worker: u64,
    /// TLS and tokens (docs/security.md).
    #[command(flatten)]
    pub security: SecurityArgs,
}

/// Flags of `loaderctl scale`.
#[derive(Debug, Clone, Args)]
pub struct ScaleArgs {
    /// Coordinator URL.
    #[arg(long, env = "LOADER_COORDINATOR", value_name = "URL")]
    pub coordinator: String,
    /// Workers the pool should run.
    #[arg(long, value_name = "N")]
    pub workers: u32,
    /// Wait up to SECS for the workers started to register and those
    /// drained to leave (0: do not wait).
    #[arg(long, value_name = "SECS", value_parser = parse_wait)]
    pub wait: Option<f64>,
    /// TLS and tokens (docs/security.md).
    #[command(flatten)]
    pub security: SecurityArgs,
}

/// `--ring SLOTS,SLOT_BYTES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingGeometry {
    /// Slots of the ring.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_bytes: u64,
}

fn parse_ring(s: &str) -> Result<RingGeometry, String> {
    s.split_once(',')
        .and_then(|(slots, bytes)| Some((slots.trim().parse::<u32>().ok()?, bytes.trim().parse::<u64>().ok()?)))
        .map(|(slots, slot_bytes)| RingGeometry { slots, slot_bytes })
        .ok_or_else(|| "expected SLOTS,SLOT_BYTES (e.g. 8,41943040)".to_owned())
}

fn parse_wait(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=86_400.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds between 0 and 86400")),
    }
}

/// Flags of `loaderctl autoscale`.
#[derive(Debug, Clone, Args)]
pub struct AutoscaleArgs {
    /// Coordinator URL.
    #[arg(long, env = "LOADER_COORDINATOR", value_name = "URL")]
    pub coordinator: String,
    /// Fewest workers.
    #[arg(long, value_name = "A", required_unless_present = "off")]
    pub min: Option<u32>,
    /// Most workers.
    #[arg(long, value_name = "B", required_unless_present = "off")]
    pub max: Option<u32>,
    /// The trainers' stall to stay under: a percentage (`5%`) or a share
    /// (`0.05`).
    #[arg(long, value_name = "STALL", default_value = "5%", value_parser = parse_share)]
    pub target_stall: f64,
    /// Seconds between two changes.
    #[arg(long, value_name = "SECS", default_value_t = 3.0, value_parser = parse_wait)]
    pub cooldown: f64,
    /// Stop autoscaling (the pool keeps its size).
    #[arg(long, conflicts_with_all = ["min", "max"])]
    pub off: bool,
    /// TLS and tokens (docs/security.md).
    #[command(flatten)]
    pub security: SecurityArgs,
}

fn parse_share(s: &str) -> Result<f64, String> {
    let share = match s.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|v| v / 100.0),
        None => s.parse::<f64>(),
    };
    match share {
        Ok(v) if v > 0.0 && v < 1.0 => Ok(v),
        _ => Err(format!("{s:?} is not a stall share: give a percentage like 5% or a share like 0.05")),
    }
}

/// Flags of `loaderctl status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Coordinator URL.
    #[arg(long, env = "LOADER_COORDINATOR", value_name = "URL")]
    pub coordinator: String,
    /// Print one JSON object on one line instead of the tables, for
    /// scripts.
    ///
    /// {"workers": [...], "sessions": [...], "jobs": [...]}. A worker has
    /// worker_id, address, node, outstanding (batches assigned, not yet
    /// delivered), delivered (batches), delivered_samples, busy (fraction
    /// 0..1 of the last heartbeat interval its producer spent making
    /// batches), last_seen_ms, draining, pid, storage (null unless it read
    /// from an object store; totals since it started: requests,
    /// failed_requests, retries (attempts the store's client retried),
    /// bytes, chunk_reads, chunk_fetches, chunk_hit_ratio,
    /// object_reads_local, object_reads_store, object_hit_ratio,
    /// latency_p50_ms and latency_p99_ms (bounds: powers of two),
    /// latency_buckets (entry i: requests under 2^i ms)). A session has
    /// session_id, job_id, consumer (the rank, or on a shared stream its
    /// subscriber), node,
    /// ring, last_seen_ms, stall_ms (total time the trainer waited for
    /// batches). A job has job_id, name, dataset, num_samples, batch_size,
    /// batches_per_epoch, error (null unless the job failed), shared,
    /// subscribers (a shared stream's, still there), cache (null unless a
    /// worker used a sample cache for it: hits, misses, hit_ratio,
    /// stored_bytes, refused, off: null or why it is off) and consumers:
    /// consumer, assigned, delivered, resent, consumed, total (batches),
    /// subscribes_to (a subscriber's rank, else null), left, assigned_alone
    /// (a subscriber's batches made for it alone). Field names are stable;
    /// new fields may be added.
    #[arg(long)]
    pub json: bool,
    /// List every worker, session and rank. Without it a table lists at
    /// most 40 rows (draining workers and those holding the most batches
    /// first, sessions that stalled longest first) and a job of more than 8
    /// ranks is summed up in one line, so that status stays readable at
    /// thousands of workers.
    #[arg(long)]
    pub all: bool,
    /// TLS and tokens (docs/security.md).
    #[command(flatten)]
    pub security: SecurityArgs,
}

/// Flags of `loaderctl top`.
#[derive(Debug, Clone, Args)]
#[command(after_long_help = "Workers: samples/s and batches/s delivered, BUSY = time the producer spent making \
batches, QUEUE = batches assigned and not yet delivered. Sessions: STALL = share of the interval the trainer \
waited for batches, WATERMARK = batches consumed / total. Jobs: batches consumed / total, delivery rate, and \
the ETA at that rate. Storage (only when a worker read from an object store): requests and MB per second \
from the store, then totals since the worker started: requests, failed, the local copy's hit ratio for chunks \
and for an image folder's objects, p50 and p99 latency (power-of-two bounds). Rates are differences between \
polls of the coordinator's AdminService, taken between the heartbeats the polls saw (`-` until there are two). \
Quit with q, Ctrl-C or SIGTERM; the terminal is restored and the exit code is 0.")]
pub struct TopArgs {
    /// Coordinator URL.
    #[arg(long, env = "LOADER_COORDINATOR", value_name = "URL")]
    pub coordinator: String,
    /// Seconds between polls of the coordinator (and redraws), 0.1 to
    /// 3600; fractions allowed.
    #[arg(long, value_name = "SECONDS", default_value = "1", allow_negative_numbers = true, value_parser = top::parse_interval)]
    pub interval: std::time::Duration,
    /// Print one frame (after two polls one interval apart, so rates are
    /// real) as plain text on stdout, and exit.
    #[arg(long)]
    pub once: bool,
    /// TLS and tokens (docs/security.md).
    #[command(flatten)]
    pub security: SecurityArgs,
}

/// Flags of `loaderctl merge-states`.
#[derive(Debug, Clone, Args)]
pub struct MergeStatesArgs {
    /// The states of every rank (written by `consume --save-state-after`
    /// or a trainer's `state_dict()`), in any order.
    #[arg(required = true, value_name = "STATE")]
    pub states: Vec<PathBuf>,
    /// Where to write the merged state (atomically).
    #[arg(long, short, value_name = "PATH")]
    pub out: PathBuf,
}

/// Writes the merge of the states `args` names.
fn merge_states(args: &MergeStatesArgs) -> anyhow::Result<()> {
    let states = args
        .states
        .iter()
        .map(loader_client::LoaderState::load)
        .collect::<Result<Vec<_>, _>>()?;
    let merged = loader_client::LoaderState::merge(&states)?;
    merged.save(&args.out)?;
    println!(
        "merged {} states of {} ranks into {} (slowest rank at batch {})",
        states.len(),
        merged.world_size(),
        args.out.display(),
        merged.next_seq()
    );
    Ok(())
}

/// The whole `loaderctl` command line. Errors are printed as one line,
/// `loaderctl: error: <message>`, with a non-zero exit code.
pub fn main() -> ExitCode {
    let cli: Cli = match loader_process::args::parse("loaderctl", std::env::args_os()) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    // Only `run` starts workers of its own; the others stop only themselves.
    let own_workers = matches!(cli.command, Command::Run(_));
    // Each arm holds the telemetry guard to its end: dropping it flushes
    // the spans not yet exported. The hidden worker sets up its own.
    let result = match cli.command {
        Command::Worker { args } => return worker(args),
        Command::Run(args) => {
            let _telemetry = loader_process::telemetry::init("loaderctl");
            signals::watch().and_then(|()| run_command(args))
        }
        Command::Consume(args) => {
            let _telemetry = loader_process::telemetry::init("loaderctl");
            secure(&args.security).and_then(|()| signals::watch()).and_then(|()| consume::run(&args))
        }
        Command::Status(args) => {
            let _telemetry = loader_process::telemetry::init("loaderctl");
            secure(&args.security).and_then(|()| status::run(&args))
        }
        Command::Top(args) => {
            let _telemetry = loader_process::telemetry::init("loaderctl");
            secure(&args.security).and_then(|()| top::run(&args))
        }
        Command::Drain(args) => {
            let _telemetry = loader_process::telemetry::init("loaderctl");
            secure(&args.security).and_then(|()| status::drain(&args))
        }
        Command::Scale(args) => {
            let _telemetry = loader_process::telemetry::init("loaderctl");
            secure(&args.security).and_then(|()| scale::run(&args))
        }
        Command::Autoscale(args) => {
            let _telemetry = loader_process::telemetry::init("loaderctl");
            secure(&args.security).and_then(|()| scale::autoscale(&args))
        }
        Command::MergeStates(args) => merge_states(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<signals::Stopped>().is_some() => {
            let stopped = e.downcast_ref::<signals::Stopped>().copied().unwrap_or(signals::Stopped(15));
            if own_workers {
                eprintln!("loaderctl: {stopped}; workers stopped");
            } else {
                eprintln!("loaderctl: {stopped}");
            }
            ExitCode::from(stopped.exit_code())
        }
        Err(e) => {
            eprintln!("loaderctl: error: {}", one_line(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// Makes the flags (and the environment they read) what this process
/// presents as a trainer (`consume`) and as an admin (the rest).
fn secure(args: &SecurityArgs) -> anyhow::Result<()> {
    for role in [Role::Trainer, Role::Admin] {
        ClientSecurity::install(role, args.client(role)?);
    }
    Ok(())
}

fn run_command(args: RunArgs) -> anyhow::Result<()> {
    run::run(&args)
}

fn worker(args: Vec<OsString>) -> ExitCode {
    // The worker sets up its own tracing and runtime.
    loader_worker::main_with_args(std::iter::once(OsString::from("loader-worker")).chain(args))
}


fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}
