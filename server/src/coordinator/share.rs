//! Shared streams (`JobSpec.shared`): batches made once for several
//! subscribers.
//!
//! Every trainer on a shared stream is a subscriber: a consumer of its own
//! (its own queue, deliveries and watermark) that receives the batches of a
//! rank. When a worker takes a range for one subscriber, every other
//! subscriber of the same rank that still has exactly that range to hand
//! out, and is no further than the lag allowed behind the subscriber
//! furthest ahead, takes it too: the worker makes the batches once and
//! delivers a copy to each. Anything else a subscriber needs (the part
//! before it joined, batches taken back from a dead worker that the others
//! already had, everything once it trails too far) is made for it alone, so
//! no subscriber ever has a gap and none holds the others back.

use std::ops::Range;

use loader_proto::ConsumerKey;

use super::{Tables, backup};

use crate::jobs::JobState;

/// How many batches a range of `primary`'s may hold for the others of its
/// rank to take it too: the least room (`room_of`, 0 for a subscriber that
/// cannot take any) of those within the lag that have some. Unbounded for
/// a job that is not a shared stream, or when no other subscriber has room
/// (a stuck one does not stop the others).
pub(super) fn room(job: &JobState, primary: usize, room_of: impl Fn(u32) -> u64) -> u64 {
    let Some(lag) = job.shared_max_lag() else { return u64::MAX };
    let Some(rank) = job.consumers.get(primary).and_then(|c| c.subscribes_to) else { return u64::MAX };
    let members = |c: &&crate::jobs::ConsumerState| c.subscribes_to == Some(rank) && !c.left;
    let lead = job.consumers.iter().filter(members).map(|c| c.consumed).max().unwrap_or(0);
    job.consumers
        .iter()
        .enumerate()
        .filter(|(k, c)| *k != primary && members(c) && lead.saturating_sub(c.consumed) <= lag)
        .map(|(k, _)| room_of(k as u32))
        .filter(|&r| r > 0)
        .min()
        .unwrap_or(u64::MAX)
}

/// The other subscribers of `primary`'s rank that take `range` with it,
/// taken from their queues: each is still there, within the job's lag of
/// the subscriber furthest ahead, has exactly `range` still to hand out,
/// and `can_take` it (its trainer is there, this worker may send it the
/// range). Empty for a job that is not a shared stream, or for a rank.
pub(super) fn copies(job: &mut JobState, primary: usize, range: &Range<u64>, can_take: impl Fn(u32) -> bool) -> Vec<u32> {
    let Some(lag) = job.shared_max_lag() else { return Vec::new() };
    let Some(rank) = job.consumers.get(primary).and_then(|c| c.subscribes_to) else { return Vec::new() };
    let members = |c: &crate::jobs::ConsumerState| c.subscribes_to == Some(rank) && !c.left;
    let lead = job.consumers.iter().filter(|c| members(c)).map(|c| c.consumed).max().unwrap_or(0);
    let mut taken = Vec::new();
    for (k, c) in job.consumers.iter_mut().enumerate() {
        if k == primary || !members(c) || lead.saturating_sub(c.consumed) > lag || !can_take(k as u32) {
            continue;
        }
        if c.queue.take_exactly(range.clone()) {
            taken.push(k as u32);
        }
    }
    taken
}

/// The other subscribers of `primary`'s rank whose backups copy exactly the
/// batches `ranges` of `primary`'s backup, which worker `worker_id` takes
/// (a late batch of a shared stream is late for every subscriber waiting on
/// it, and each trainer asks for a backup): taken with it, so the copy is
/// made once. Empty when `ranges` is.
pub(super) fn backup_copies(
    job: &mut JobState,
    primary: usize,
    ranges: &[Range<u64>],
    worker_id: u64,
    can_take: impl Fn(u32) -> bool,
) -> Vec<u32> {
    if ranges.is_empty() || job.shared_max_lag().is_none() {
        return Vec::new();
    }
    let Some(c) = job.consumers.get(primary) else { return Vec::new() };
    let (Some(rank), Some(original)) = (c.subscribes_to, c.backup.as_ref().map(|b| b.original)) else {
        return Vec::new();
    };
    let mut taken = Vec::new();
    for (k, c) in job.consumers.iter_mut().enumerate() {
        let same = c.backup.as_ref().is_some_and(|b| {
            b.original == original && b.copy.is_none() && b.seqs.iter().copied().eq(ranges.iter().cloned().flatten())
        });
        if k == primary || c.subscribes_to != Some(rank) || c.left || !same || !can_take(k as u32) {
            continue;
        }
        if backup::take(c, worker_id).is_some() {
            taken.push(k as u32);
        }
    }
    taken
}

/// The other subscribers of `key`'s rank on its shared stream that are
/// still there; none for a job that is not one.
pub(super) fn group(t: &Tables, key: ConsumerKey) -> Vec<ConsumerKey> {
    let Ok(job) = t.jobs.get(key.0) else { return Vec::new() };
    let Some(rank) = job.consumers.get(key.1 as usize).and_then(|c| c.subscribes_to) else { return Vec::new() };
    job.consumers
        .iter()
        .enumerate()
        .filter(|&(k, c)| k as u32 != key.1 && c.subscribes_to == Some(rank) && !c.left)
        .map(|(k, _)| (key.0, k as u32))
        .collect()
}
