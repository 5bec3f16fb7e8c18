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
//!
//! This module holds the thread, its queue of tasks and the handle on it;
//! `making`: one task's batches, each made, listed with its deliveries and
//! handed over once; `dataset_cache`: the datasets of recent jobs, kept
//! open between their tasks; `task_error`: why a task failed.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use loader_proto::ConsumerKey;
use loader_proto::pb::{Failed, Task};
use loader_ring::worker::Rings;
use tokio::sync::Notify;

use crate::blobs::BlobFetcher;
use crate::busy::BusyMeter;
use crate::cache_use::CacheUse;
use crate::dataset::Datasets;
use crate::kept_batches::KeptBatches;
use crate::outbox::Outboxes;
use crate::window::Windows;

mod dataset_cache;
mod making;
mod task_error;
use dataset_cache::DatasetCache;
use task_error::TaskError;

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

