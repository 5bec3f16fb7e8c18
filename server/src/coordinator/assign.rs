//! Handing a worker ranges of the consumers' queues, round by round (see
//! [`Coordinator::assign`]). Each round takes at most one range per
//! consumer, in five steps: whether the worker may take the consumer's
//! next range at all, the backups of late batches it makes first, the
//! range sized by its window (and lined up with a shared stream's other
//! subscribers), who else takes it on a shared stream, and the tasks.

use std::collections::BTreeSet;
use std::ops::Range;

use loader_proto::pb;
use tokio::time::Instant;

use super::{Coordinator, HeartbeatOutcome, backup, share};
use crate::jobs::{JobState, JobTable};
use crate::kept_ranges::Route;
use crate::sessions::SessionTable;
use crate::traces::BatchTraces;
use crate::workers::WorkerState;

impl Coordinator {
    /// Hands the worker ranges of every consumer it has room for, lowest
    /// sequence numbers first, one range per consumer per round so that all
    /// consumers progress together, with the consumers it must drop (taken
    /// in the same critical section as the tasks, so a task for a consumer
    /// that came back is never older than the notice that it ended). None
    /// when the worker is unknown; a draining worker gets no tasks.
    pub(super) fn assign(&self, worker_id: u64) -> Option<HeartbeatOutcome> {
        let mut guard = self.lock();
        let t = &mut *guard;
        let w = t.workers.workers.get_mut(&worker_id)?;
        let ended = std::mem::take(&mut w.ended).into_iter().collect();
        let drain = w.draining;
        let mut round = Assignment {
            worker_id,
            w,
            sessions: &t.sessions,
            traces: &mut t.traces,
            now: Instant::now(),
            range_len: self.config.range_len,
            tasks: Vec::new(),
            wake: BTreeSet::new(),
        };
        while !drain && round.round(&mut t.jobs) {}
        let Assignment { tasks, mut wake, .. } = round;
        wake.remove(&worker_id);
        for owner in wake {
            if let Some(o) = t.workers.workers.get(&owner) {
                o.wake.notify_one();
            }
        }
        Some(HeartbeatOutcome::Tasks { tasks, drain, ended })
    }
}

/// One worker's assignment in the making: what the rounds read and what
/// they hand out.
struct Assignment<'a> {
    worker_id: u64,
    w: &'a mut WorkerState,
    /// Where each consumer's trainer is.
    sessions: &'a SessionTable,
    /// Root spans of the batches sampled for tracing.
    traces: &'a mut BatchTraces,
    now: Instant,
    /// The configured range length, before a job's window sizes it.
    range_len: u64,
    tasks: Vec<pb::Task>,
    /// Workers keeping a range that is due (a trailing subscriber's next
    /// one): woken at the end, or their long polls would end only at their
    /// deadline (a heartbeat interval, 1.6 s by default: a subscriber that
    /// trailed a finished one waited that long for each range).
    wake: BTreeSet<u64>,
}

/// A range taken for a consumer, and who else takes it.
struct Taken {
    range: Range<u64>,
    /// Other subscribers of a shared stream that take it too.
    copies: Vec<u32>,
    /// The worker keeps it for a subscriber too far behind to take it now.
    keep: bool,
}

impl Assignment<'_> {
    /// One round over every job that has not failed, at most one range per
    /// consumer; true when anything was handed out.
    fn round(&mut self, jobs: &mut JobTable) -> bool {
        let mut progressed = false;
        for job in jobs.iter_mut().filter(|j| j.error.is_none()) {
            // Windows and ranges sized by the job's batch bytes, as the
            // worker measured them: small batches go out in long ranges.
            let window = self.w.window_for(job.job.job_id);
            let range_len = loader_job::window::range_len(window, self.range_len);
            for c in 0..job.consumers.len() {
                progressed |= self.consumer(job, c, window, range_len);
            }
        }
        progressed
    }

    /// Hands consumer `c` of `job` the backups it waits on and its next
    /// range, when this worker may take them; true when it did.
    fn consumer(&mut self, job: &mut JobState, c: usize, window: u64, range_len: u64) -> bool {
        let Some(kept) = self.may_take(job, c) else { return false };
        let (backups, backed_up) = self.backups(job, c);
        let range = self.take(job, c, kept, backed_up, window, range_len);
        let handed = !backups.is_empty() || range.is_some();
        if handed {
            let taken = range.map(|range| self.share(job, c, range, kept.is_some(), window));
            self.push_tasks(job, c, backups, taken);
        }
        handed
    }

    /// Whether this worker may take consumer `c`'s next range: it has one
    /// (or a backup), its trainer is there and reaches this worker, and it
    /// is not a trailing subscriber's range that another worker keeps (that
    /// worker is woken instead). `Some(Some(n))`: its next `n` batches are
    /// kept here.
    fn may_take(&mut self, job: &JobState, c: usize) -> Option<Option<u64>> {
        let job_id = job.job.job_id;
        let consumer = &job.consumers[c];
        // Most consumers of a large job have nothing to hand out at any
        // moment: skip them before any lookup.
        if consumer.queue.is_empty() && consumer.backup.is_none() {
            return None;
        }
        // Only for a trainer that is there: its session says where batches
        // go (its ring or gRPC), and nothing is produced for a consumer
        // whose trainer died.
        if !self.sessions.has_consumer(job_id, c as u32) || self.w.cut_off.contains(&(job_id, c as u32)) {
            return None;
        }
        // A subscriber that trails the others: its next range goes to the
        // worker that made it for them and keeps it, so it is not made
        // again (see `kept_ranges`).
        match (consumer.subscribes_to, job.lanes.is_none(), consumer.queue.peek(1)) {
            (Some(rank), true, Some(next)) => match job.kept.route(rank, next.start, self.worker_id, self.now) {
                Route::Elsewhere { worker_id: owner } => {
                    self.wake.insert(owner);
                    None
                }
                Route::Here { until } => Some(Some(until - next.start)),
                Route::Anywhere => Some(None),
            },
            _ => Some(None),
        }
    }

    /// A backup of batches consumer `c`'s trainer waits on: it goes first.
    /// The ranges, and how many batches they hold.
    fn backups(&self, job: &mut JobState, c: usize) -> (Vec<Range<u64>>, u64) {
        let ranges = backup::take(&mut job.consumers[c], self.worker_id).unwrap_or_default();
        let backed_up: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        if backed_up > 0 {
            tracing::info!(worker_id = self.worker_id, job_id = job.job.job_id, consumer = c, batches = backed_up, "backup task for late batches");
        }
        (ranges, backed_up)
    }

    /// Consumer `c`'s next range, as much as the worker has room for beside
    /// what it holds and the `backed_up` batches; at most `kept` batches
    /// when they are kept here.
    fn take(&self, job: &mut JobState, c: usize, kept: Option<u64>, backed_up: u64, window: u64, range_len: u64) -> Option<Range<u64>> {
        let (job_id, worker_id, w) = (job.job.job_id, self.worker_id, &*self.w);
        let held = w.outstanding_for((job_id, c as u32)) + backed_up;
        let room = window.saturating_sub(held);
        // Batches taken back from a dead worker are the ones the trainer
        // waits for, while this worker's held batches may be blocked behind
        // them for want of the trainer's credits: they may exceed the
        // limit, by at most the limit again, so memory stays bounded.
        let extra = (2 * window).saturating_sub(held);
        // A shared stream's subscriber holds the copies of the others'
        // ranges too: its own (the part it missed, or a range the others
        // are past) may go up to twice the window, as given-back batches
        // may, so that it is never starved by them (see `share`).
        let subscriber = share::is_subscriber(job, c);
        let room = if subscriber { extra } else { room };
        // And its range lines up with the others' (lanes keep to their own
        // runs).
        let max = match subscriber && job.lanes.is_none() {
            true => share::aligned_len(job, c, extra.min(range_len).min(kept.unwrap_or(u64::MAX)), window, |k| {
                let key = (job_id, k);
                self.sessions.has_consumer(job_id, k) && !w.cut_off.contains(&key) && w.outstanding_for(key) < 4 * window
            }),
            false => range_len,
        };
        let queue = &mut job.consumers[c].queue;
        queue.take_returned(extra.min(max)).or_else(|| match job.lanes.as_mut() {
            Some(lanes) => lanes.take(&job.plan, queue, worker_id, room.min(range_len)),
            None => queue.take(room.min(max)),
        })
    }

    /// Who else takes `range` of consumer `c` on a shared stream, whether
    /// the worker keeps it, and what the range counts as (`kept_here`: it
    /// is a range kept by this worker for a trailing subscriber).
    fn share(&self, job: &mut JobState, c: usize, range: Range<u64>, kept_here: bool, window: u64) -> Taken {
        let (job_id, worker_id) = (job.job.job_id, self.worker_id);
        // On a shared stream, other subscribers take the range too: made
        // once, delivered to each, up to four windows held. A copy that
        // waits a little for a ring slot, or goes to the gRPC outbox, costs
        // far less than making the range again for one alone, and a
        // subscriber left out falls out of step with the others (with
        // delivery reports lagging, two windows left them out all the time:
        // docs/benchmarks.md, "Shared streams").
        let (sessions, w) = (self.sessions, &*self.w);
        let copies = share::copies(job, c, &range, window, |k| {
            let key = (job_id, k);
            sessions.has_consumer(job_id, k)
                && !w.cut_off.contains(&key)
                && w.outstanding_for(key) + (range.end - range.start) <= 4 * window
        });
        // A subscriber too far behind to take the range now reads it later:
        // the worker keeps it, and the trailing one is sent there.
        let keep = share::needed_later(job, c, &range, &copies);
        if let Some(rank) = job.consumers[c].subscribes_to {
            let len = range.end - range.start;
            if keep && !kept_here {
                job.kept.made(rank, &range, worker_id, self.now);
            }
            if kept_here {
                // Sent to the worker that keeps it: served from its memory
                // unless it let the range go.
                crate::meters::shared_batches(job_id, "kept", len * (1 + copies.len() as u64));
            } else if copies.is_empty() && !keep {
                job.consumers[c].assigned_alone += len;
                crate::meters::shared_batches(job_id, "alone", len);
            } else {
                crate::meters::shared_batches(job_id, "once", len * (1 + copies.len() as u64));
            }
        }
        Taken { range, copies, keep }
    }

    /// The tasks of consumer `c`: its `backups` (a backup copies batches of
    /// this consumer only; a shared stream launches none), then the range
    /// it `taken`, each held by this worker from now on.
    fn push_tasks(&mut self, job: &JobState, c: usize, backups: Vec<Range<u64>>, taken: Option<Taken>) {
        let job_id = job.job.job_id;
        let key = (job_id, c as u32);
        let node = &self.w.node;
        let rank = job.consumers[c].subscribes_to;
        let ring_socket = self.sessions.ring_for(job_id, c as u32, node).unwrap_or_default().to_owned();
        let taken = taken.map(|Taken { range, copies, keep }| {
            let copies: Vec<pb::Copy> = copies
                .into_iter()
                .map(|k| pb::Copy { consumer: k, ring_socket: self.sessions.ring_for(job_id, k, node).unwrap_or_default().to_owned() })
                .collect();
            (range, copies, keep)
        });
        let backups = backups.into_iter().map(|r| (r, Vec::new(), false));
        for (range, copies, keep) in backups.chain(taken) {
            self.w.outstanding.entry(key).or_default().extend(range.clone());
            for copy in &copies {
                let key = (job_id, copy.consumer);
                self.w.outstanding.entry(key).or_default().extend(range.clone());
                // Their spans are the primary's.
                self.traces.assign(key, range.clone(), self.worker_id);
            }
            let traceparents = self.traces.assign(key, range.clone(), self.worker_id);
            self.tasks.push(pb::Task {
                job: Some(job.job.clone()),
                consumer: c as u32,
                start_seq: range.start,
                end_seq: range.end,
                ring_socket: ring_socket.clone(),
                traceparents,
                rank,
                copies,
                keep,
            });
        }
    }
}
