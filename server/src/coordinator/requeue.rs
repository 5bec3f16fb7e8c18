//! Taking batches back, so that another worker produces them again.
//!
//! Two events take batches back: a worker leaves (its lease expired, or it
//! deregistered after a drain), and a consumer is left with no trainer (the
//! last session of the consumer ended). Both go through [`give_back`]: every
//! batch handed out above the consumer's acknowledged watermark returns to
//! the front of its queue. One path, so the rules for what is produced again
//! (and what is not) cannot drift apart.

use loader_proto::ConsumerKey;

use std::collections::BTreeSet;

use super::{Tables, backup};
use crate::jobs::JobTable;

/// Gives `seqs` of `key` back to its consumer's queue, except those below
/// the acknowledged watermark, which need no copy anywhere any more.
/// `delivered`: they had been delivered (unacknowledged), so their next
/// delivery counts as a re-send. Returns how many went back.
fn give_back(jobs: &mut JobTable, key: ConsumerKey, seqs: impl IntoIterator<Item = u64>, delivered: bool) -> usize {
    let (job_id, consumer) = key;
    let Some(c) = jobs.get_mut(job_id).and_then(|j| j.consumers.get_mut(consumer as usize)) else {
        return 0;
    };
    let consumed = c.consumed;
    let (seqs, below): (Vec<u64>, Vec<u64>) = seqs.into_iter().partition(|&s| s >= consumed);
    if !delivered {
        // Not reported delivered yet, but the trainer consumed them: they
        // were (their report was still coalescing at the worker). Except
        // a re-send of one delivered before: the copy counted then is the
        // one the trainer may have consumed, and this one may never have
        // been made, so it counts neither as delivered nor as re-sent.
        let first_copies = below.iter().filter(|s| !c.redeliver.remove(s)).count();
        c.delivered += first_copies as u64;
    }
    let n = seqs.len();
    if delivered {
        c.redeliver.extend(seqs.iter().copied());
    }
    c.queue.give_back(seqs);
    crate::meters::requeued(n);
    n
}

/// Removes a worker and gives the batches it held undelivered or
/// unacknowledged back to their consumers' queues. Returns its address and
/// the number of batches given back, or None when it is unknown.
pub(super) fn retire(t: &mut Tables, worker_id: u64) -> Option<(String, usize)> {
    let w = t.workers.remove(worker_id)?;
    for job in t.jobs.iter_mut() {
        if let Some(lanes) = job.lanes.as_mut() {
            lanes.forget(worker_id);
        }
        job.kept.forget_worker(worker_id);
    }
    let mut undelivered = 0;
    // Backups it was part of for consumers it holds nothing of (all it had
    // was sent): their re-sends may have nobody left to make them.
    for key in backup::involving(t, worker_id) {
        if !w.outstanding.contains_key(&key) {
            let orphans = backup::forget_worker(t, key, worker_id, &BTreeSet::new());
            undelivered += give_back(&mut t.jobs, key, orphans, true);
        }
    }
    for (key, held) in w.outstanding {
        // A backup's other holder still makes its copy of those.
        let orphans = backup::forget_worker(t, key, worker_id, &held);
        let seqs = backup::held_only_by(t, key, worker_id, held);
        undelivered += give_back(&mut t.jobs, key, seqs, false) + give_back(&mut t.jobs, key, orphans, true);
    }
    let unacked: usize = w.unacked.into_iter().map(|(key, seqs)| give_back(&mut t.jobs, key, seqs, true)).sum();
    let requeued = undelivered + unacked;
    Some((w.address, requeued))
}

/// Cuts `key` off worker `worker_id`, whose trainer cannot reach it: what
/// the worker holds for the consumer goes back to its queue for other
/// workers (fenced as at a lease expiry: the worker is told to drop it,
/// and a late report of it counts for nothing), and the worker gets none
/// of the consumer's batches until [`reconnect`]. Returns the batches
/// given back, or None when the worker is unknown or was already cut off.
pub(super) fn cut_off(t: &mut Tables, worker_id: u64, key: ConsumerKey) -> Option<usize> {
    if !t.workers.cut(worker_id, key) {
        return None;
    }
    if let Some(job) = t.jobs.get_mut(key.0) {
        job.kept.forget_worker(worker_id);
    }
    let w = t.workers.workers.get_mut(&worker_id)?;
    let held = w.outstanding.remove(&key).unwrap_or_default();
    let unacked = w.unacked.remove(&key).unwrap_or_default();
    w.ended.insert(key);
    let orphans = backup::forget_worker(t, key, worker_id, &held);
    let held = backup::held_only_by(t, key, worker_id, held);
    Some(give_back(&mut t.jobs, key, held, false) + give_back(&mut t.jobs, key, unacked, true) + give_back(&mut t.jobs, key, orphans, true))
}

/// Lets worker `worker_id` produce `key`'s batches again: its trainer
/// reaches it. True when it had been cut off.
pub(super) fn reconnect(t: &mut Tables, worker_id: u64, key: ConsumerKey) -> bool {
    t.workers.uncut(worker_id, key)
}

/// What [`end_consumer`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ended {
    /// Workers that held undelivered batches for the consumer and will be
    /// told to drop them.
    pub(super) workers: usize,
    /// Batches given back to the consumer's queue.
    pub(super) requeued: usize,
}

/// Ends a consumer at every worker: nobody will fetch its batches (its last
/// session ended). What workers hold for it
/// goes back to its queue, as if they had left, so a trainer that comes back
/// for the consumer gets those batches from whichever worker takes them
/// next; each worker that held undelivered batches for it is told, in its
/// next heartbeat response, to drop them and their queued tasks.
pub(super) fn end_consumer(t: &mut Tables, key: ConsumerKey) -> Ended {
    t.traces.forget(key.0, Some(key.1));
    if let Some(job) = t.jobs.get_mut(key.0) {
        let ranks = job.plan.consumers;
        if let Some(c) = job.consumers.get_mut(key.1 as usize) {
            c.backup = None;
            // A subscriber of a shared stream whose trainer is gone is not
            // waited for (a reopening session takes it back).
            c.left |= key.1 >= ranks;
        }
        if key.1 >= ranks {
            crate::meters::subscribers(key.0, job.live_subscribers());
        }
        job.end_life_if_consumed();
    }
    let mut ended = Ended::default();
    // Its trainers are gone: nobody lists a worker as unreachable any more.
    t.workers.uncut_all(key);
    t.workers.unacked_by.remove(&key);
    for w in t.workers.workers.values_mut() {
        // Every worker that served it is told, holding batches or not: it
        // also closes the job's dataset once all consumers it served ended
        // (and with it what the dataset keeps, such as its frames cache).
        let served = w.outstanding.remove(&key);
        let unacked = w.unacked.remove(&key).unwrap_or_default();
        if served.is_some() {
            w.ended.insert(key);
        }
        let held = served.unwrap_or_default();
        if !held.is_empty() {
            ended.workers += 1;
        }
        ended.requeued += give_back(&mut t.jobs, key, held, false) + give_back(&mut t.jobs, key, unacked, true);
    }
    ended
}
