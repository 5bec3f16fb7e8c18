//! The consumer's side of `next()`: takes events from the background tasks
//! and reports from the ring's workers, reorders and de-duplicates batches,
//! returns credits as batches are yielded, keeps the watermark and stall
//! time the heartbeat reports, and ends after the last batch of the job.
//! With a shared-memory ring, gaps are also handed to `ring::GapWatch`.
//!
//! Two ways to wait, one loop. Every turn of it runs the same two steps:
//! `prepare` takes a ready batch (or the end), takes in queued events and
//! reports without blocking, and otherwise arms the ring and plans the wait;
//! `after_wait` takes what ended the wait, counts it as stall, reads the
//! ring and, when a whole tick brought nothing, looks into why (`stuck`).
//! The two fronts differ only in how they sleep between the steps: the
//! blocking iterator sleeps in the [`WaitSet`] itself, the async `next`
//! awaits the event channel and the wait set's readiness on the caller's
//! runtime. Either way a wait on the ring is paced (`ring::Pace`): before
//! sleeping the consumer arms the ring's doorbell for several reports, so
//! the workers wake it once per few batches instead of once per batch (a
//! sleep and a wake-up is the largest CPU cost of a batch on a virtual
//! machine), and it never sleeps past the hold deadline the pace sets. A
//! hang-up on a worker's socket wakes it at once.
//!
//! This module holds the consumer's state, its two fronts and what a
//! batch that is handed out does (its credit goes back, the watermark
//! moves, the job ends after its last one). The rest is in submodules:
//! `wait`, one turn of the loop (`prepare`, the plan of a wait, what ended
//! it, `after_wait`); `ring`, the ring's part in a wait (arming its
//! doorbell at the pace, reading its sockets, its readiness on the
//! caller's runtime); `stuck`, what the consumer does when the batch it
//! waits on does not come (reports it late, gives credits back early,
//! nudges the routes task, ends with the error of a worker that left the
//! ring).

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use loader_ring::trainer::{Inbox, Pace};
use loader_ring::wake::{Ready, WaitFd, WaitSet};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::batch::{Batch, Expected};
use crate::error::LoaderError;
use crate::event::{Credit, Event, EventRx};
use crate::gap::GapWatch;
use crate::late::LateWatch;
use crate::meters::TrainerMeters;
use crate::reorder::Reorder;
use crate::session::Session;

mod ring;
mod stuck;
mod wait;

pub(crate) use stuck::STALL_GRACE;

use ring::ring_ready;
use wait::{Call, Step, Woke};

/// Bound on the best-effort final heartbeat after the last batch.
const FINAL_HEARTBEAT: Duration = Duration::from_secs(1);

/// State behind `Loader::next`.
#[derive(Debug)]
pub(crate) struct Consumer {
    /// Batches and fatal errors from the background tasks.
    events: EventRx,
    /// Arrived, not yet yielded.
    reorder: Reorder<(Batch, Credit)>,
    /// For the watermark, stall time and the final heartbeat.
    session: Arc<Session>,
    /// Tells the routes task the consumer is stuck on a gap.
    stalled: Arc<Notify>,
    /// Batches this consumer receives over the whole job.
    total: u64,
    /// Batches yielded so far.
    yielded: u64,
    /// Set after the last batch or a fatal error: `next` returns `None`.
    done: bool,
    /// The last batch was yielded: the final heartbeat is due.
    finish_due: bool,
    /// Gaps involving the shared-memory ring, when there is one.
    gap: Option<GapWatch>,
    /// When the routes task was last told the consumer is stuck.
    last_stall_notice: Instant,
    /// Bytes of the batches whose credits went back early while the batch
    /// waited on is late; None while it is not.
    late_spread: Option<u64>,
    /// The job's last batch while the final heartbeat is awaited: when that
    /// wait is cancelled (an interrupted caller), the next call yields it,
    /// so `next` loses nothing at any await point.
    last: Option<Batch>,
    /// Where a blocked `next` sleeps: the doorbell of `events` and the
    /// sockets of the ring's workers.
    wait: Arc<WaitSet>,
    /// The ring's attached workers, whose reports are read here.
    inbox: Option<Arc<Inbox>>,
    /// What every batch read from the ring must say about itself.
    expected: Option<Expected>,
    /// What the last wait saw; kept so that waiting allocates nothing.
    ready: Ready,
    /// `wait` registered with the caller's runtime, made by the first async
    /// `next` that waits on a ring.
    async_wait: Option<AsyncFd<WaitFd>>,
    /// How many ring reports a wait sleeps through.
    pace: Pace,
    /// Batches yielded and time waited, for Prometheus.
    meters: TrainerMeters,
    /// When the batch waited on (in order) is late: a backup task's trigger.
    late: LateWatch,
}

impl Consumer {
    /// A consumer for `total` batches, which sleeps in `wait` (the wait set
    /// whose doorbell `events`' senders ring).
    pub(crate) fn new(
        events: EventRx,
        wait: Arc<WaitSet>,
        session: Arc<Session>,
        stalled: Arc<Notify>,
        total: u64,
        in_order: bool,
    ) -> Self {
        Self {
            events,
            reorder: Reorder::new(in_order),
            session,
            stalled,
            total,
            yielded: 0,
            done: false,
            finish_due: false,
            gap: None,
            last_stall_notice: Instant::now(),
            late_spread: None,
            last: None,
            wait,
            inbox: None,
            expected: None,
            ready: Ready::default(),
            async_wait: None,
            pace: Pace::default(),
            meters: TrainerMeters::default(),
            late: LateWatch::default(),
        }
    }

    /// A consumer that records into `meters` (a loader with metrics on).
    pub(crate) fn with_meters(mut self, meters: TrainerMeters) -> Self {
        self.meters = meters;
        self
    }

    /// A consumer resumed from a saved state: the batches below `next_seq`
    /// and those in `yielded_above` were yielded by an earlier loader, so
    /// copies of them are dropped and they count as yielded.
    pub(crate) fn resuming(mut self, next_seq: u64, yielded_above: BTreeSet<u64>) -> Self {
        let in_order = self.reorder.in_order();
        self.yielded = next_seq + yielded_above.len() as u64;
        self.reorder = Reorder::resuming(in_order, next_seq, yielded_above);
        self.session
            .progress()
            .set_consumed(self.reorder.watermark());
        self
    }

    /// Where the consumer stands: every batch below the first value was
    /// yielded, and so were those in the second.
    pub(crate) fn position(&self) -> (u64, BTreeSet<u64>) {
        (
            self.reorder.watermark(),
            self.reorder.yielded_above().clone(),
        )
    }

    /// Batches also arrive through a ring: read from `inbox`, gaps watched
    /// by `gap`.
    pub(crate) fn with_ring(mut self, inbox: Arc<Inbox>, expected: Expected, gap: GapWatch) -> Self {
        self.inbox = Some(inbox);
        self.expected = Some(expected);
        self.gap = Some(gap);
        self
    }

    /// Batches yielded so far, including those yielded before a resume.
    pub(crate) fn yielded(&self) -> u64 {
        self.yielded
    }

    /// The next batch, awaiting it on the caller's runtime; `None` after the
    /// last one or after an error. Cancel-safe: dropped at any await, it
    /// loses no batch.
    pub(crate) async fn next(&mut self) -> Option<Result<Batch, LoaderError>> {
        if let Some(batch) = self.last.take() {
            return Some(Ok(batch));
        }
        let mut call = Call::new();
        loop {
            let plan = match self.prepare(&mut call, None) {
                Step::Wait(plan) => plan,
                Step::Yield(item) => {
                    if self.take_finish_due() {
                        // Held while the final heartbeat is awaited, so a
                        // cancelled wait hands it out on the next call.
                        if let Some(Ok(batch)) = item {
                            self.last = Some(batch);
                            self.finish().await;
                            return self.last.take().map(Ok);
                        }
                        self.finish().await;
                    }
                    return item;
                }
            };
            // A wait set that cannot join the runtime is a wait that failed.
            let woke = match self.register_async_wait() {
                Err(e) => Woke::WaitSet(Err(e)),
                Ok(()) => tokio::select! {
                    e = self.events.recv() => Woke::Event(e),
                    r = ring_ready(self.async_wait.as_ref(), &self.wait, &mut self.ready) => Woke::WaitSet(r),
                    () = tokio::time::sleep_until(plan.deadline) => Woke::Timer,
                },
            };
            if let Some(e) = self.after_wait(woke, &plan, &mut call) {
                return self.fail(e);
            }
        }
    }

    /// The next batch, blocking this thread until it is there: the worker
    /// that fills a ring slot wakes this thread directly. The caller runs
    /// [`Consumer::finish`] when [`Consumer::take_finish_due`] says so.
    pub(crate) fn next_blocking(&mut self) -> Option<Result<Batch, LoaderError>> {
        match self.next_blocking_checked(None, || Ok::<(), Infallible>(())) {
            Ok(item) => item,
            Err(never) => match never {},
        }
    }

    /// The next batch if one is in without waiting (None: none is yet). The
    /// pin stage uses it to queue copies ahead without holding back the
    /// batch it could yield.
    pub(crate) fn try_next(&mut self) -> Option<Option<Result<Batch, LoaderError>>> {
        self.next_blocking_checked(Some(Duration::ZERO), || Err(())).ok()
    }

    /// [`Consumer::next_blocking`] that calls `interrupted` about every
    /// `every` while it blocks and returns its error, if it gives one.
    /// Nothing is lost: batches that arrived meanwhile wait for the next
    /// call. The thread still sleeps in the wait set, woken by a worker's
    /// report, with a timeout at the next check.
    pub(crate) fn next_blocking_checked<E>(
        &mut self,
        every: Option<Duration>,
        mut interrupted: impl FnMut() -> Result<(), E>,
    ) -> Result<Option<Result<Batch, LoaderError>>, E> {
        let mut call = Call::new();
        let mut check_at = every.map(|every| call.called + every);
        loop {
            let plan = match self.prepare(&mut call, check_at) {
                Step::Wait(plan) => plan,
                Step::Yield(item) => return Ok(item),
            };
            let events = &self.events;
            let waited = self.wait.wait(
                plan.deadline.saturating_duration_since(plan.waiting),
                true,
                || !events.is_empty(),
                &mut self.ready,
            );
            let woke = match waited {
                Ok(()) if self.ready.timed_out => Woke::Timer,
                waited => Woke::WaitSet(waited),
            };
            if let Some(e) = self.after_wait(woke, &plan, &mut call) {
                return Ok(self.fail(e));
            }
            let now = Instant::now();
            if check_at.is_some_and(|check| now >= check) {
                check_at = every.map(|every| now + every);
                interrupted()?;
            }
        }
    }

    /// The next batch if it arrived, or the end: `None` means wait.
    fn take_ready(&mut self) -> Option<Option<Result<Batch, LoaderError>>> {
        if let Some((seq, (mut batch, credit))) = self.reorder.pop() {
            if self.late.yielded(seq, Instant::now) {
                self.session.progress().set_late(None);
                self.late_spread = None;
            }
            batch.consumed();
            credit.give_back();
            self.yielded += 1;
            self.meters.consumed(batch.len());
            self.session
                .progress()
                .set_consumed(self.reorder.watermark());
            if self.yielded >= self.total {
                self.done = true;
                self.finish_due = true;
            }
            return Some(Some(Ok(batch)));
        }
        if self.yielded >= self.total {
            self.done = true;
            return Some(None);
        }
        None
    }

    /// Whether the last batch was just yielded, so the final heartbeat is
    /// due; true once.
    pub(crate) fn take_finish_due(&mut self) -> bool {
        std::mem::take(&mut self.finish_due)
    }

    /// Ends the iterator with `e`.
    fn fail(&mut self, e: LoaderError) -> Option<Result<Batch, LoaderError>> {
        self.done = true;
        Some(Err(e))
    }

    /// Takes in one event (`None`: the channel closed); the error that ends
    /// the iterator, if it does.
    fn on_event(&mut self, event: Option<Event>) -> Option<LoaderError> {
        match event {
            Some(Event::Batch(batch, credit)) => {
                accept(&mut self.reorder, batch, credit);
                None
            }
            Some(Event::Fatal(e)) => Some(e),
            None => Some(LoaderError::InvalidArgument(
                "the loader's background tasks stopped (its runtime was shut down)".into(),
            )),
        }
    }

    /// Tells the coordinator at once that everything was consumed, so the job
    /// shows as complete without waiting for the next heartbeat tick.
    pub(crate) async fn finish(&mut self) {
        self.done = true;
        // Closing records the final watermark too, and ends the session at
        // once instead of at its lease's expiry.
        match tokio::time::timeout(FINAL_HEARTBEAT, self.session.close()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "closing the session failed; its lease will expire"),
            Err(_) => tracing::debug!("closing the session timed out; its lease will expire"),
        }
    }
}

/// Keeps `batch` for its turn, or drops it as a copy and returns its credit.
fn accept(reorder: &mut Reorder<(Batch, Credit)>, batch: Batch, credit: Credit) {
    if let Err((why, (batch, credit))) = reorder.insert(batch.seq(), (batch, credit)) {
        tracing::debug!(seq = batch.seq(), ?why, "dropping a copy of a batch");
        credit.give_back();
    }
}

#[cfg(test)]
mod tests;
