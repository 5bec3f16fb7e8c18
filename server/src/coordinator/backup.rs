//! Backup tasks for stragglers. The in-order trainer waits on one batch at
//! a time; when it has waited on one past its lateness threshold (a
//! multiple of its recent waits, with a floor: the trainer judges, it sees
//! the waits) it says so in its heartbeat, and the batches the slow worker
//! holds for that trainer from that one on are given to a second worker as
//! well: all of them, since the trainer will wait on each in turn, and one
//! wait past the threshold is all a stalled worker may cost.
//! Whichever copy is reported delivered first counts; the other holder's
//! claim on those batches is dropped at once, so its late report counts for
//! nothing, and the trainer keeps the first copy that arrives (its
//! de-duplication of re-sent batches). One backup per consumer at a time,
//! and at most a share of the consumer's work, so a slow pipeline does not
//! make everything twice; and none while the consumer's backups mostly
//! lost, which is what they do when every worker is slow alike (the
//! trainer then waits on each batch past its threshold, and each original
//! arrives before its copy).

use std::collections::BTreeSet;
use std::ops::Range;

use loader_proto::ConsumerKey;

use super::Tables;
use crate::jobs::{Backup, ConsumerState};

/// Backups may copy at most 1 in this many of a consumer's delivered
/// batches (plus [`ALLOWANCE`]): speculation stays a share of the work.
const SHARE: u64 = 4;
/// Backup batches every consumer may launch before its share counts.
const ALLOWANCE: u64 = 64;

/// Wasted backup batches a consumer may have before its record counts.
const WASTED_GRACE: u64 = 16;
/// No new backup while wasted backup batches outnumber won ones by this
/// factor (past [`WASTED_GRACE`]).
const WASTED_RATIO: u64 = 2;

/// Launches a backup of `key`'s late batch `seq` (and the next few its
/// worker holds), when none runs and the share allows. Returns the worker
/// that held it and how many batches the backup copies, if launched.
pub(super) fn launch(t: &mut Tables, key: ConsumerKey, seq: u64) -> Option<(u64, u64)> {
    let c = t.jobs.get_mut(key.0)?.consumers.get_mut(key.1 as usize)?;
    let allowance = ALLOWANCE + c.delivered / SHARE;
    if c.backup.is_some() || seq < c.consumed || c.backups.launched >= allowance {
        return None;
    }
    if c.backups.wasted > WASTED_GRACE && c.backups.wasted > WASTED_RATIO * c.backups.won {
        return None;
    }
    // The late batch is with a worker that has not made it yet, or that
    // sent it on a stream the trainer does not receive (a silent path).
    let holds = |w: &crate::workers::WorkerState, s: &u64| {
        w.outstanding.get(&key).is_some_and(|h| h.contains(s)) || w.unacked.get(&key).is_some_and(|h| h.contains(s))
    };
    let (&original, slow) = t.workers.workers.iter().find(|(_, w)| holds(w, &seq))?;
    // A worker that never delivered a batch is starting up (a Python
    // worker importing torch), not straggling: a copy elsewhere would
    // compete with the other workers' own start-up. It has delivered if
    // the trainer consumed a batch it still holds here (its report of it
    // comes with its next heartbeat).
    let consumed_from = |h: Option<&BTreeSet<u64>>| h.is_some_and(|h| h.range(..c.consumed).next().is_some());
    if slow.delivered == 0 && !consumed_from(slow.outstanding.get(&key)) && !consumed_from(slow.unacked.get(&key)) {
        return None;
    }
    // Someone else must be able to make the copy.
    if !t.workers.workers.iter().any(|(id, w)| *id != original && !w.draining && !w.cut_off.contains(&key)) {
        return None;
    }
    let room = (allowance - c.backups.launched) as usize;
    let w = t.workers.workers.get_mut(&original)?;
    let mut seqs: BTreeSet<u64> = w.outstanding.get(&key).map(|h| h.range(seq..).copied().collect()).unwrap_or_default();
    let sent: BTreeSet<u64> = w.unacked.get(&key).map(|h| h.range(seq..).copied().collect()).unwrap_or_default();
    seqs.extend(&sent);
    let seqs: BTreeSet<u64> = seqs.into_iter().take(room).collect();
    // Those it sent count as delivered already: its copy is a re-send, and
    // the worker will not report them again.
    let resend: BTreeSet<u64> = sent.intersection(&seqs).copied().collect();
    if let Some(unacked) = w.unacked.get_mut(&key) {
        unacked.retain(|s| !resend.contains(s));
    }
    let n = seqs.len() as u64;
    c.backups.launched += n;
    c.backup = Some(Backup { original, copy: None, seqs, resend });
    crate::meters::backup("launched", n);
    Some((original, n))
}

/// The ranges worker `worker_id` makes as `c`'s backup (the batches
/// neither holder delivered yet, in runs), if a backup waits for a copy
/// and this worker is not the one it backs up. Marks it taken.
pub(super) fn take(c: &mut ConsumerState, worker_id: u64) -> Option<Vec<Range<u64>>> {
    let b = c.backup.as_mut()?;
    if b.copy.is_some() || b.original == worker_id || b.seqs.is_empty() {
        return None;
    }
    b.copy = Some(worker_id);
    let mut runs: Vec<Range<u64>> = Vec::new();
    for &s in &b.seqs {
        match runs.last_mut() {
            Some(run) if run.end == s => run.end += 1,
            _ => runs.push(s..s + 1),
        }
    }
    Some(runs)
}

/// Worker `worker_id` was credited with delivering `seqs` of `key`: those a
/// backup copies are settled (the other holder's claim dropped, the
/// outcome counted), and a backup with nothing left ends.
pub(super) fn delivered(t: &mut Tables, key: ConsumerKey, worker_id: u64, seqs: &[u64]) {
    let Some(c) = t.jobs.get_mut(key.0).and_then(|j| j.consumers.get_mut(key.1 as usize)) else { return };
    let Some(b) = c.backup.as_mut() else { return };
    for s in seqs {
        if !b.seqs.remove(s) {
            continue;
        }
        if b.resend.remove(s) {
            // Delivered before (the original's copy never arrived): this
            // one is delivered again, and it is all the trainer gets.
            c.resent += 1;
            c.backups.won += 1;
            crate::meters::backup("won", 1);
            continue;
        }
        // The other holder, and whether the copy came first.
        let (other, won) = if worker_id == b.original {
            (b.copy, false)
        } else if Some(worker_id) == b.copy {
            (Some(b.original), true)
        } else {
            (None, false)
        };
        if let Some(other) = other {
            if let Some(held) = t.workers.workers.get_mut(&other).and_then(|w| w.outstanding.get_mut(&key)) {
                held.remove(s);
            }
            if won {
                c.backups.won += 1;
            } else {
                c.backups.wasted += 1;
            }
            crate::meters::backup(if won { "won" } else { "wasted" }, 1);
        }
    }
    if b.seqs.is_empty() {
        c.backup = None;
    }
}

/// Ends `key`'s backup if worker `worker_id` is one of its holders (it
/// died, or its trainer cannot reach it): the other keeps what it holds
/// as an ordinary task. Returns the re-sends nobody makes any more (the
/// backup's copy was not taken yet, and the original had sent them into a
/// stream that never arrived), except those in `own` (what `worker_id`
/// holds, which its caller gives back): they must go back to the queue.
pub(super) fn forget_worker(t: &mut Tables, key: ConsumerKey, worker_id: u64, own: &BTreeSet<u64>) -> Vec<u64> {
    let Some(c) = t.jobs.get_mut(key.0).and_then(|j| j.consumers.get_mut(key.1 as usize)) else { return Vec::new() };
    if !c.backup.as_ref().is_some_and(|b| b.original == worker_id || b.copy == Some(worker_id)) {
        return Vec::new();
    }
    let Some(b) = c.backup.take() else { return Vec::new() };
    b.resend
        .into_iter()
        .filter(|s| {
            !own.contains(s)
                && !t.workers.workers.iter().any(|(id, w)| *id != worker_id && w.outstanding.get(&key).is_some_and(|h| h.contains(s)))
        })
        .collect()
}

/// The consumers whose backup involves worker `worker_id`.
pub(super) fn involving(t: &Tables, worker_id: u64) -> Vec<ConsumerKey> {
    t.jobs
        .iter()
        .flat_map(|j| {
            let job_id = j.job.job_id;
            j.consumers.iter().enumerate().filter_map(move |(c, s)| {
                s.backup
                    .as_ref()
                    .is_some_and(|b| b.original == worker_id || b.copy == Some(worker_id))
                    .then_some((job_id, c as u32))
            })
        })
        .collect()
}

/// Of `seqs` of `key`, those no worker but `worker_id` holds: what may go
/// back to the queue when `worker_id` lets go of them (a backup's other
/// holder still makes the rest).
pub(super) fn held_only_by(t: &Tables, key: ConsumerKey, worker_id: u64, seqs: impl IntoIterator<Item = u64>) -> Vec<u64> {
    seqs.into_iter()
        .filter(|s| {
            !t.workers
                .workers
                .iter()
                .any(|(id, w)| *id != worker_id && w.outstanding.get(&key).is_some_and(|h| h.contains(s)))
        })
        .collect()
}
