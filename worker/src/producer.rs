//! The producer: turns tasks into batches, one batch at a time, in order.
//!
//! Production is CPU work (decode, copy, the synthetic cost knob), so it runs
//! on its own OS thread and never stalls the async runtime that serves
//! streams and heartbeats. Tasks run FIFO; each yields its seqs in increasing
//! order. Opened datasets are cached per job, so a token file is mapped once,
//! not once per task.
//!
//! A corrupt sample fails its task under the job's `fail` policy (the
//! coordinator then fails the job with the error, which names the file).
//! Under `skip` the batch goes out without it; the producer logs the path
//! at `warn` and counts it (the worker's total is in the same log line).
//!
//! A batch goes into the trainer's shared-memory ring when its task names
//! one and the ring takes it (see [`loader_ring::worker`]): the layout is computed
//! first, the thread waits for a granted slot and collates straight into it.
//! Otherwise it is collated into its own buffer and queued in the consumer's
//! gRPC outbox.

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use loader_proto::ConsumerKey;
use loader_proto::batch::{BatchError, BatchMeta};
use loader_proto::pb::{Failed, JobSpec, Task};
use loader_job::sampler::Plan;
use loader_job::spec::SpecError;
use loader_ring::worker::{Rings, Route};
use tokio::sync::Notify;

use crate::batch_spans::BatchSpans;
use crate::busy::BusyMeter;
use crate::cache_use::CacheUse;
use crate::kept_batches::{Kept, KeptBatches};
use crate::collate::{BatchRules, CollateError, Collated, Skipped, layout, make};
use crate::delivery::{Sources, Target, Written};
use crate::blobs::{BlobError, BlobFetcher};
use crate::dataset::{Dataset, DatasetError, Datasets};
use crate::meters::ConsumerMeters;
use crate::outbox::Outboxes;
use crate::window::Windows;

/// Jobs whose datasets stay open; older ones are closed first.
const DATASET_CACHE: usize = 8;

/// How long a shared stream's batch waits, in all, for slots of its
/// subscribers' rings before the rest go to their gRPC outboxes: a
/// subscriber that stops reading must not stall the others.
const COPY_PATIENCE: Duration = Duration::from_millis(20);

/// Handle on the producer thread.
#[derive(Debug, Clone)]
pub(crate) struct Producer {
    shared: Arc<Shared>,
    /// Set when the thread has ended, its datasets closed.
    ended: Arc<(Mutex<bool>, Condvar)>,
}

#[derive(Debug)]
struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the thread when a task arrives or it must stop.
    ready: Condvar,
    /// Where finished batches go over gRPC.
    outboxes: Arc<Outboxes>,
    /// Trainers' shared-memory rings, for tasks that name one.
    rings: Arc<Rings>,
    /// Where each job's window is sized, from its batch bytes.
    windows: Arc<Windows>,
    /// Memory the batches this worker holds may take (see `crate::budget`).
    budget: u64,
    /// Copy of `Queue::generation`, readable without the queue lock by a
    /// thread waiting for a ring slot.
    abandon: AtomicU64,
    /// Wakes the coordinator link when a failure waits to be reported, or
    /// when the thread ran out of tasks (the link holds back delivery
    /// reports while there is work left; see `crate::link`).
    report: Notify,
    /// The datasets this worker can open (built-in and registered custom).
    datasets: Datasets,
    /// Makes a job's blobs local before its dataset opens; None in tests
    /// without a coordinator (a job with blobs then fails).
    blobs: Option<BlobFetcher>,
    /// Corrupt samples skipped by this worker since it started, for the log.
    skipped: AtomicU64,
    /// How much of the wall time this thread spends making batches, read by
    /// the link for each heartbeat.
    busy_meter: BusyMeter,
    /// Its sample cache use per job, for the link's heartbeats.
    cache_use: CacheUse,
    /// Shared streams' batches kept for subscribers that trail.
    kept: Mutex<KeptBatches>,
    /// Extra time every batch takes, in nanoseconds: a test knob for a
    /// worker on a slow disk or a noisy host (`--slow-batch-ms`); 0 in
    /// production.
    slow_batch_ns: AtomicU64,
}

#[derive(Debug, Default)]
struct Queue {
    /// Tasks with the time they arrived (a ring that closes later drops
    /// them).
    tasks: VecDeque<(Task, Instant)>,
    /// The thread is producing a task right now.
    busy: bool,
    /// Consumers the task being produced delivers to (its consumer, then
    /// its copies on a shared stream), so that ending them drops their part
    /// of it, and the task once none is left.
    running: Vec<ConsumerKey>,
    /// Of them, those that ended while it ran: nothing more goes to them.
    gone: Vec<ConsumerKey>,
    /// Bumped by `clear`: a task started under an older generation is
    /// abandoned and its batches are not queued.
    generation: u64,
    stopped: bool,
    /// Failures not yet reported to the coordinator.
    failed: Vec<Failed>,
    /// Consumers that ended since the thread last looked: a job's dataset
    /// closes once every consumer it served ended (see [`DatasetCache`]).
    ended: Vec<ConsumerKey>,
}

impl Producer {
    /// Starts the producer thread.
    pub(crate) fn spawn(
        outboxes: Arc<Outboxes>,
        rings: Arc<Rings>,
        windows: Arc<Windows>,
        budget: u64,
        datasets: Datasets,
        blobs: Option<BlobFetcher>,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            outboxes,
            rings,
            windows,
            budget,
            abandon: AtomicU64::new(0),
            report: Notify::new(),
            datasets,
            blobs,
            skipped: AtomicU64::new(0),
            busy_meter: BusyMeter::new(Instant::now()),
            cache_use: CacheUse::default(),
            kept: Mutex::new(KeptBatches::new(crate::config::DEFAULT_KEEP_SHARED)),
            slow_batch_ns: AtomicU64::new(0),
        });
        let thread = Arc::clone(&shared);
        let ended: Arc<(Mutex<bool>, Condvar)> = Arc::default();
        let end = Arc::clone(&ended);
        std::thread::Builder::new().name("loader-producer".into()).spawn(move || {
            thread.run();
            *end.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
            end.1.notify_all();
        })?;
        Ok(Self { shared, ended })
    }

    /// Keeps at most `bytes` of shared streams' batches for subscribers
    /// that trail (`crate::kept_batches`).
    pub(crate) fn keep_shared(&self, bytes: u64) {
        *self.shared.kept() = KeptBatches::new(bytes);
    }

    /// Lets go of kept batches past their time, and says how many bytes
    /// stay kept (for each heartbeat: an idle worker holds no memory for
    /// long).
    pub(crate) fn let_go_kept(&self) -> u64 {
        let mut kept = self.shared.kept();
        kept.let_go(Instant::now());
        kept.held()
    }

    /// Makes every batch take `extra` longer (a test knob: a straggler).
    pub(crate) fn slow_down(&self, extra: std::time::Duration) {
        let ns = u64::try_from(extra.as_nanos()).unwrap_or(u64::MAX);
        self.shared.slow_batch_ns.store(ns, Ordering::Relaxed);
    }

    /// The fraction of the time since the previous call that the thread
    /// spent making batches (see `crate::busy`).
    pub(crate) fn take_busy(&self, at: Instant) -> f64 {
        self.shared.busy_meter.take(at)
    }

    /// This worker's sample cache use per job since it started.
    pub(crate) fn cache_use(&self) -> Vec<loader_proto::pb::JobCacheUse> {
        self.shared.cache_use.report()
    }

    /// Queues a task behind the ones already queued, except ahead of queued
    /// tasks of the same consumer with later batches: a task with lower
    /// sequence numbers arriving late was taken back from a worker that
    /// died, and the trainer's in-order stream is waiting for it.
    pub(crate) fn submit(&self, task: Task) {
        let mut q = self.shared.lock();
        if q.stopped {
            return;
        }
        let at = insertion_point(q.tasks.iter().map(|(queued, _)| queued), &task);
        q.tasks.insert(at, (task, Instant::now()));
        self.shared.ready.notify_one();
    }

    /// True when no task is queued or running.
    pub(crate) fn is_idle(&self) -> bool {
        let q = self.shared.lock();
        q.tasks.is_empty() && !q.busy
    }

    /// True when failures wait to be reported.
    pub(crate) fn has_failures(&self) -> bool {
        !self.shared.lock().failed.is_empty()
    }

    /// Takes the failures to report.
    pub(crate) fn take_failed(&self) -> Vec<Failed> {
        std::mem::take(&mut self.shared.lock().failed)
    }

    /// Puts back failures a failed heartbeat could not report.
    pub(crate) fn restore_failed(&self, mut failed: Vec<Failed>) {
        let mut q = self.shared.lock();
        failed.append(&mut q.failed);
        q.failed = failed;
    }

    /// Waits until, since the last call, a failure was recorded or the
    /// thread finished its last queued task.
    pub(crate) async fn report_wanted(&self) {
        self.shared.report.notified().await;
    }

    /// Abandons every queued and running task and drops undelivered batches:
    /// the coordinator has handed them to other workers.
    pub(crate) fn clear(&self) {
        let mut q = self.shared.lock();
        self.shared.abandon_current(&mut q);
        q.tasks.clear();
        // Under the queue lock, so a batch of the abandoned task cannot slip
        // into an outbox after this (see `Shared::produce`).
        self.shared.outboxes.drop_batches();
        drop(q);
        self.shared.rings.interrupt();
    }

    /// Drops everything held for one consumer that nobody will fetch from
    /// (the coordinator took its batches back): its queued tasks, the task
    /// being produced if it is one of them, and its undelivered batches.
    pub(crate) fn drop_consumer(&self, key: ConsumerKey) -> Dropped {
        let mut q = self.shared.lock();
        let before = q.tasks.len();
        q.tasks.retain_mut(|(task, _)| !without(task, key));
        let mut tasks = before - q.tasks.len();
        let running = q.running.contains(&key) && !q.gone.contains(&key);
        if running {
            q.gone.push(key);
        }
        let abandon = running && q.running.iter().all(|k| q.gone.contains(k));
        if abandon {
            self.shared.abandon_current(&mut q);
            tasks += 1;
        }
        // Under the queue lock, so a batch of the abandoned task cannot slip
        // into the outbox after this (see `Shared::produce`).
        let batches = self.shared.outboxes.drop_consumer(key);
        q.ended.push(key);
        self.shared.ready.notify_all();
        drop(q);
        if abandon {
            self.shared.rings.interrupt();
        }
        Dropped { batches, tasks }
    }

    /// Waits, at most `within`, for the thread to end after [`stop`]
    /// (Self::stop): it closes its datasets as it ends, and what they keep
    /// on disk for the machine (`loader_storage`'s shared piles) goes with
    /// the last worker to close them, which a process that exits first
    /// would leave behind. False when it did not end in time.
    pub(crate) fn wait_ended(&self, within: Duration) -> bool {
        let (ended, changed) = &*self.ended;
        let guard = ended.lock().unwrap_or_else(|p| p.into_inner());
        let (guard, _) = changed.wait_timeout_while(guard, within, |e| !*e).unwrap_or_else(|p| p.into_inner());
        *guard
    }

    /// Stops the thread after its current batch and drops every task.
    pub(crate) fn stop(&self) {
        let mut q = self.shared.lock();
        q.stopped = true;
        self.shared.abandon_current(&mut q);
        q.tasks.clear();
        self.shared.ready.notify_all();
        drop(q);
        self.shared.rings.interrupt();
    }
}

/// What [`Producer::drop_consumer`] dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dropped {
    /// Produced batches that were waiting for a `Fetch` stream.
    pub(crate) batches: usize,
    /// Tasks queued or being produced.
    pub(crate) tasks: usize,
}

/// The consumer a task produces for.
fn task_key(task: &Task) -> ConsumerKey {
    (task.job.as_ref().map_or(0, |j| j.job_id), task.consumer)
}

/// Every consumer a task delivers to, with the ring socket its task names
/// (empty: none): its consumer, then its copies (a shared stream's other
/// subscribers).
fn deliveries(task: &Task) -> impl Iterator<Item = (ConsumerKey, &str)> {
    let job_id = task_key(task).0;
    std::iter::once((task_key(task), task.ring_socket.as_str()))
        .chain(task.copies.iter().map(move |c| ((job_id, c.consumer), c.ring_socket.as_str())))
}

/// Takes consumer `key` out of a queued task's deliveries (a copy that
/// goes first takes its place); true when nobody is left to deliver to.
fn without(task: &mut Task, key: ConsumerKey) -> bool {
    if task_key(task).0 != key.0 {
        return false;
    }
    task.copies.retain(|c| c.consumer != key.1);
    if task.consumer != key.1 {
        return false;
    }
    if task.copies.is_empty() {
        return true;
    }
    let first = task.copies.remove(0);
    task.consumer = first.consumer;
    task.ring_socket = first.ring_socket;
    // Their spans were the consumer's that left.
    task.traceparents.clear();
    false
}

/// Where `task` goes in the queue: before the first queued task of the same
/// consumer with later batches, else at the end.
fn insertion_point<'a>(queued: impl Iterator<Item = &'a Task>, task: &Task) -> usize {
    let key = task_key(task);
    let mut len = 0;
    for (i, q) in queued.enumerate() {
        if task_key(q) == key && q.start_seq > task.start_seq {
            return i;
        }
        len = i + 1;
    }
    len
}

/// Why a task failed. Each message is one line, for the coordinator and
/// the trainers (it travels as `Failed.error`).
#[derive(Debug, thiserror::Error)]
enum TaskError {
    /// The task names no job.
    #[error("task carries no job")]
    NoJob,
    /// The task's job has no spec.
    #[error("job carries no spec")]
    NoSpec,
    /// The spec cannot be planned.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The task names a consumer the job does not have.
    #[error("consumer {consumer} is out of range for {consumers} consumers")]
    ConsumerOutOfRange {
        /// The consumer named.
        consumer: u32,
        /// Consumers of the job.
        consumers: u32,
    },
    /// The task names seqs the job does not have.
    #[error("seqs {start}..{end} are out of range for batches {first}..{total}")]
    SeqsOutOfRange {
        /// First seq of the task.
        start: u64,
        /// End of the task's seqs (exclusive).
        end: u64,
        /// The job's first batch (past 0 for a resumed job).
        first: u64,
        /// Batches of the job.
        total: u64,
    },
    /// The dataset could not be opened.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// A blob of the job could not be made local.
    #[error(transparent)]
    Blob(#[from] BlobError),
    /// The job has blobs and this producer cannot fetch any.
    #[error("the job references blobs and this worker has no coordinator to fetch them from")]
    NoBlobFetcher,
    /// The dataset is not the one the job was planned for.
    #[error("dataset holds {held} samples, the job was planned for {planned}")]
    SampleCount {
        /// Samples in the dataset.
        held: u64,
        /// Samples the plan counts.
        planned: u64,
    },
    /// A full batch of the job cannot be laid out.
    #[error("job {job_id}: {source}")]
    Layout {
        /// The job.
        job_id: u64,
        /// Why the layout failed.
        source: BatchError,
    },
    /// The job's batches do not fit this worker's memory budget; the
    /// message is `crate::budget::refuse`'s.
    #[error("{0}")]
    OverBudget(String),
    /// One batch could not be built.
    #[error("job {job_id} batch {seq}: {source}")]
    Batch {
        /// The job.
        job_id: u64,
        /// The batch.
        seq: u64,
        /// Why it could not be built.
        source: CollateError,
    },
    /// Producing the task panicked.
    #[error("the worker panicked while producing this task")]
    Panicked,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn kept(&self) -> MutexGuard<'_, KeptBatches> {
        self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Abandons the running task. The caller then wakes ring waits, outside
    /// the queue lock (`Rings` locks are never taken inside it).
    fn abandon_current(&self, q: &mut Queue) {
        q.generation += 1;
        self.abandon.store(q.generation, Ordering::SeqCst);
    }

    fn run(&self) {
        let mut cache = DatasetCache::default();
        loop {
            let ((task, submitted), generation) = {
                let mut q = self.lock();
                loop {
                    if q.stopped {
                        return;
                    }
                    if !q.ended.is_empty() {
                        let ended = std::mem::take(&mut q.ended);
                        drop(q);
                        cache.ended(&ended);
                        q = self.lock();
                        continue;
                    }
                    // A task this worker kept the batches of goes first:
                    // serving it takes a copy, and its subscriber trails
                    // the others already.
                    let kept = self.kept();
                    let first = q.tasks.iter().position(|(t, _)| {
                        t.rank.is_some_and(|rank| kept.has((t.job.as_ref().map_or(0, |j| j.job_id), rank, t.start_seq)))
                    });
                    drop(kept);
                    if let Some(task) = q.tasks.remove(first.unwrap_or(0)) {
                        q.busy = true;
                        q.running = deliveries(&task.0).map(|(key, _)| key).collect();
                        q.gone.clear();
                        break (task, q.generation);
                    }
                    q = self.ready.wait(q).unwrap_or_else(|poisoned| poisoned.into_inner());
                }
            };
            let mark = CacheUse::mark();
            let outcome = catch_unwind(AssertUnwindSafe(|| self.produce(&task, submitted, generation, &mut cache)))
                .unwrap_or(Err(TaskError::Panicked));
            self.cache_use.credit(task.job.as_ref().map_or(0, |j| j.job_id), mark);
            let mut q = self.lock();
            q.busy = false;
            q.running.clear();
            q.gone.clear();
            let mut report = q.tasks.is_empty();
            if let Err(error) = outcome
                && q.generation == generation
            {
                let job_id = task.job.as_ref().map_or(0, |j| j.job_id);
                tracing::warn!(job = job_id, consumer = task.consumer, "task failed: {error}");
                q.failed.push(Failed {
                    job_id,
                    consumer: task.consumer,
                    start_seq: task.start_seq,
                    end_seq: task.end_seq,
                    error: error.to_string(),
                });
                report = true;
            }
            drop(q);
            if report {
                self.report.notify_one();
            }
        }
    }

    /// Produces every batch of `task`, stopping early if it was abandoned or
    /// its trainer left.
    fn produce(
        &self,
        task: &Task,
        submitted: Instant,
        generation: u64,
        cache: &mut DatasetCache,
    ) -> Result<(), TaskError> {
        let job = task.job.as_ref().ok_or(TaskError::NoJob)?;
        let spec = job.spec.as_ref().ok_or(TaskError::NoSpec)?;
        let plan = loader_job::spec::plan(spec)?;
        check_range(task, &plan)?;
        let dataset = cache.open(job.job_id, spec, &self.datasets, self.blobs.as_ref())?;
        cache.serves(job.job_id, deliveries(task).map(|(key, _)| key.1));
        let rules = BatchRules { seed: plan.seed, on_corrupt: loader_job::spec::corrupt_policy(spec) };
        if dataset.len() != plan.num_samples {
            return Err(TaskError::SampleCount { held: dataset.len(), planned: plan.num_samples });
        }
        // A batch that cannot fit fails the task before anything is
        // allocated: the worker keeps serving every other job.
        let full = layout(&*dataset, usize::try_from(plan.batch_size).unwrap_or(usize::MAX))
            .map_err(|source| TaskError::Layout { job_id: job.job_id, source })?;
        let batch_bytes = full.total_len() as u64;
        if let Some(refused) = crate::budget::refuse(job.job_id, batch_bytes, self.windows.at_least(), self.budget) {
            return Err(TaskError::OverBudget(refused));
        }
        // The window this worker holds for the job follows its batch bytes
        // and how long a batch takes to make (the coordinator learns it from
        // the next heartbeat).
        self.windows.learn_bytes(job.job_id, batch_bytes);
        let mut timing = BatchTiming::default();
        // On a shared stream the task's consumer is a subscriber of `rank`.
        let rank = task.rank.unwrap_or(task.consumer);
        let key = (job.job_id, task.consumer);
        let meters = self.outboxes.meters().consumer(key);
        let ring = Some(Path::new(&task.ring_socket)).filter(|p| !p.as_os_str().is_empty());
        let abandoned = || self.abandon.load(Ordering::SeqCst) != generation;
        let failed = |seq: u64, source: CollateError| TaskError::Batch { job_id: job.job_id, seq, source };
        for seq in task.start_seq..task.end_seq {
            if abandoned() {
                return Ok(());
            }
            let slow = self.slow_batch_ns.load(Ordering::Relaxed);
            if slow > 0 {
                std::thread::sleep(std::time::Duration::from_nanos(slow));
            }
            if dataset.fetches_ahead() {
                let next = crate::fetch_ahead::upcoming(task, seq, self.lock().tasks.iter().map(|(t, _)| t));
                crate::fetch_ahead::hint(&*dataset, &plan, &next);
            }
            let (epoch, _) = plan.locate(seq);
            let meta = BatchMeta { job_id: job.job_id, epoch, consumer: rank, seq };
            let indices = plan.batch_indices(rank, seq);
            let spans = BatchSpans::start(task, job.job_id, seq);
            // A shared stream's batch this worker made before, for the
            // subscribers ahead of this one: the same bytes, made no more.
            let kept_key = (job.job_id, rank, seq);
            // The kept lock goes before the batch is handed over: a wait for
            // a ring slot under it would hold up the link's heartbeat
            // (`Producer::let_go_kept`).
            let kept = task.rank.and_then(|_| self.kept().get(kept_key, Instant::now()));
            if let Some(kept) = kept {
                crate::meters::kept_served(job.job_id);
                if !self.fan_out(task, &kept.bytes, seq, kept.samples, &spans, submitted, generation, &abandoned) {
                    return Ok(());
                }
                continue;
            }
            // A batch made whole (a Python `collate_fn`) is made first: its
            // size, and so where it fits, is known only then.
            let mut made = None;
            let mut making = Duration::ZERO;
            let layout = if dataset.makes_whole_batches() {
                let _busy = self.busy_meter.spell(Instant::now());
                let (batch, layout, read) = spans
                    .produce()
                    .in_scope(|| make(&*dataset, &meta, &indices, rules))
                    .map_err(|e| failed(seq, e))?;
                made = Some((batch, read));
                making = read;
                layout
            } else {
                layout(&*dataset, indices.len()).map_err(|e| failed(seq, e.into()))?
            };
            if task.rank.is_some() {
                // A shared stream's batch: made once into a buffer, then
                // copied to every subscriber of the task.
                let started = Instant::now();
                let _busy = self.busy_meter.spell(started);
                let sources = Sources { dataset: &*dataset, layout: &layout, meta: &meta, indices: &indices, rules, made };
                let (batch, collated) = sources.into_bytes(&spans).map_err(|e| failed(seq, e))?;
                self.made_batch(&spans, &mut timing, &meters, &meta, indices.len(), started.elapsed() + making, &collated);
                let samples = held(&indices, &collated.skipped);
                if task.keep {
                    self.kept().keep(kept_key, Kept { bytes: batch.clone(), samples }, Instant::now());
                }
                if !self.fan_out(task, &batch, seq, samples, &spans, submitted, generation, &abandoned) {
                    return Ok(());
                }
                continue;
            }
            let Some(target) = self.target(ring, key, submitted, layout.total_len(), &abandoned, &meters) else {
                return Ok(());
            };
            let started = Instant::now();
            let _busy = self.busy_meter.spell(started);
            let sources = Sources { dataset: &*dataset, layout: &layout, meta: &meta, indices: &indices, rules, made };
            let (written, collated) = target.write(sources, &spans, started).map_err(|e| failed(seq, e))?;
            let took = started.elapsed() + making;
            self.made_batch(&spans, &mut timing, &meters, &meta, indices.len(), took, &collated);
            let q = self.lock();
            if q.generation != generation {
                return Ok(());
            }
            written.hand_over(key, seq, held(&indices, &collated.skipped), &spans, &meters, &self.outboxes);
        }
        Ok(())
    }

    /// Hands a shared stream's batch `seq` (`batch`, holding `samples`
    /// samples) to each consumer of `task` still there: into a slot of its
    /// ring when the task names one that grants a slot within
    /// [`COPY_PATIENCE`], else into its gRPC outbox, so that no subscriber
    /// holds up the others for long. A task for one subscriber (no copies)
    /// waits for its ring as any task does. False when the task was
    /// abandoned.
    #[allow(clippy::too_many_arguments)]
    fn fan_out(
        &self,
        task: &Task,
        batch: &bytes::Bytes,
        seq: u64,
        samples: u64,
        spans: &BatchSpans,
        submitted: Instant,
        generation: u64,
        abandoned: &dyn Fn() -> bool,
    ) -> bool {
        // A batch for one subscriber holds up nobody else: it waits for
        // its ring like any other task's batch (a trailing subscriber
        // served from kept batches would else read them over gRPC).
        let deadline = (!task.copies.is_empty()).then(|| Instant::now() + COPY_PATIENCE);
        let mut written = Vec::new();
        for (key, ring) in deliveries(task) {
            if self.lock().gone.contains(&key) {
                continue;
            }
            let meters = self.outboxes.meters().consumer(key);
            let route = match ring {
                "" => Route::Grpc,
                path => {
                    let path = Path::new(path);
                    self.rings.acquire_until(path, key, submitted, batch.len(), abandoned, &meters.blocked_shm, deadline)
                }
            };
            let copy = match route {
                Route::Slot(lease) => Written::copied_into(lease, batch).unwrap_or_else(|| Written::Grpc(batch.clone())),
                Route::Grpc => Written::Grpc(batch.clone()),
                Route::Abandoned => return false,
                // Its trainer left the ring: nobody takes it there.
                Route::Drop => continue,
            };
            written.push((key, copy, meters));
        }
        let q = self.lock();
        if q.generation != generation {
            return false;
        }
        let mut left = Vec::new();
        for (key, copy, meters) in written {
            if q.gone.contains(&key) {
                left.push(copy);
            } else {
                copy.hand_over(key, seq, samples, spans, &meters, &self.outboxes);
            }
        }
        drop(q);
        // Slots of consumers that ended meanwhile go back, outside the lock.
        drop(left);
        true
    }

    /// Where the next batch of `key` (`len` bytes, from a task submitted
    /// at `submitted`) goes: a slot of the ring at `ring`, when the task
    /// names one and it takes the batch, else the gRPC outbox. `None`: the
    /// batch goes nowhere (the task was abandoned, or its trainer left the
    /// ring after the task came, and its batches have no taker).
    fn target(
        &self,
        ring: Option<&Path>,
        key: ConsumerKey,
        submitted: Instant,
        len: usize,
        abandoned: &dyn Fn() -> bool,
        meters: &ConsumerMeters,
    ) -> Option<Target> {
        let Some(path) = ring else { return Some(Target::Grpc) };
        let asked = Instant::now();
        match self.rings.acquire(path, key, submitted, len, abandoned, &meters.blocked_shm) {
            Route::Slot(lease) => Some(Target::Slot { lease, asked }),
            Route::Grpc => Some(Target::Grpc),
            Route::Abandoned => None,
            Route::Drop => {
                tracing::debug!(job = key.0, consumer = key.1, "dropping the rest of a task: its trainer left");
                None
            }
        }
    }
}

impl Shared {
    /// What every batch made goes through, whichever way it is then
    /// delivered (a ring slot or the gRPC outbox): its span, the task's
    /// timing (the job's window learns from it), the consumer's meters and
    /// the log of the samples it left out. `took`: making it, without any
    /// wait for a ring slot.
    #[allow(clippy::too_many_arguments)]
    fn made_batch(
        &self,
        spans: &BatchSpans,
        timing: &mut BatchTiming,
        meters: &ConsumerMeters,
        meta: &BatchMeta,
        samples: usize,
        took: Duration,
        collated: &Collated,
    ) {
        spans.made(samples, collated);
        timing.made(took, &self.windows, meta.job_id);
        meters.made(took, collated.read);
        self.log_skipped(meta.job_id, meta.seq, &collated.skipped);
        meters.skipped(collated.skipped.len());
    }

    /// Logs each skipped sample with its path, and counts it.
    fn log_skipped(&self, job_id: u64, seq: u64, skipped: &[Skipped]) {
        for s in skipped {
            let total = self.skipped.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(
                job = job_id,
                batch = seq,
                index = s.index,
                skipped_total = total,
                "skipped {} (on_corrupt: skip)",
                s.error
            );
        }
    }
}

/// How long the batches of one task took to make (collate only: not the
/// wait for a ring slot), told to [`Windows`] after the first batch and then
/// every `EVERY` batches, so a new job's window opens after one batch.
#[derive(Debug, Default)]
struct BatchTiming {
    /// Time and batches since the last report.
    spent: std::time::Duration,
    batches: u32,
    /// A first report was made.
    reported: bool,
}

impl BatchTiming {
    const EVERY: u32 = 16;

    fn made(&mut self, took: std::time::Duration, windows: &Windows, job_id: u64) {
        self.spent += took;
        self.batches += 1;
        if !self.reported || self.batches >= Self::EVERY {
            windows.learn_time(job_id, self.spent / self.batches);
            self.reported = true;
            self.spent = std::time::Duration::ZERO;
            self.batches = 0;
        }
    }
}

/// Samples a batch of `indices` holds once `skipped` were left out.
fn held(indices: &[u64], skipped: &[Skipped]) -> u64 {
    indices.len().saturating_sub(skipped.len()) as u64
}

/// Rejects a task that names seqs or a consumer the job does not have, so a
/// confused coordinator cannot make the worker produce garbage.
fn check_range(task: &Task, plan: &Plan) -> Result<(), TaskError> {
    let rank = task.rank.unwrap_or(task.consumer);
    if rank >= plan.consumers {
        return Err(TaskError::ConsumerOutOfRange { consumer: rank, consumers: plan.consumers });
    }
    let total = plan.total_batches();
    // A resumed job has no batches before its first.
    if task.start_seq >= task.end_seq || task.end_seq > total || task.start_seq < plan.first_seq() {
        return Err(TaskError::SeqsOutOfRange { start: task.start_seq, end: task.end_seq, first: plan.first_seq(), total });
    }
    Ok(())
}

/// Open datasets of recent jobs. A job's dataset closes when every
/// consumer this worker served it for ended (its trainers finished or
/// left), or when more recent jobs push it out: what it holds open (files,
/// mappings, its kept frames) goes with it.
#[derive(Debug, Default)]
struct DatasetCache {
    open: HashMap<u64, (Arc<dyn Dataset>, u64)>,
    /// Use counter, for evicting the least recently used job.
    clock: u64,
    /// The consumers each open job's tasks were for, until they end.
    consumers: HashMap<u64, std::collections::HashSet<u32>>,
}

impl DatasetCache {
    /// Notes that `job_id`'s dataset serves `consumers`.
    fn serves(&mut self, job_id: u64, consumers: impl Iterator<Item = u32>) {
        self.consumers.entry(job_id).or_default().extend(consumers);
    }

    /// Closes the datasets whose consumers all ended. A consumer that
    /// comes back, or another rank, opens its job's dataset again.
    fn ended(&mut self, ended: &[ConsumerKey]) {
        for &(job_id, consumer) in ended {
            let Some(left) = self.consumers.get_mut(&job_id) else { continue };
            left.remove(&consumer);
            if left.is_empty() {
                self.consumers.remove(&job_id);
                self.open.remove(&job_id);
                tracing::debug!(job = job_id, "dataset closed: every consumer it served ended");
            }
        }
    }

    fn open(
        &mut self,
        job_id: u64,
        spec: &JobSpec,
        datasets: &Datasets,
        blobs: Option<&BlobFetcher>,
    ) -> Result<Arc<dyn Dataset>, TaskError> {
        self.clock += 1;
        if let Some((ds, used)) = self.open.get_mut(&job_id) {
            *used = self.clock;
            return Ok(Arc::clone(ds));
        }
        // Failures are not cached: a file that appears later is picked up by
        // the next task.
        let ds = if spec.blobs.is_empty() {
            datasets.open(spec)?
        } else {
            // The blobs stay open until the dataset has read them.
            let local = blobs.ok_or(TaskError::NoBlobFetcher)?.localize(spec)?;
            datasets.open(&local.apply(spec))?
        };
        if self.open.len() >= DATASET_CACHE
            && let Some(oldest) = self.open.iter().min_by_key(|(_, (_, used))| *used).map(|(id, _)| *id)
        {
            self.open.remove(&oldest);
            self.consumers.remove(&oldest);
        }
        self.open.insert(job_id, (Arc::clone(&ds), self.clock));
        Ok(ds)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use loader_proto::batch::BatchView;
    use loader_proto::pb::{self, DatasetSpec, Dtype, Job, JobSpec, SyntheticSpec, TokensSpec, dataset_spec::Kind};

    use super::*;

    pub(crate) fn job(job_id: u64, kind: Kind) -> Job {
        Job {
            job_id,
            spec: Some(JobSpec {
                dataset: Some(DatasetSpec { kind: Some(kind) }),
                batch_size: 4,
                epochs: 2,
                consumers: 2,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub(crate) fn synthetic(job_id: u64) -> Job {
        job(job_id, Kind::Synthetic(SyntheticSpec { num_samples: 10, shape: vec![3], dtype: Dtype::U8 as i32, cost_ns: 0, wait_ns_by_epoch: Vec::new() }))
    }

    /// A producer whose ring connections run on the test's runtime.
    pub(crate) fn spawn(outboxes: &Arc<Outboxes>) -> Producer {
        let rings = Rings::new(outboxes.clone(), "http://worker.test:1".into(), tokio::runtime::Handle::current());
        Producer::spawn(Arc::clone(outboxes), rings, Windows::new(8), 1 << 30, Datasets::new(), None).expect("spawn")
    }

    /// Waits (bounded) until the producer has worked through its queue.
    pub(crate) fn settle(p: &Producer) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !p.is_idle() {
            assert!(std::time::Instant::now() < deadline, "producer did not finish");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[tokio::test]
    async fn tasks_become_ordered_batches_and_failures_become_reports() {
        let outboxes = Outboxes::new();
        let p = spawn(&outboxes);
        // Consumer 1 of 2: 5 samples per epoch -> 2 batches per epoch, 4 in all.
        p.submit(Task { job: Some(synthetic(1)), consumer: 1, start_seq: 0, end_seq: 3, ring_socket: String::new(), ..Default::default() });
        let missing = "/nonexistent/loader-test/tokens.bin";
        let tokens = Kind::Tokens(TokensSpec { path: missing.into(), dtype: Dtype::U16 as i32, context_length: 4, num_tokens: 100 });
        p.submit(Task { job: Some(job(2, tokens)), consumer: 0, start_seq: 0, end_seq: 1, ring_socket: String::new(), ..Default::default() });
        p.submit(Task { job: Some(synthetic(1)), consumer: 1, start_seq: 3, end_seq: 9, ring_socket: String::new(), ..Default::default() });
        p.submit(Task { job: Some(synthetic(1)), consumer: 1, start_seq: 3, end_seq: 4, ring_socket: String::new(), ..Default::default() });
        settle(&p);

        let failed = p.take_failed();
        let errors: Vec<&str> = failed.iter().map(|f| f.error.as_str()).collect();
        assert_eq!(
            errors,
            vec![
                format!("tokens dataset: cannot open {missing}: No such file or directory (os error 2)").as_str(),
                "seqs 3..9 are out of range for batches 0..4",
            ]
        );
        assert_eq!((failed[0].job_id, failed[0].consumer, failed[0].start_seq, failed[0].end_seq), (2, 0, 0, 1));

        let attachment = outboxes.attach((1, 1), 1, 100);
        let plan = loader_job::spec::plan(synthetic(1).spec.as_ref().expect("spec")).expect("plan");
        for seq in 0..4 {
            let batch = attachment.next().await.expect("batch").data;
            let view = BatchView::parse(&batch).expect("parse");
            let h = view.header();
            assert_eq!((h.meta.job_id, h.meta.consumer, h.meta.seq), (1, 1, seq));
            assert_eq!(h.meta.epoch, plan.locate(seq).0);
            assert_eq!(h.indices, plan.batch_indices(1, seq));
        }
        assert!(outboxes.is_empty());
        p.stop();
    }

    /// The coordinator link holds back delivery reports while the producer
    /// has work; running out must wake it, or the last deliveries of a task
    /// would wait for the next tick.
    #[tokio::test]
    async fn running_out_of_tasks_wakes_the_link() {
        let outboxes = Outboxes::new();
        let p = spawn(&outboxes);
        p.submit(Task { job: Some(synthetic(1)), consumer: 1, start_seq: 0, end_seq: 2, ring_socket: String::new(), ..Default::default() });
        tokio::time::timeout(Duration::from_secs(20), p.report_wanted()).await.expect("woken when the queue ran out");
        settle(&p);
        assert!(!p.has_failures(), "a wake-up, not a failure");
        p.stop();
    }

    #[test]
    fn a_requeued_task_goes_before_later_tasks_of_its_consumer_only() {
        let task = |job_id: u64, consumer: u32, start_seq: u64| Task {
            job: Some(synthetic(job_id)),
            consumer,
            start_seq,
            end_seq: start_seq + 2,
            ring_socket: String::new(),
            ..Default::default()
        };
        let queued = [task(1, 0, 10), task(1, 1, 2), task(1, 0, 12), task(2, 0, 0)];
        assert_eq!(insertion_point(queued.iter(), &task(1, 0, 4)), 0);
        assert_eq!(insertion_point(queued.iter(), &task(1, 1, 0)), 1);
        assert_eq!(insertion_point(queued.iter(), &task(1, 0, 14)), 4);
        assert_eq!(insertion_point(queued.iter(), &task(3, 0, 0)), 4);
        assert_eq!(insertion_point([].iter(), &task(1, 0, 0)), 0);
    }

    #[tokio::test]
    async fn dropping_a_consumer_leaves_the_others() {
        let outboxes = Outboxes::new();
        let p = spawn(&outboxes);
        let task = |consumer: u32, start_seq: u64| Task {
            job: Some(synthetic(1)),
            consumer,
            start_seq,
            end_seq: start_seq + 2,
            ring_socket: String::new(),
            ..Default::default()
        };
        p.submit(task(0, 0));
        p.submit(task(1, 0));
        settle(&p);
        assert_eq!(outboxes.len(), 4);
        assert_eq!(p.drop_consumer((1, 0)), Dropped { batches: 2, tasks: 0 });
        assert_eq!(p.drop_consumer((1, 0)), Dropped { batches: 0, tasks: 0 });
        assert_eq!(outboxes.len(), 2, "consumer 1 keeps its batches");

        // A running and a queued task of the consumer are both dropped, and
        // nothing of the running one reaches the outbox afterwards.
        let slow =
            Kind::Synthetic(SyntheticSpec { num_samples: 10, shape: vec![3], dtype: Dtype::U8 as i32, cost_ns: 50_000_000, wait_ns_by_epoch: Vec::new() });
        let slow_task = |start_seq: u64| Task {
            job: Some(job(2, slow.clone())),
            consumer: 0,
            start_seq,
            end_seq: start_seq + 2,
            ring_socket: String::new(),
            ..Default::default()
        };
        p.submit(slow_task(0));
        p.submit(slow_task(2));
        assert_eq!(p.drop_consumer((2, 0)).tasks, 2);
        settle(&p);
        assert_eq!(outboxes.len(), 2, "no batch of the dropped consumer slipped in");
        p.stop();
    }

    #[tokio::test]
    async fn clear_drops_queued_work() {
        let outboxes = Outboxes::new();
        let p = spawn(&outboxes);
        p.submit(Task { job: Some(synthetic(1)), consumer: 0, start_seq: 0, end_seq: 4, ring_socket: String::new(), ..Default::default() });
        settle(&p);
        assert!(!outboxes.is_empty());
        p.clear();
        assert!(outboxes.is_empty());
        p.stop();
        p.submit(Task { job: Some(synthetic(1)), consumer: 0, start_seq: 0, end_seq: 4, ring_socket: String::new(), ..Default::default() });
        assert!(p.is_idle(), "a stopped producer takes no task");
    }

    /// A shared stream's task: each batch made once, a copy for every
    /// subscriber, headers naming the rank; a subscriber that ends is left
    /// out of the rest (a queued task's first copy takes its place).
    #[tokio::test]
    async fn a_shared_task_delivers_each_batch_to_every_subscriber() {
        let outboxes = Outboxes::new();
        let p = spawn(&outboxes);
        let copy = |consumer: u32| pb::Copy { consumer, ring_socket: String::new() };
        let shared = |start_seq: u64, primary: u32, copies: Vec<pb::Copy>| Task {
            job: Some(synthetic(1)),
            consumer: primary,
            start_seq,
            end_seq: start_seq + 2,
            rank: Some(1),
            copies,
            ..Default::default()
        };
        p.submit(shared(0, 2, vec![copy(3), copy(4)]));
        settle(&p);
        assert_eq!(outboxes.len(), 6);
        let plan = loader_job::spec::plan(synthetic(1).spec.as_ref().expect("spec")).expect("plan");
        let mut made = Vec::new();
        for subscriber in [2, 3, 4] {
            let attachment = outboxes.attach((1, subscriber), 1, 100);
            for seq in 0..2 {
                let batch = attachment.next().await.expect("batch").data;
                let view = BatchView::parse(&batch).expect("parse");
                let h = view.header();
                assert_eq!((h.meta.consumer, h.meta.seq), (1, seq), "the rank's batch");
                assert_eq!(h.indices, plan.batch_indices(1, seq));
                made.push(batch);
            }
        }
        assert!(made[0] == made[2] && made[2] == made[4], "the same bytes for each");

        // Queued: the first subscriber ends, its copy goes on for the others.
        let mut queued = shared(2, 2, vec![copy(3), copy(4)]);
        assert!(!without(&mut queued, (1, 2)));
        assert_eq!((queued.consumer, queued.copies.len()), (3, 1));
        assert!(!without(&mut queued, (1, 4)));
        assert!(without(&mut queued, (1, 3)), "nobody is left");
        assert!(!without(&mut shared(2, 2, Vec::new()), (2, 2)), "another job");
        p.stop();
    }
}

