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

use crate::jobs::JobState;

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
