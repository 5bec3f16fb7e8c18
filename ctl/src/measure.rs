//! What `run` and `consume` share: the job built from flags, the consuming
//! loop with its measurements (throughput, first batch, client CPU time),
//! and the report printed at the end. `batch_files`: what a run writes
//! batch by batch (`--checksum`, `--dump`).

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use loader_proto::pb::{CorruptPolicy, Dtype, JobSpec};
use serde::Serialize;
use tempfile::NamedTempFile;

use super::kept::CacheReport;
use super::{DatasetArgs, MeasureArgs, OnCorruptArg, TransportArg, cpu, signals};
use loader_worker::sample_cache::SampleCache;
use loader_client::{Batch, Device, Loader, LoaderBuilder, Transport};

mod batch_files;
use batch_files::BatchFiles;

/// Windows per epoch in a generated token file (with the chosen batch size).
const GENERATED_TOKEN_BATCHES: u64 = 64;

/// How often a blocked `next()` looks for SIGTERM and SIGINT.
const SIGNAL_TICK: Duration = Duration::from_millis(50);

/// The one JSON object `--json` prints.
#[derive(Debug, Serialize)]
pub(super) struct Report {
    samples: u64,
    batches: u64,
    bytes: u64,
    seconds: f64,
    samples_per_s: f64,
    mb_per_s: f64,
    first_batch_s: f64,
    /// Worker processes started (`run` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    workers: Option<u64>,
    dataset: String,
    /// Where the batches landed (`cpu`, `cuda:N`, `host`); for a device,
    /// `mb_per_s` counts each batch once its copy completed.
    device: String,
    /// `shm` or `grpc`: what was asked for.
    transport: &'static str,
    /// Batches that actually arrived through the shared-memory ring.
    shm_batches: u64,
    /// Process CPU time (user + sys) over the consuming loop, per batch.
    client_cpu_us_per_batch: f64,
    /// The same less the embedded coordinator's threads (`run` hosts the
    /// coordinator in this process; a trainer does not): what the trainer
    /// itself spends. Equal to `client_cpu_us_per_batch` under `consume`.
    #[serde(skip_serializing_if = "Option::is_none")]
    trainer_cpu_us_per_batch: Option<f64>,
    /// CPU of the embedded coordinator's threads per batch (`run` only):
    /// what handing out the work costs.
    #[serde(skip_serializing_if = "Option::is_none")]
    coordinator_cpu_us_per_batch: Option<f64>,
    /// How long the trainer waited in `next()` for a batch, from the second
    /// batch on: median and 99th percentile, in microseconds.
    wait_p50_us: f64,
    wait_p99_us: f64,
    /// Samples per second in each epoch, when there are several: the
    /// first from just before the first `next()`, each next from the end
    /// of the one before (a resumed run's first epoch counts from where it
    /// resumed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    epochs_samples_per_s: Vec<f64>,
    /// The sample cache of `run --cache`.
    #[serde(skip_serializing_if = "Option::is_none")]
    cache: Option<CacheReport>,
}

/// Samples per second epoch by epoch.
struct EpochClock {
    batches_per_epoch: u64,
    /// Batches yielded so far, the job's count (a resumed run starts past 0).
    yielded: u64,
    /// When the current epoch's clock started, and its samples so far.
    since: Instant,
    samples: u64,
    rates: Vec<f64>,
}

impl EpochClock {
    fn new(batches_per_epoch: u64, yielded: u64, started: Instant) -> Self {
        Self { batches_per_epoch: batches_per_epoch.max(1), yielded, since: started, samples: 0, rates: Vec::new() }
    }

    /// A batch of `samples` samples arrived.
    fn batch(&mut self, samples: u64) {
        self.samples += samples;
        self.yielded += 1;
        if self.yielded.is_multiple_of(self.batches_per_epoch) {
            let now = Instant::now();
            self.rates.push(self.samples as f64 / now.duration_since(self.since).as_secs_f64().max(1e-9));
            (self.since, self.samples) = (now, 0);
        }
    }

    /// Each whole epoch's rate; none for a run of one epoch.
    fn rates(&self) -> Vec<f64> {
        if self.rates.len() > 1 { self.rates.clone() } else { Vec::new() }
    }
}

/// The `q` quantile (0..=1) of `waits`, sorted in place, in microseconds.
fn quantile_us(waits: &mut [Duration], q: f64) -> f64 {
    if waits.is_empty() {
        return 0.0;
    }
    waits.sort_unstable();
    let at = ((waits.len() - 1) as f64 * q).round() as usize;
    waits[at.min(waits.len() - 1)].as_secs_f64() * 1e6
}

impl TransportArg {
    fn name(self) -> &'static str {
        match self {
            TransportArg::Shm => "shm",
            TransportArg::Grpc => "grpc",
        }
    }

    fn shared_memory(self) -> bool {
        self == TransportArg::Shm
    }
}

/// Applies the transport, prefetch and device flags to a loader's builder.
pub(super) fn configure(builder: LoaderBuilder, args: &MeasureArgs) -> anyhow::Result<LoaderBuilder> {
    let mut builder = builder
        .prefetch(args.prefetch)
        .shared_memory(args.transport.shared_memory())
        .device(args.device)
        .device_prefetch(args.device_prefetch);
    if let Some(ring) = args.ring {
        builder = builder.ring(ring.slots, ring.slot_bytes);
    }
    Ok(match &args.metrics_listen {
        Some(addr) => builder.metrics_listen(addr.clone()),
        None => builder,
    })
}

/// Where and when `consume --save-state-after` writes the loader's state.
#[derive(Debug, Clone)]
pub(super) struct SaveState {
    /// Batches of this run after which the state is written.
    pub(super) after: u64,
    /// The state file, replaced atomically.
    pub(super) path: PathBuf,
}

/// Consumes every batch of `loader`, measuring from just before the first
/// `next()` to the last batch, then prints the report. With `save`, writes
/// the loader's state once that many batches were yielded.
pub(super) fn consume_and_report(
    mut loader: Loader,
    args: &MeasureArgs,
    dataset: &str,
    workers: Option<u64>,
    save: Option<SaveState>,
    cache: Option<&SampleCache>,
) -> anyhow::Result<()> {
    if let Some(addr) = loader.metrics_addr() {
        eprintln!("metrics {addr}");
    }
    let mut files = BatchFiles::create(args)?;
    let device = loader.device();
    announce_device(&loader);
    // A resumed loader starts part-way; the bar shows the whole job.
    let bar = progress_bar(loader.total_batches(), args.json);
    bar.set_position(loader.yielded());
    let started = Instant::now();
    save_state(&loader, save.as_ref(), 0)?;
    let mut tally = Tally::new(&loader, started);
    let step = Duration::from_secs_f64(args.step_ms / 1e3);
    while let Some((batch, asked)) = next_batch(&mut loader)? {
        tally.count(&batch, asked)?;
        files.write(&batch)?;
        train(batch, step);
        save_state(&loader, save.as_ref(), tally.batches)?;
        if !bar.is_hidden() {
            // A hidden bar still keeps its estimate: not free, per batch.
            bar.inc(1);
        }
    }
    let spent = Spent::since_first(&tally)?;
    bar.finish_and_clear();
    // Stops the workers and the coordinator (embedded); not measured.
    drop(loader);
    let report = tally.report(spent, args, dataset, workers, device, cache);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report, device);
    }
    Ok(())
}

/// The next batch and when it was asked for; None after the last. A
/// signal stops the loop here or in a wait (checked every tick);
/// returning drops the loader, which stops what it started.
fn next_batch(loader: &mut Loader) -> anyhow::Result<Option<(Batch, Instant)>> {
    signals::check()?;
    let asked = Instant::now();
    let Some(batch) = loader.next_interruptible(SIGNAL_TICK, signals::check)? else { return Ok(None) };
    Ok(Some((batch?, asked)))
}

/// The training step, the batch held meanwhile (as a trainer holds its
/// ring slot until the step is done with it); the loader keeps producing
/// into its prefetch window.
fn train(batch: Batch, step: Duration) {
    if !step.is_zero() {
        std::thread::sleep(step);
    }
    drop(batch);
}

/// Writes the loader's state once `batches` of this run were yielded, if
/// `save` asks for it then. The files already hold every batch the state
/// counts as yielded.
fn save_state(loader: &Loader, save: Option<&SaveState>, batches: u64) -> anyhow::Result<()> {
    let Some(save) = save.filter(|s| s.after == batches) else { return Ok(()) };
    loader.state().save(&save.path)?;
    // Before the first batch it is the state the run started from.
    if batches > 0 {
        tracing::info!(path = %save.path.display(), batches, "loader state saved");
    }
    Ok(())
}

/// What the consuming loop counts, batch by batch, from `started` (just
/// before the first `next()`).
struct Tally {
    started: Instant,
    samples: u64,
    batches: u64,
    bytes: u64,
    shm_batches: u64,
    /// When the first batch came, after `started`.
    first_batch: Option<Duration>,
    /// CPU of the process and of the embedded coordinator when the first
    /// batch came: client CPU is counted from there on, the steady-state
    /// cost of a batch without connecting and mapping the ring.
    cpu_from_first: Option<(Duration, Option<Duration>)>,
    /// Each wait in `next()` from the second batch on. One entry per batch:
    /// a few MB for a million batches.
    waits: Vec<Duration>,
    epochs: EpochClock,
}

impl Tally {
    fn new(loader: &Loader, started: Instant) -> Self {
        Self {
            started,
            samples: 0,
            batches: 0,
            bytes: 0,
            shm_batches: 0,
            first_batch: None,
            cpu_from_first: None,
            waits: Vec::new(),
            epochs: EpochClock::new(loader.batches_per_epoch(), loader.yielded(), started),
        }
    }

    /// Counts `batch`, asked for at `asked`; on a device, once its copy
    /// completed (the rate of the device path is that of completed copies).
    fn count(&mut self, batch: &Batch, asked: Instant) -> anyhow::Result<()> {
        if self.first_batch.is_some() {
            self.waits.push(asked.elapsed());
        }
        if self.first_batch.is_none() {
            self.first_batch = Some(self.started.elapsed());
            self.cpu_from_first = Some((cpu::process()?, coordinator_cpu()));
        }
        self.samples += batch.len() as u64;
        self.epochs.batch(batch.len() as u64);
        match batch.on_device() {
            Some(copy) => {
                copy.wait()?;
                self.bytes += copy.len() as u64;
            }
            None => self.bytes += batch.bytes().len() as u64,
        }
        self.batches += 1;
        if batch.transport() == Transport::SharedMemory {
            self.shm_batches += 1;
        }
        Ok(())
    }

    /// The report of the run, with what it `spent`.
    fn report(
        mut self,
        spent: Spent,
        args: &MeasureArgs,
        dataset: &str,
        workers: Option<u64>,
        device: Device,
        cache: Option<&SampleCache>,
    ) -> Report {
        let Spent { elapsed, cpu, coordinator } = spent;
        let seconds = elapsed.as_secs_f64().max(1e-9);
        // From the first batch on: one batch fewer than were yielded.
        let batches = self.batches;
        let per_batch = |t: Duration| t.as_secs_f64() * 1e6 / batches.saturating_sub(1).max(1) as f64;
        Report {
            samples: self.samples,
            batches,
            bytes: self.bytes,
            seconds,
            samples_per_s: self.samples as f64 / seconds,
            mb_per_s: self.bytes as f64 / 1e6 / seconds,
            first_batch_s: self.first_batch.unwrap_or(Duration::ZERO).as_secs_f64(),
            workers,
            dataset: dataset.to_owned(),
            device: device.to_string(),
            transport: args.transport.name(),
            shm_batches: self.shm_batches,
            client_cpu_us_per_batch: per_batch(cpu),
            trainer_cpu_us_per_batch: coordinator.map(|c| per_batch(cpu.saturating_sub(c))),
            coordinator_cpu_us_per_batch: coordinator.filter(|_| workers.is_some()).map(per_batch),
            wait_p50_us: quantile_us(&mut self.waits, 0.5),
            wait_p99_us: quantile_us(&mut self.waits, 0.99),
            epochs_samples_per_s: self.epochs.rates(),
            cache: cache.map(CacheReport::of),
        }
    }
}

/// The loop's wall time, and the CPU the process and the embedded
/// coordinator's threads spent from the first batch on.
struct Spent {
    elapsed: Duration,
    cpu: Duration,
    coordinator: Option<Duration>,
}

impl Spent {
    /// Read right after the last batch.
    fn since_first(tally: &Tally) -> anyhow::Result<Self> {
        let elapsed = tally.started.elapsed();
        let (cpu, coordinator) = match tally.cpu_from_first {
            Some((process, coordinator)) => (
                cpu::process()?.saturating_sub(process),
                coordinator.zip(coordinator_cpu()).map(|(from, to)| to.saturating_sub(from)),
            ),
            None => (Duration::ZERO, Some(Duration::ZERO)),
        };
        Ok(Self { elapsed, cpu, coordinator })
    }
}

/// On a GPU, says how batches get there: DMA'd from their ring slots (the
/// ring is registered with the driver) or through pinned staging buffers.
fn announce_device(loader: &Loader) {
    let device = loader.device();
    if let Device::Cuda(_) = device {
        let how = if loader.ring_registered() {
            "the ring is registered with the driver: batches are DMA'd from their slots"
        } else {
            "batches are copied through pinned staging buffers"
        };
        eprintln!("device {device}: {how}");
    }
}

/// The report as two lines for a terminal (`--json` prints it whole).
fn print_report(report: &Report, device: Device) {
    let from = report.workers.map(|w| format!(" from {w} workers")).unwrap_or_default();
    // Only `run` hosts a coordinator whose share is worth naming.
    let trainer = report
        .trainer_cpu_us_per_batch
        .filter(|_| report.workers.is_some())
        .map(|t| format!(" ({t:.0} us without the embedded coordinator)"))
        .unwrap_or_default();
    let on = if device.is_staged() { format!(", landing on {device}") } else { String::new() };
    println!(
        "{} samples in {} batches ({:.1} MB){from} in {:.2} s over {} ({} through shared memory{on})\n\
         {:.0} samples/s, {:.1} MB/s, first batch after {:.1} ms, {:.0} us of CPU per batch{trainer}",
        report.samples,
        report.batches,
        report.bytes as f64 / 1e6,
        report.seconds,
        report.transport,
        report.shm_batches,
        report.samples_per_s,
        report.mb_per_s,
        report.first_batch_s * 1e3,
        report.client_cpu_us_per_batch,
    );
    if !report.epochs_samples_per_s.is_empty() {
        let rates: Vec<String> = report.epochs_samples_per_s.iter().map(|r| format!("{r:.0}")).collect();
        println!("samples/s by epoch: {}", rates.join(", "));
    }
    if let Some(cache) = &report.cache {
        println!("{}", cache.line());
    }
}

/// CPU time the embedded coordinator's threads used so far; zero without
/// one (`consume`); None when the kernel cannot say.
fn coordinator_cpu() -> Option<Duration> {
    cpu::threads_named(loader_client::embedded::COORDINATOR_THREAD)
}

/// Drawn on stderr only when a person is watching.
fn progress_bar(total: u64, json: bool) -> ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {pos}/{len} batches ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Side of the square crops of `--dataset imagefolder`.
const STANDARD_IMAGE_SIZE: u32 = 224;

/// The report's name for the dataset of a job.
pub(super) fn dataset_kind(spec: &JobSpec) -> String {
    use loader_proto::pb::dataset_spec::Kind;
    match spec.dataset.as_ref().and_then(|d| d.kind.as_ref()) {
        Some(Kind::Synthetic(_)) => "synthetic".into(),
        Some(Kind::Tokens(_)) => "tokens".into(),
        Some(Kind::ImageFolder(_)) => "image_folder".into(),
        Some(Kind::Webdataset(_)) => "webdataset".into(),
        Some(Kind::Npy(_)) => "npy".into(),
        Some(Kind::Parquet(_)) => "parquet".into(),
        Some(Kind::Custom(c)) => format!("custom {}", c.name),
        Some(Kind::Mix(m)) => format!("mix of {}", m.sources.len()),
        None => "-".into(),
    }
}

/// The job of the flags (or of `--spec`), and the generated token file it
/// reads, if any.
pub(super) fn job_spec(
    args: &DatasetArgs,
    name: Option<&str>,
) -> anyhow::Result<(JobSpec, Option<NamedTempFile>)> {
    if let Some(path) = &args.spec {
        let mut builder = loader_job::authoring::file::parse_file(path)?;
        if let Some(name) = name {
            builder = builder.name(name);
        }
        return Ok((builder.build()?, None));
    }
    let dtype = |default: Dtype| -> anyhow::Result<Dtype> {
        match &args.dtype {
            None => Ok(default),
            Some(name) => Dtype::parse(name).ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown --dtype {name:?}; expected e.g. uint8, uint16, uint32, int64, float32"
                )
            }),
        }
    };
    let (builder, file) = match args.dataset.as_str() {
        "synthetic" => (
            loader_job::authoring::synthetic(args.samples, &parse_shape(&args.shape)?, dtype(Dtype::U8)?),
            None,
        ),
        "tokens" => {
            let dtype = dtype(Dtype::U16)?;
            let (path, file) = match &args.path {
                Some(path) => (path.clone(), None),
                None => {
                    let file = generate_tokens(args, dtype)?;
                    (file.path().to_path_buf(), Some(file))
                }
            };
            (loader_job::authoring::tokens(path, dtype, args.context_length), file)
        }
        "imagefolder" | "image_folder" => {
            let Some(root) = &args.path else {
                anyhow::bail!("--dataset imagefolder needs --path DIR (a folder of class folders of .jpg/.png images)");
            };
            let builder = loader_job::authoring::image_folder(root).transforms(loader_job::authoring::transforms::standard_train(STANDARD_IMAGE_SIZE));
            (builder, None)
        }
        other => anyhow::bail!(
            "unknown dataset kind {other:?}; expected synthetic, tokens or imagefolder (or --spec FILE for any job)"
        ),
    };
    let policy = match args.on_corrupt {
        OnCorruptArg::Fail => CorruptPolicy::Fail,
        OnCorruptArg::Skip => CorruptPolicy::Skip,
    };
    let mut builder = builder.batch_size(args.batch_size).epochs(args.epochs);
    if let Some(seed) = args.shuffle {
        builder = builder.shuffle(seed);
    }
    if policy == CorruptPolicy::Skip {
        builder = builder.on_corrupt(policy);
    }
    if let Some(name) = name {
        builder = builder.name(name);
    }
    let spec = builder.build()?;
    Ok((spec, file))
}

fn parse_shape(s: &str) -> anyhow::Result<Vec<u64>> {
    let dims: Option<Vec<u64>> = s
        .split(',')
        .map(|d| d.trim().parse().ok().filter(|&d| d > 0))
        .collect();
    dims.filter(|d| !d.is_empty()).ok_or_else(|| {
        anyhow::anyhow!(
            "invalid --shape {s:?}; expected positive comma-separated sizes like 3,224,224"
        )
    })
}

/// A generated token file that has no name any more: it lives while this
/// process holds it open, and workers started by this process (same user)
/// read it through `/proc/<pid>/fd/<n>`. For `run`, whose workers are its
/// own children: nothing is left on disk however the process ends.
pub(super) fn unlink_token_file(
    mut spec: JobSpec,
    file: Option<NamedTempFile>,
) -> anyhow::Result<(JobSpec, Option<File>)> {
    use loader_proto::pb::dataset_spec::Kind;
    use std::os::fd::AsRawFd;

    let Some(named) = file else {
        return Ok((spec, None));
    };
    let open = named.reopen().context("cannot reopen the temporary token file")?;
    // Unlinks the name; `open` keeps the contents.
    drop(named);
    let path = format!("/proc/{}/fd/{}", std::process::id(), open.as_raw_fd());
    if let Some(Kind::Tokens(t)) = spec.dataset.as_mut().and_then(|d| d.kind.as_mut()) {
        t.path = path;
    }
    Ok((spec, Some(open)))
}

/// A temporary token file of `GENERATED_TOKEN_BATCHES` batches per epoch:
/// ids cycling through a GPT-2-sized vocabulary.
fn generate_tokens(args: &DatasetArgs, dtype: Dtype) -> anyhow::Result<NamedTempFile> {
    if args.batch_size == 0 || args.context_length == 0 {
        // Let spec validation name the field; any non-empty file will do.
        let mut f = NamedTempFile::new().context("cannot create a temporary token file")?;
        f.write_all(&[0; 8])
            .context("cannot write the temporary token file")?;
        return Ok(f);
    }
    let windows = u64::from(args.batch_size).saturating_mul(GENERATED_TOKEN_BATCHES);
    let tokens = windows
        .saturating_mul(args.context_length)
        .saturating_add(1);
    let file = tempfile::Builder::new()
        .prefix("loaderctl-tokens-")
        .suffix(".bin")
        .tempfile()
        .context("cannot create a temporary token file")?;
    let mut out = BufWriter::with_capacity(1 << 20, file.as_file());
    for i in 0..tokens {
        let id = (i.wrapping_mul(2_654_435_761) >> 7) % 50_257;
        match dtype {
            Dtype::U32 => out.write_all(&(id as u32).to_le_bytes()),
            _ => out.write_all(&(id as u16).to_le_bytes()),
        }
        .with_context(|| {
            format!(
                "cannot write the temporary token file {}",
                PathBuf::from(file.path()).display()
            )
        })?;
    }
    out.flush()
        .context("cannot write the temporary token file")?;
    drop(out);
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_waits() {
        let us = Duration::from_micros;
        let mut waits: Vec<Duration> = (1..=100).rev().map(us).collect();
        assert_eq!(quantile_us(&mut waits, 0.5), 51.0);
        assert_eq!(quantile_us(&mut waits, 0.99), 99.0);
        assert_eq!(quantile_us(&mut [], 0.99), 0.0);
    }

    #[test]
    fn shapes_parse_or_say_what_is_expected() {
        assert_eq!(parse_shape("3,224, 224").expect("shape"), vec![3, 224, 224]);
        for bad in ["", "3,,4", "0", "a"] {
            let e = parse_shape(bad).expect_err(bad).to_string();
            assert!(e.starts_with("invalid --shape"), "{e}");
        }
    }
}
