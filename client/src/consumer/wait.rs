//! One turn of the consumer's loop, the same for both fronts: `prepare`
//! (hand out what is ready, take in what is queued, otherwise arm the ring
//! and plan the wait), then, after the front has slept its own way,
//! `after_wait` (count the stall, take in what came, look into a tick that
//! brought nothing). Kept apart from the fronts so that there is one copy
//! of these steps, and the fronts differ only in how they sleep.

use std::io;

use tokio::sync::mpsc::error::TryRecvError;
use tokio::time::Instant;

use crate::batch::Batch;
use crate::error::LoaderError;
use crate::event::Event;
use crate::gap::GapWatch;

use super::Consumer;
use super::ring::RingWait;
use super::stuck::{LATE_TICK, STALL_GRACE};

/// What `prepare` found.
pub(super) enum Step {
    /// A batch, the end, or the error that ends the iterator: hand it out.
    Yield(Option<Result<Batch, LoaderError>>),
    /// Nothing yet: sleep as planned, then `after_wait`.
    Wait(WaitPlan),
}

/// One wait, as `prepare` planned it.
pub(super) struct WaitPlan {
    /// When the wait began: stall time counts from here.
    pub(super) waiting: Instant,
    /// When a wait that brings nothing finds the consumer stuck (see
    /// `Consumer::stuck`).
    tick_at: Instant,
    /// Wake by then whatever comes: the tick, an armed ring's hold deadline
    /// or the caller's next check, whichever is first.
    pub(super) deadline: Instant,
}

/// What ended a wait, told the same way by both fronts.
pub(super) enum Woke {
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
pub(super) struct Call {
    /// When the call began: time the user spends on a batch is no gap, so a
    /// worker that left the ring is judged lost from here at the earliest
    /// (see `GapWatch::lost`).
    pub(super) called: Instant,
    /// When nothing has arrived for a tick (see `Consumer::stuck`): kept
    /// across wake-ups that bring nothing, restarted by anything that
    /// arrives.
    tick_at: Option<Instant>,
}

impl Call {
    pub(super) fn new() -> Self {
        Self {
            called: Instant::now(),
            tick_at: None,
        }
    }
}

impl Consumer {

    /// The steps before a wait, the same for both fronts: hands out a ready
    /// batch, the end or an error; takes in queued events and reports that
    /// are in without blocking; otherwise arms the ring and plans a wait
    /// that ends by `check_at` too, if given.
    pub(super) fn prepare(&mut self, call: &mut Call, check_at: Option<Instant>) -> Step {
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
    pub(super) fn after_wait(&mut self, woke: Woke, plan: &WaitPlan, call: &mut Call) -> Option<LoaderError> {
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
}

fn wait_failed(e: io::Error) -> LoaderError {
    LoaderError::Runtime(format!("cannot wait for batches: {e}"))
}
