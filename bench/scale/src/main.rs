//! `scale-harness`: runs the coordinator load harness (`loader_scale`)
//! against a running `loader-server` and prints one markdown table row. With
//! `--server-pid`, the coordinator's CPU time (user + system, from
//! `/proc/PID/stat`: the harness shares the machine's cores, so wall time
//! says little) and peak memory over the run are measured too.
//!
//!     scale-harness --coordinator http://127.0.0.1:7070 --workers 1000 --trainers 100 --server-pid PID
//!
//! With `--fill-journal JOBS`, it instead leaves JOBS jobs of `--trainers`
//! ranks each in the coordinator's journal, every rank halfway through its
//! epoch, and prints how many watermarks it wrote (for timing a restart);
//! with `--wait-jobs N` it waits until the coordinator serves N jobs.

use std::time::Duration;

use clap::Parser;

/// Flags of `scale-harness`.
#[derive(Debug, Parser)]
#[command(about = "Simulated workers and trainers against a real loader-server; prints one table row")]
struct Args {
    /// Coordinator URL.
    #[arg(long)]
    coordinator: String,
    /// Simulated workers.
    #[arg(long, default_value_t = 1000)]
    workers: u32,
    /// Simulated trainer ranks of the one job.
    #[arg(long, default_value_t = 100)]
    trainers: u32,
    /// Batches each rank reads.
    #[arg(long, default_value_t = 200)]
    batches: u64,
    /// Batches per second each worker reports delivered, at most.
    #[arg(long, default_value_t = 50.0)]
    rate: f64,
    /// Batches a worker may hold per rank.
    #[arg(long, default_value_t = 2)]
    window: u32,
    /// HTTP/2 connections the workers share.
    #[arg(long, default_value_t = 32)]
    channels: u32,
    /// Workers' heartbeat period in ms (default: the coordinator's).
    #[arg(long)]
    beat_ms: Option<u64>,
    /// Workers join, leave, expire and are drained during the run.
    #[arg(long)]
    churn: bool,
    /// Seconds the run may take at most.
    #[arg(long, default_value_t = 60.0)]
    limit: f64,
    /// The coordinator's process id, to measure its CPU time and memory.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Print the table's header first.
    #[arg(long)]
    header: bool,
    /// Only fill the journal with this many jobs (see the module docs).
    #[arg(long)]
    fill_journal: Option<u32>,
    /// Only wait until the coordinator serves this many jobs (a restart's
    /// replay done), at most `--limit` seconds.
    #[arg(long)]
    wait_jobs: Option<usize>,
    /// Samples per job of `--fill-journal` (batch 64).
    #[arg(long, default_value_t = 1_281_167)]
    fill_samples: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = loader_scale::Config {
        workers: args.workers,
        trainers: args.trainers,
        batches_per_trainer: args.batches,
        batch_rate: args.rate,
        window: args.window,
        channels: args.channels,
        beat: args.beat_ms.map(Duration::from_millis),
        churn: args.churn,
        limit: Duration::try_from_secs_f64(args.limit)?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    if let Some(jobs) = args.fill_journal {
        let written = runtime.block_on(loader_scale::fill_journal(&args.coordinator, jobs, args.trainers, args.fill_samples))?;
        println!("filled {jobs} jobs, {written} watermarks");
        return Ok(());
    }
    if let Some(jobs) = args.wait_jobs {
        let limit = Duration::try_from_secs_f64(args.limit)?;
        let served = runtime.block_on(loader_scale::wait_for_jobs(&args.coordinator, jobs, limit))?;
        println!("serving {served} jobs");
        return Ok(());
    }
    let cpu_before = args.server_pid.map(loader_scale::proc::cpu_seconds).transpose()?;
    let report = runtime.block_on(loader_scale::run(&args.coordinator, config))?;
    let cpu = match (args.server_pid, cpu_before) {
        (Some(pid), Some(before)) => Some(loader_scale::proc::cpu_seconds(pid)? - before),
        _ => None,
    };
    let peak_mb = args.server_pid.map(loader_scale::proc::peak_rss_mb).transpose()?;
    if args.header {
        println!("{}", loader_scale::table::HEADER);
    }
    println!("{}", loader_scale::table::row(&args.workers, args.trainers, &report, cpu, peak_mb));
    if !report.exactly_once() {
        eprintln!(
            "scale-harness: bookkeeping not exactly once: {} copies beyond the first ({} re-sent by the coordinator), {} ranks unexplained, {} missing of {}; finished: {}",
            report.duplicates, report.resent, report.unexplained, report.missing, report.total, report.finished
        );
        std::process::exit(1);
    }
    Ok(())
}
