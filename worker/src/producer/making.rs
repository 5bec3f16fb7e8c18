//! One task's batches, made and handed over. For each seq the producer
//! makes the batch (taken from the kept ones, made once into a buffer for a
//! shared stream, or collated into its consumer's ring slot or a buffer of
//! its own), lists its deliveries and hands it over once, under one queue
//! lock. Every batch it makes goes through the same bookkeeping
//! ([`Shared::made_batch`]: spans, timing, meters, skipped samples),
//! whichever path made it.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use loader_job::sampler::Plan;
use loader_proto::ConsumerKey;
use loader_proto::batch::{BatchLayout, BatchMeta};
use loader_proto::pb::Task;
use loader_ring::worker::Route;

use super::{DatasetCache, Shared, TaskError, deliveries};
use crate::batch_spans::BatchSpans;
use crate::busy::Spell;
use crate::collate::{BatchRules, CollateError, Collated, Skipped, layout, make};
use crate::dataset::{Dataset, MadeBatch};
use crate::delivery::{Sources, Target, Written};
use crate::kept_batches::Kept;
use crate::meters::ConsumerMeters;
use crate::window::Windows;

/// How long a shared stream's batch waits, in all, for slots of its
/// subscribers' rings before the rest go to their gRPC outboxes: a
/// subscriber that stops reading must not stall the others.
const COPY_PATIENCE: Duration = Duration::from_millis(20);

/// What every batch of one task shares, worked out once before the first.
struct TaskRun<'t> {
    task: &'t Task,
    /// When the task arrived: a ring that closed later drops its batches.
    submitted: Instant,
    /// The queue's generation the task started under: under another one
    /// it is abandoned.
    generation: u64,
    job_id: u64,
    plan: Plan,
    dataset: Arc<dyn Dataset>,
    rules: BatchRules,
    /// Whose batches these are: on a shared stream the task's consumer is
    /// a subscriber of this rank.
    rank: u32,
    /// The task's consumer.
    key: ConsumerKey,
    /// Its meters, looked up once for the task.
    meters: Arc<ConsumerMeters>,
    /// Its ring, when the task names one.
    ring: Option<&'t Path>,
    /// How long its batches take to make, for the job's window.
    timing: BatchTiming,
}

/// One batch of a task, before it is made.
struct Planned {
    seq: u64,
    meta: BatchMeta,
    /// Its samples, in batch order.
    indices: Vec<u64>,
    spans: BatchSpans,
}

/// A batch's layout, and the batch itself when the dataset makes whole
/// batches (a Python `collate_fn`).
struct Laid {
    layout: BatchLayout,
    /// The batch made whole, with the time its samples took to read.
    made: Option<(MadeBatch, Duration)>,
    /// Time making it whole took (zero otherwise).
    making: Duration,
}

/// A batch made, not yet handed over.
enum Made {
    /// Written into the task's own target: a slot of its consumer's ring,
    /// or a buffer for its outbox.
    Own {
        written: Written,
        samples: u64,
    },
    /// A shared stream's batch, made once into a buffer (now or before,
    /// kept), for every consumer of the task.
    Shared(Kept),
}

/// Who takes one made batch.
enum Deliveries<'m> {
    /// The task's consumer alone, in the target the batch was written into.
    One(ConsumerKey, Written, &'m ConsumerMeters),
    /// Each consumer of a shared stream's task, in a slot of its ring or a
    /// buffer for its outbox.
    Copies(Vec<(ConsumerKey, Written, Arc<ConsumerMeters>)>),
}

impl Deliveries<'_> {
    fn each(self, mut to: impl FnMut(ConsumerKey, Written, &ConsumerMeters)) {
        match self {
            Deliveries::One(key, written, meters) => to(key, written, meters),
            Deliveries::Copies(copies) => {
                for (key, written, meters) in copies {
                    to(key, written, &meters);
                }
            }
        }
    }
}

impl Shared {
    /// Produces every batch of `task`, stopping early if it was abandoned or
    /// its trainer left.
    pub(super) fn produce(
        &self,
        task: &Task,
        submitted: Instant,
        generation: u64,
        cache: &mut DatasetCache,
    ) -> Result<(), TaskError> {
        let mut run = self.prepare(task, submitted, generation, cache)?;
        for seq in task.start_seq..task.end_seq {
            if self.abandoned(generation) {
                break;
            }
            self.pace(&run, seq);
            let batch = run.plan_batch(seq);
            // A batch's busy spell lasts until it is handed over.
            let Some((made, _busy)) = self.make(&mut run, &batch)? else { break };
            if !self.deliver(&run, &batch, made) {
                break;
            }
        }
        Ok(())
    }

    /// Checks `task` against its job and this worker, and works out what
    /// its batches share.
    fn prepare<'t>(
        &self,
        task: &'t Task,
        submitted: Instant,
        generation: u64,
        cache: &mut DatasetCache,
    ) -> Result<TaskRun<'t>, TaskError> {
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
        let key = (job.job_id, task.consumer);
        Ok(TaskRun {
            task,
            submitted,
            generation,
            job_id: job.job_id,
            plan,
            dataset,
            rules,
            rank: task.rank.unwrap_or(task.consumer),
            key,
            meters: self.outboxes.meters().consumer(key),
            ring: Some(Path::new(&task.ring_socket)).filter(|p| !p.as_os_str().is_empty()),
            timing: BatchTiming::default(),
        })
    }

    /// True once the task started under `generation` was abandoned.
    fn abandoned(&self, generation: u64) -> bool {
        self.abandon.load(Ordering::SeqCst) != generation
    }

    /// Before batch `seq`: the extra time of the test knob, and a dataset
    /// that reads ahead hears which batches come next.
    fn pace(&self, run: &TaskRun<'_>, seq: u64) {
        let slow = self.slow_batch_ns.load(Ordering::Relaxed);
        if slow > 0 {
            std::thread::sleep(Duration::from_nanos(slow));
        }
        if run.dataset.fetches_ahead() {
            let next = crate::fetch_ahead::upcoming(run.task, seq, self.lock().tasks.iter().map(|(t, _)| t));
            crate::fetch_ahead::hint(&*run.dataset, &run.plan, &next);
        }
    }

    /// Makes `batch`, with the busy spell of making it (none for a kept
    /// one); None when it goes nowhere (see [`Shared::target`]).
    fn make<'s>(&'s self, run: &mut TaskRun<'_>, batch: &Planned) -> Result<Option<(Made, Option<Spell<'s>>)>, TaskError> {
        if let Some(kept) = self.kept_batch(run, batch.seq) {
            crate::meters::kept_served(run.job_id);
            return Ok(Some((Made::Shared(kept), None)));
        }
        let laid = self.lay_out(run, batch)?;
        match run.task.rank {
            Some(_) => self.make_shared(run, batch, laid).map(Some),
            None => self.make_own(run, batch, laid),
        }
    }

    /// A shared stream's batch this worker made before, for the subscribers
    /// ahead of this one: the same bytes, made no more. The kept lock goes
    /// before the batch is handed over: a wait for a ring slot under it
    /// would hold up the link's heartbeat (`Producer::let_go_kept`).
    fn kept_batch(&self, run: &TaskRun<'_>, seq: u64) -> Option<Kept> {
        run.task.rank.and_then(|_| self.kept().get((run.job_id, run.rank, seq), Instant::now()))
    }

    /// The layout of `batch`. A batch made whole is made first: its size,
    /// and so where it fits, is known only then.
    fn lay_out(&self, run: &TaskRun<'_>, batch: &Planned) -> Result<Laid, TaskError> {
        if run.dataset.makes_whole_batches() {
            let _busy = self.busy_meter.spell(Instant::now());
            let (made, layout, read) = batch
                .spans
                .produce()
                .in_scope(|| make(&*run.dataset, &batch.meta, &batch.indices, run.rules))
                .map_err(run.failed(batch.seq))?;
            Ok(Laid { layout, made: Some((made, read)), making: read })
        } else {
            let layout = layout(&*run.dataset, batch.indices.len()).map_err(|e| run.failed(batch.seq)(e.into()))?;
            Ok(Laid { layout, made: None, making: Duration::ZERO })
        }
    }

    /// A shared stream's batch: made once into a buffer, then copied to
    /// every subscriber of the task; kept for those that trail when the
    /// task says so.
    fn make_shared<'s>(
        &'s self,
        run: &mut TaskRun<'_>,
        batch: &Planned,
        laid: Laid,
    ) -> Result<(Made, Option<Spell<'s>>), TaskError> {
        let Laid { layout, made, making } = laid;
        let started = Instant::now();
        let busy = self.busy_meter.spell(started);
        let sources = run.sources(batch, &layout, made);
        let (bytes, collated) = sources.into_bytes(&batch.spans).map_err(run.failed(batch.seq))?;
        self.made_batch(run, batch, started.elapsed() + making, &collated);
        let samples = held(&batch.indices, &collated.skipped);
        if run.task.keep {
            self.kept().keep((run.job_id, run.rank, batch.seq), Kept { bytes: bytes.clone(), samples }, Instant::now());
        }
        Ok((Made::Shared(Kept { bytes, samples }), Some(busy)))
    }

    /// A batch of the task's consumer alone, written into its target (a
    /// slot of its ring, waited for first, or a buffer of its own); None
    /// when it goes nowhere.
    fn make_own<'s>(
        &'s self,
        run: &mut TaskRun<'_>,
        batch: &Planned,
        laid: Laid,
    ) -> Result<Option<(Made, Option<Spell<'s>>)>, TaskError> {
        let Laid { layout, made, making } = laid;
        let Some(target) = self.target(run, layout.total_len()) else { return Ok(None) };
        let started = Instant::now();
        let busy = self.busy_meter.spell(started);
        let sources = run.sources(batch, &layout, made);
        let (written, collated) = target.write(sources, &batch.spans, started).map_err(run.failed(batch.seq))?;
        self.made_batch(run, batch, started.elapsed() + making, &collated);
        let samples = held(&batch.indices, &collated.skipped);
        Ok(Some((Made::Own { written, samples }, Some(busy))))
    }

    /// Where the task's next batch (`len` bytes) goes: a slot of its ring,
    /// when the task names one and it takes the batch, else the gRPC
    /// outbox. `None`: the batch goes nowhere (the task was abandoned, or
    /// its trainer left the ring after the task came, and its batches have
    /// no taker).
    fn target(&self, run: &TaskRun<'_>, len: usize) -> Option<Target> {
        let Some(path) = run.ring else { return Some(Target::Grpc) };
        let asked = Instant::now();
        let abandoned = || self.abandoned(run.generation);
        match self.rings.acquire(path, run.key, run.submitted, len, &abandoned, &run.meters.blocked_shm) {
            Route::Slot(lease) => Some(Target::Slot { lease, asked }),
            Route::Grpc => Some(Target::Grpc),
            Route::Abandoned => None,
            Route::Drop => {
                tracing::debug!(job = run.key.0, consumer = run.key.1, "dropping the rest of a task: its trainer left");
                None
            }
        }
    }

    /// Hands `made` over: one list of its deliveries, then one hand-over.
    /// False when the task was abandoned.
    fn deliver(&self, run: &TaskRun<'_>, batch: &Planned, made: Made) -> bool {
        // A shared batch's bytes go after the hand-over, as its copies do.
        let (deliveries, samples, _bytes) = match made {
            Made::Own { written, samples } => (Deliveries::One(run.key, written, &run.meters), samples, None),
            Made::Shared(kept) => {
                let Some(copies) = self.copies(run, &kept.bytes) else { return false };
                (Deliveries::Copies(copies), kept.samples, Some(kept.bytes))
            }
        };
        self.hand_over(run, batch, samples, deliveries)
    }

    /// A shared stream's batch `bytes` for each consumer of the task still
    /// there: into a slot of its ring when the task names one that grants a
    /// slot within [`COPY_PATIENCE`], else into a buffer for its gRPC
    /// outbox, so that no subscriber holds up the others for long. A task
    /// for one subscriber (no copies) waits for its ring as any task does.
    /// None when the task was abandoned.
    fn copies(&self, run: &TaskRun<'_>, bytes: &Bytes) -> Option<Vec<(ConsumerKey, Written, Arc<ConsumerMeters>)>> {
        // A batch for one subscriber holds up nobody else: it waits for
        // its ring like any other task's batch (a trailing subscriber
        // served from kept batches would else read them over gRPC).
        let deadline = (!run.task.copies.is_empty()).then(|| Instant::now() + COPY_PATIENCE);
        let abandoned = || self.abandoned(run.generation);
        let mut copies = Vec::new();
        for (key, ring) in deliveries(run.task) {
            if self.lock().gone.contains(&key) {
                continue;
            }
            let meters = self.outboxes.meters().consumer(key);
            let route = match ring {
                "" => Route::Grpc,
                path => {
                    let path = Path::new(path);
                    self.rings.acquire_until(path, key, run.submitted, bytes.len(), &abandoned, &meters.blocked_shm, deadline)
                }
            };
            let copy = match route {
                Route::Slot(lease) => Written::copied_into(lease, bytes).unwrap_or_else(|| Written::Grpc(bytes.clone())),
                Route::Grpc => Written::Grpc(bytes.clone()),
                Route::Abandoned => return None,
                // Its trainer left the ring: nobody takes it there.
                Route::Drop => continue,
            };
            copies.push((key, copy, meters));
        }
        Some(copies)
    }

    /// Hands `batch`, holding `samples` samples, to each of `deliveries`
    /// whose consumer is still there. Under the queue lock, so that a batch
    /// of an abandoned task cannot slip into an outbox after `clear` or
    /// `drop_consumer`; what was written for a consumer that ended
    /// meanwhile (a ring slot) goes back after it. False when the task was
    /// abandoned.
    fn hand_over(&self, run: &TaskRun<'_>, batch: &Planned, samples: u64, deliveries: Deliveries<'_>) -> bool {
        let q = self.lock();
        if q.generation != run.generation {
            return false;
        }
        let mut left = Vec::new();
        deliveries.each(|key, written, meters| {
            if q.gone.contains(&key) {
                left.push(written);
            } else {
                written.hand_over(key, batch.seq, samples, &batch.spans, meters, &self.outboxes);
            }
        });
        drop(q);
        drop(left);
        true
    }

    /// What every batch made goes through, whichever way it is then
    /// delivered (a ring slot or the gRPC outbox): its span, the task's
    /// timing (the job's window learns from it), the consumer's meters and
    /// the log of the samples it left out. `took`: making it, without any
    /// wait for a ring slot.
    fn made_batch(&self, run: &mut TaskRun<'_>, batch: &Planned, took: Duration, collated: &Collated) {
        batch.spans.made(batch.indices.len(), collated);
        run.timing.made(took, &self.windows, run.job_id);
        run.meters.made(took, collated.read);
        self.log_skipped(run.job_id, batch.seq, &collated.skipped);
        run.meters.skipped(collated.skipped.len());
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

impl TaskRun<'_> {
    /// Batch `seq`'s header fields, samples and spans.
    fn plan_batch(&self, seq: u64) -> Planned {
        let (epoch, _) = self.plan.locate(seq);
        let meta = BatchMeta { job_id: self.job_id, epoch, consumer: self.rank, seq };
        let indices = self.plan.batch_indices(self.rank, seq);
        let spans = BatchSpans::start(self.task, self.job_id, seq);
        Planned { seq, meta, indices, spans }
    }

    /// What `batch` is made of.
    fn sources<'a>(&'a self, batch: &'a Planned, layout: &'a BatchLayout, made: Option<(MadeBatch, Duration)>) -> Sources<'a> {
        Sources { dataset: &*self.dataset, layout, meta: &batch.meta, indices: &batch.indices, rules: self.rules, made }
    }

    /// The task's error for batch `seq`.
    fn failed(&self, seq: u64) -> impl FnOnce(CollateError) -> TaskError {
        let job_id = self.job_id;
        move |source| TaskError::Batch { job_id, seq, source }
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
