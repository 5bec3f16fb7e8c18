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

use std::collections::{BTreeSet, HashSet};
use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use loader_ring::trainer::{Inbox, Pace};
use loader_ring::wake::{Ready, WaitFd, WaitSet};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::time::Instant;

use crate::batch::{Batch, Expected, Transport};
use crate::error::LoaderError;
use crate::event::{Credit, Event, EventRx};
use crate::gap::GapWatch;
use crate::late::LateWatch;
use crate::meters::TrainerMeters;
use crate::reorder::Reorder;
use crate::session::Session;

/// How long the consumer waits on a gap, holding batches, before it suspects
/// a worker is out of credits with the missing batch queued (see
/// `Routes::unstick`).
pub(crate) const STALL_GRACE: Duration = Duration::from_secs(1);
/// While the consumer waits on a late batch (a backup task copies it), how
/// often a wait that brings nothing gives each source a credit early: the
/// copy comes from a worker whose credits the batches held here took, and
/// which first finishes the batches it was making when it took the copy
/// (each needing a credit), then sends its lowest batch first.
const LATE_TICK: Duration = Duration::from_millis(25);
/// Bytes of batches whose credits go back early while one batch is late:
/// memory grows by at most this much for a copy that does not come.
const LATE_SPREAD_BYTES: u64 = 64 << 20;
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

/// The ring's part in a wait.
enum RingWait {
    /// No ring.
    Off,
    /// Reports are in that were not read: read instead of sleeping.
    Unread,
    /// The workers ring after enough reports; read by the deadline, if any,
    /// whatever came.
    Armed(Option<Instant>),
}

/// What `prepare` found.
enum Step {
    /// A batch, the end, or the error that ends the iterator: hand it out.
    Yield(Option<Result<Batch, LoaderError>>),
    /// Nothing yet: sleep as planned, then `after_wait`.
    Wait(WaitPlan),
}

/// One wait, as `prepare` planned it.
struct WaitPlan {
    /// When the wait began: stall time counts from here.
    waiting: Instant,
    /// When a wait that brings nothing finds the consumer stuck (see
    /// `Consumer::stuck`).
    tick_at: Instant,
    /// Wake by then whatever comes: the tick, an armed ring's hold deadline
    /// or the caller's next check, whichever is first.
    deadline: Instant,
}

/// What ended a wait, told the same way by both fronts.
enum Woke {
    /// An event, or `None`: the channel closed. Only the async front takes
    /// events while it sleeps; the blocking one is woken by their doorbell.
    Event(Option<Event>),
    /// The wait set has something: the doorbell rang (the ring's reports
    /// asked for are in, or, for a blocking wait, an event was sent) or a
    /// ring socket hung up or can take grants. Or waiting failed.
    WaitSet(io::Result<()>),
    /// The plan's deadline passed first.
    Timer,
}

/// What the waits of one `next` call share.
struct Call {
    /// When the call began: time the user spends on a batch is no gap, so a
    /// worker that left the ring is judged lost from here at the earliest
    /// (see `GapWatch::lost`).
    called: Instant,
    /// When nothing has arrived for a tick (see `Consumer::stuck`): kept
    /// across wake-ups that bring nothing, restarted by anything that
    /// arrives.
    tick_at: Option<Instant>,
}

impl Call {
    fn new() -> Self {
        Self {
            called: Instant::now(),
            tick_at: None,
        }
    }
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

    /// The steps before a wait, the same for both fronts: hands out a ready
    /// batch, the end or an error; takes in queued events and reports that
    /// are in without blocking; otherwise arms the ring and plans a wait
    /// that ends by `check_at` too, if given.
    fn prepare(&mut self, call: &mut Call, check_at: Option<Instant>) -> Step {
        if self.done {
            return Step::Yield(None);
        }
        loop {
            if let Some(item) = self.take_ready() {
                return Step::Yield(item);
            }
            let queued = match self.events.try_recv() {
                Ok(event) => Some(Some(event)),
                Err(TryRecvError::Disconnected) => Some(None),
                Err(TryRecvError::Empty) => None,
            };
            if let Some(event) = queued {
                call.tick_at = None;
                if let Some(e) = self.on_event(event) {
                    return Step::Yield(self.fail(e));
                }
                continue;
            }
            let waiting = Instant::now();
            let hold_at = match self.arm_ring(waiting) {
                RingWait::Off => None,
                RingWait::Armed(hold_at) => hold_at,
                RingWait::Unread => match self.read_ring() {
                    Ok(_) => {
                        call.tick_at = None;
                        continue;
                    }
                    Err(e) => return Step::Yield(self.fail(e)),
                },
            };
            let mut tick = self.gap.as_ref().map_or(STALL_GRACE, GapWatch::tick);
            if self.spreading_late() {
                tick = tick.min(LATE_TICK);
            }
            let tick_at = *call.tick_at.get_or_insert(waiting + tick);
            let late_at = self.watch_late(waiting);
            let deadline = [hold_at, check_at, late_at]
                .into_iter()
                .flatten()
                .fold(tick_at, Instant::min);
            return Step::Wait(WaitPlan {
                waiting,
                tick_at,
                deadline,
            });
        }
    }

    /// The steps after a wait, the same for both fronts, whatever ended it:
    /// disarms the ring, counts the wait as stall, takes in what came (the
    /// event, or whatever the ring's sockets have), and when a whole tick
    /// brought nothing, looks into why (`stuck`). Returns the error that
    /// ends the iterator, if any.
    fn after_wait(&mut self, woke: Woke, plan: &WaitPlan, call: &mut Call) -> Option<LoaderError> {
        self.disarm_ring();
        let now = Instant::now();
        if let Some(seq) = self.late.due(now) {
            self.report_late(seq);
        }
        self.session.progress().add_stall(now - plan.waiting);
        self.meters.stalled(now - plan.waiting);
        let arrived = match woke {
            Woke::Event(event) => match self.on_event(event) {
                Some(e) => Err(e),
                None => Ok(true),
            },
            Woke::WaitSet(Err(e)) => Err(wait_failed(e)),
            // Woken (a report count, an event, a hang-up) or timed out:
            // either way, what the ring has is read.
            Woke::WaitSet(Ok(())) => self.read_ring().map(|_| true),
            Woke::Timer => self.read_ring().map(|filled| filled > 0),
        };
        match arrived {
            Err(e) => Some(e),
            Ok(true) => {
                call.tick_at = None;
                None
            }
            Ok(false) if now >= plan.tick_at => {
                call.tick_at = None;
                self.stuck(call.called)
            }
            Ok(false) => None,
        }
    }

    /// Before a wait for the next batch in order: when it will be late (and
    /// reports it if it is already).
    fn watch_late(&mut self, now: Instant) -> Option<Instant> {
        if !self.reorder.in_order() {
            return None;
        }
        let late_at = self.late.waiting_on(self.reorder.watermark(), now)?;
        if let Some(seq) = self.late.due(now) {
            self.report_late(seq);
        }
        // Past it (reported): nothing more to wake for.
        (late_at > now).then_some(late_at)
    }

    /// Batch `seq` is late: the coordinator is told (it launches a backup),
    /// and each source gets a credit at once for the copy to come through.
    fn report_late(&mut self, seq: u64) {
        self.session.report_late(seq);
        self.late_spread = Some(self.spread_credits());
    }

    /// Whether the batch waited on is late and batches held here may still
    /// give their credits back early.
    fn spreading_late(&self) -> bool {
        self.reorder.len() > 0 && self.late_spread.is_some_and(|bytes| bytes < LATE_SPREAD_BYTES)
    }

    /// Registers the wait set with the caller's runtime, the first time an
    /// async `next` waits on a ring.
    fn register_async_wait(&mut self) -> io::Result<()> {
        if self.inbox.is_some() && self.async_wait.is_none() {
            self.async_wait = Some(WaitFd::register(Arc::clone(&self.wait))?);
        }
        Ok(())
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

    /// Before a wait: asks the ring's workers to ring after the reports the
    /// pace plans for (see `ring::pace`), unless some are in already.
    fn arm_ring(&mut self, now: Instant) -> RingWait {
        let Some(inbox) = &self.inbox else {
            return RingWait::Off;
        };
        if inbox.unread() {
            return RingWait::Unread;
        }
        let received = self.yielded + self.reorder.len() as u64;
        let plan = self
            .pace
            .plan(inbox.in_flight(), self.total.saturating_sub(received));
        if !inbox.arm(plan.reports) {
            return RingWait::Unread;
        }
        self.pace.waiting(now, plan);
        RingWait::Armed(plan.hold.map(|hold| now + hold))
    }

    /// After a wait, whatever ended it.
    fn disarm_ring(&self) {
        if let Some(inbox) = &self.inbox {
            inbox.disarm();
        }
    }

    /// Reads every ring socket: reports become batches, writable sockets
    /// take the grants that waited for them. Returns the batches read.
    fn read_ring(&mut self) -> Result<u64, LoaderError> {
        let Some(inbox) = self.inbox.as_ref() else {
            return Ok(0);
        };
        if !self.ready.writable.is_empty() {
            inbox.flush(&self.ready.writable);
            self.ready.writable.clear();
        }
        let reorder = &mut self.reorder;
        let Some(expected) = self.expected.as_ref() else {
            return Ok(0);
        };
        let filled = inbox.read_all(|filled| Batch::from_filled(filled, expected), |batch, credit| accept(reorder, batch, credit))?;
        self.pace.read(Instant::now(), filled);
        Ok(filled)
    }

    /// Nothing arrived for a tick: nudges the workers that may hold the
    /// gap, or ends with the error of a worker that left the ring.
    fn stuck(&mut self, called: Instant) -> Option<LoaderError> {
        if self.reorder.len() > 0 {
            if self.spreading_late() {
                let bytes = self.spread_credits();
                self.late_spread = self.late_spread.map(|b| b + bytes);
            } else if self.last_stall_notice.elapsed() >= STALL_GRACE {
                self.last_stall_notice = Instant::now();
                self.stalled.notify_one();
                self.spread_credits();
            }
            if let Some(gap) = &mut self.gap {
                gap.stuck(self.reorder.pending_mut(), Credit::give_back_early);
            }
        }
        self.gap.as_ref()?.lost(called)
    }

    /// Stuck on a gap: each stream and ring connection gets back the credit
    /// of its newest waiting batch (copied out of its ring slot first), once
    /// per stall grace. The missing batch may sit behind those credits at a
    /// worker that took it over from a dead one: workers hand out their
    /// lowest sequence number first, so one credit lets it through. Memory
    /// grows by at most one batch per source per grace while the gap lasts.
    /// Returns the bytes of the batches whose credits went back.
    fn spread_credits(&mut self) -> u64 {
        let mut seen = HashSet::new();
        let mut bytes = 0;
        for (batch, credit) in self.reorder.pending_mut().rev() {
            let Some(source) = credit.source() else {
                continue;
            };
            if !seen.insert(source) {
                continue;
            }
            if batch.transport() == Transport::SharedMemory {
                batch.copy_out();
            }
            bytes += batch.len() as u64;
            credit.give_back_early();
        }
        if !seen.is_empty() {
            tracing::debug!(
                sources = seen.len(),
                "stuck on a gap: gave each source one credit early"
            );
        }
        bytes
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

/// Waits until the ring's doorbell rings (the reports asked for are in) or
/// one of its sockets hangs up, for an async consumer. Readiness is cleared
/// only once the wait set was seen empty.
async fn ring_ready(
    fd: Option<&AsyncFd<WaitFd>>,
    wait: &WaitSet,
    ready: &mut Ready,
) -> io::Result<()> {
    let Some(fd) = fd else {
        return std::future::pending().await;
    };
    loop {
        let mut guard = fd.readable().await?;
        wait.wait(Duration::ZERO, false, || false, ready)?;
        if !ready.timed_out {
            return Ok(());
        }
        guard.clear_ready();
    }
}

fn wait_failed(e: io::Error) -> LoaderError {
    LoaderError::Runtime(format!("cannot wait for batches: {e}"))
}

#[cfg(test)]
mod tests;
