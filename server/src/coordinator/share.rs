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
//!
//! A copy goes only to a subscriber that will read it soon: one whose
//! first batch still to hand out is less than `ahead` batches (a window)
//! before the range. A subscriber
//! further behind (started later, or slower) would only have its ring
//! filled with batches it cannot read yet, while the ones it needs first
//! wait for room; it reads them later from the worker that made them,
//! which keeps them for it (`kept_ranges`).

use std::ops::Range;

use crate::jobs::JobState;

/// Whether consumer `c` of `job` is a subscriber of a shared stream.
pub(super) fn is_subscriber(job: &JobState, c: usize) -> bool {
    job.consumers.get(c).is_some_and(|c| c.subscribes_to.is_some())
}

/// How many batches `primary` takes next (at most `max`) so that its range
/// lines up with the other subscribers of its rank that `can_take` and are
/// within the lag: it ends where any of them goes from having a batch
/// still to hand out to not, or back. A subscriber a few batches out of
/// step with another takes the part the other is past alone, and then
/// ranges both take: without the cut, neither would ever take the other's
/// range whole, and both would be made alone for the rest of the job
/// (measured: three of four subscribers made alone almost throughout).
pub(super) fn aligned_len(job: &JobState, primary: usize, max: u64, ahead: u64, can_take: impl Fn(u32) -> bool) -> u64 {
    let Some(lag) = job.shared_max_lag() else { return max };
    let Some(me) = job.consumers.get(primary) else { return max };
    let (Some(rank), Some(range)) = (me.subscribes_to, me.queue.peek(max)) else { return max };
    let members = |c: &&crate::jobs::ConsumerState| c.subscribes_to == Some(rank) && !c.left;
    let lead = job.consumers.iter().filter(members).map(|c| c.consumed).max().unwrap_or(0);
    let others: Vec<&crate::jobs::ConsumerState> = job
        .consumers
        .iter()
        .enumerate()
        .filter(|(k, c)| {
            *k != primary
                && members(c)
                && lead.saturating_sub(c.consumed) <= lag
                && range.start < next_pending(c).saturating_add(ahead)
                && can_take(*k as u32)
        })
        .map(|(_, c)| c)
        .collect();
    let first: Vec<bool> = others.iter().map(|c| c.queue.pending(range.start)).collect();
    (range.start + 1..range.end)
        .find(|&s| others.iter().zip(&first).any(|(c, &f)| c.queue.pending(s) != f))
        .map_or(max, |cut| cut - range.start)
}

/// The other subscribers of `primary`'s rank that take `range` with it,
/// taken from their queues: each is still there, within the job's lag of
/// the subscriber furthest ahead, its first batch to hand out less than
/// `ahead` before the range,
/// has exactly `range` still to hand out,
/// and `can_take` it (its trainer is there, this worker may send it the
/// range). Empty for a job that is not a shared stream, or for a rank.
pub(super) fn copies(job: &mut JobState, primary: usize, range: &Range<u64>, ahead: u64, can_take: impl Fn(u32) -> bool) -> Vec<u32> {
    let Some(lag) = job.shared_max_lag() else { return Vec::new() };
    let Some(rank) = job.consumers.get(primary).and_then(|c| c.subscribes_to) else { return Vec::new() };
    let members = |c: &crate::jobs::ConsumerState| c.subscribes_to == Some(rank) && !c.left;
    let lead = job.consumers.iter().filter(|c| members(c)).map(|c| c.consumed).max().unwrap_or(0);
    let mut taken = Vec::new();
    for (k, c) in job.consumers.iter_mut().enumerate() {
        if k == primary
            || !members(c)
            || lead.saturating_sub(c.consumed) > lag
            || range.start >= next_pending(c).saturating_add(ahead)
            || !can_take(k as u32)
        {
            continue;
        }
        if c.queue.take_exactly(range.clone()) {
            taken.push(k as u32);
        }
    }
    taken
}

/// Whether the worker that makes `range` for `primary` (and `copies`)
/// should keep it: another subscriber of the rank still has it to hand
/// out and did not take it as a copy (it is behind, or has no room now:
/// it will need it later), or
/// `primary` is alone on the stream so far (the other trials of a sweep
/// start a moment later, and need what it got first).
pub(super) fn needed_later(job: &JobState, primary: usize, range: &Range<u64>, copies: &[u32]) -> bool {
    let Some(rank) = job.consumers.get(primary).and_then(|c| c.subscribes_to) else { return false };
    let mut others = job
        .consumers
        .iter()
        .enumerate()
        .filter(|(k, c)| *k != primary && c.subscribes_to == Some(rank) && !c.left)
        .peekable();
    others.peek().is_none()
        || others.any(|(k, c)| {
            !copies.contains(&(k as u32)) && c.queue.pending(range.start)
        })
}

/// The first batch still to hand out to subscriber `c`: where its
/// assignments are, which moves with every range it takes (its consumed
/// watermark comes with its trainer's heartbeats, up to hundreds of
/// batches late for a fast trainer).
fn next_pending(c: &crate::jobs::ConsumerState) -> u64 {
    c.queue.peek(1).map_or(u64::MAX, |r| r.start)
}
