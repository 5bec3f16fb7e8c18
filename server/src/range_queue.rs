//! The queue of one consumer's batch sequence numbers still to be handed out.

use std::collections::BTreeSet;
use std::ops::Range;

/// Sequence numbers `0..end` of one consumer, handed out lowest first in
/// small ranges, so the batches the trainer needs next are produced first.
/// Numbers given back (their worker's lease expired) go out again before
/// anything new: the in-order stream is waiting for them. A job read as
/// lanes also hands out runs ahead of the lowest ([`take_run`]), so that a
/// worker keeps to its lane.
///
/// [`take_run`]: RangeQueue::take_run
#[derive(Debug, Clone)]
pub(crate) struct RangeQueue {
    /// First sequence number never handed out, but for those in `ahead`.
    next: u64,
    /// One past the last sequence number of the consumer.
    end: u64,
    /// Sequence numbers given back, to hand out again first.
    returned: BTreeSet<u64>,
    /// Sequence numbers above `next` handed out already.
    ahead: BTreeSet<u64>,
}

impl RangeQueue {
    /// A queue whose numbers below `next` were consumed before a restart.
    pub(crate) fn starting_at(next: u64, end: u64) -> Self {
        Self { next: next.min(end), end, returned: BTreeSet::new(), ahead: BTreeSet::new() }
    }

    /// Nothing left to hand out: every number was handed out and none came
    /// back.
    pub(crate) fn is_empty(&self) -> bool {
        self.next >= self.end && self.returned.is_empty()
    }

    /// Takes up to `max` consecutive sequence numbers, lowest first.
    pub(crate) fn take(&mut self, max: u64) -> Option<Range<u64>> {
        if max == 0 {
            return None;
        }
        if let Some(&first) = self.returned.first() {
            let mut end = first;
            while end - first < max && self.returned.remove(&end) {
                end += 1;
            }
            return Some(first..end);
        }
        if self.next >= self.end {
            return None;
        }
        let start = self.next;
        // Up to the next run handed out ahead.
        let stop = self.ahead.first().copied().unwrap_or(self.end);
        self.take_run(start, max.min(stop - start))
    }

    /// Takes up to `max` consecutive given-back sequence numbers, if any.
    pub(crate) fn take_returned(&mut self, max: u64) -> Option<Range<u64>> {
        if self.returned.is_empty() { None } else { self.take(max) }
    }

    /// Sequence numbers never handed out, lowest first, up to `limit` of
    /// them (given-back ones are not among them: they go out first, to
    /// anyone, through [`take`](Self::take)).
    pub(crate) fn fresh(&self, limit: usize) -> impl Iterator<Item = u64> + '_ {
        (self.next..self.end).filter(|s| !self.ahead.contains(s)).take(limit)
    }

    /// Takes `start..start + len` (each never handed out: from
    /// [`fresh`](Self::fresh)), less what was handed out above `start`.
    pub(crate) fn take_run(&mut self, start: u64, len: u64) -> Option<Range<u64>> {
        if start < self.next || start >= self.end || len == 0 || self.ahead.contains(&start) {
            return None;
        }
        let mut stop = start;
        while stop - start < len && stop < self.end && !self.ahead.contains(&stop) {
            stop += 1;
        }
        if start == self.next {
            self.next = stop;
            while self.ahead.remove(&self.next) {
                self.next += 1;
            }
        } else {
            self.ahead.extend(start..stop);
        }
        Some(start..stop)
    }

    /// What [`take`](Self::take) would take now, without taking it.
    pub(crate) fn peek(&self, max: u64) -> Option<Range<u64>> {
        if max == 0 {
            return None;
        }
        if let Some(&first) = self.returned.first() {
            let len = self.returned.range(first..).zip(first..).take_while(|(s, want)| *s == want).count() as u64;
            return Some(first..first + len.min(max));
        }
        let stop = self.ahead.first().copied().unwrap_or(self.end).min(self.next.saturating_add(max));
        (self.next < stop).then_some(self.next..stop)
    }

    /// Whether `seq` is still to be handed out (given back, or never
    /// handed out).
    pub(crate) fn pending(&self, seq: u64) -> bool {
        if seq < self.next { self.returned.contains(&seq) } else { seq < self.end && !self.ahead.contains(&seq) }
    }

    /// Takes exactly `range` if every number of it is still to be handed
    /// out (given back, or never handed out); else takes nothing. For a
    /// shared stream's subscriber that takes the range another one took.
    pub(crate) fn take_exactly(&mut self, range: Range<u64>) -> bool {
        if range.is_empty() || range.end > self.end {
            return false;
        }
        if !range.clone().all(|s| self.pending(s)) {
            return false;
        }
        for s in range.start..range.end.min(self.next) {
            self.returned.remove(&s);
        }
        let fresh = range.start.max(self.next);
        if fresh < range.end {
            self.take_run(fresh, range.end - fresh);
        }
        true
    }

    /// Gives handed-out sequence numbers back, to be handed out again.
    pub(crate) fn give_back(&mut self, seqs: impl IntoIterator<Item = u64>) {
        for s in seqs {
            if s < self.next {
                self.returned.insert(s);
            } else {
                // Handed out ahead: fresh again.
                self.ahead.remove(&s);
            }
        }
    }

    /// Number of sequence numbers handed out and not given back.
    pub(crate) fn handed_out(&self) -> u64 {
        self.next - self.returned.len() as u64 + self.ahead.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_says_what_take_takes() {
        let mut q = RangeQueue::starting_at(0, 10);
        assert_eq!(q.peek(0), None);
        assert_eq!(q.peek(4), Some(0..4));
        assert!(q.take_exactly(2..3));
        assert_eq!((q.peek(4), q.take(4)), (Some(0..2), Some(0..2)));
        q.give_back([0, 1]);
        assert!(q.pending(0) && !q.pending(2) && q.pending(3) && !q.pending(10));
        assert_eq!((q.peek(4), q.take(4)), (Some(0..2), Some(0..2)));
        assert_eq!((q.peek(4), q.take(4)), (Some(3..7), Some(3..7)));
        assert_eq!((q.peek(9), q.take(9)), (Some(7..10), Some(7..10)));
        assert_eq!(q.peek(1), None);
    }

    #[test]
    fn takes_exactly_a_range_still_to_hand_out_or_nothing() {
        let mut q = RangeQueue::starting_at(0, 10);
        assert!(q.take_exactly(0..3));
        assert!(!q.take_exactly(2..4), "2 was handed out");
        assert!(q.take_exactly(5..7), "a run ahead");
        assert_eq!(q.take(10), Some(3..5));
        assert!(!q.take_exactly(9..11), "past the end");
        q.give_back([1, 2, 6]);
        assert!(!q.take_exactly(0..2), "0 is still out");
        assert!(q.take_exactly(1..3));
        assert!(q.take_exactly(6..9), "a given-back number and fresh ones");
        assert_eq!(q.take(10), Some(9..10));
        assert!(q.is_empty());
        assert_eq!(q.handed_out(), 10);
    }

    #[test]
    fn hands_out_in_order_in_bounded_ranges() {
        let mut q = RangeQueue::starting_at(0, 7);
        assert_eq!(q.take(0), None);
        assert_eq!(q.take(3), Some(0..3));
        assert_eq!(q.take(3), Some(3..6));
        assert_eq!(q.take(3), Some(6..7));
        assert_eq!(q.take(3), None);
        assert_eq!(q.handed_out(), 7);
    }

    #[test]
    fn given_back_numbers_go_out_first_in_runs() {
        let mut q = RangeQueue::starting_at(0, 10);
        assert_eq!(q.take(6), Some(0..6));
        q.give_back([4, 1, 2, 9]);
        assert_eq!(q.handed_out(), 3, "9 was never handed out and is not taken back");
        assert_eq!(q.take_returned(5), Some(1..3));
        assert_eq!(q.take(5), Some(4..5));
        assert_eq!(q.take_returned(5), None, "only given-back numbers");
        assert_eq!(q.take(5), Some(6..10));
        assert_eq!(q.take(5), None);
        assert!(q.is_empty());
        q.give_back([7]);
        assert!(!q.is_empty(), "a number given back is to hand out again");
        assert_eq!(q.take(5), Some(7..8));
        assert!(q.is_empty());
    }
}

#[cfg(test)]
mod ahead_tests {
    use super::*;

    #[test]
    fn runs_taken_ahead_are_skipped_and_come_back_fresh() {
        let mut q = RangeQueue::starting_at(0, 12);
        assert_eq!(q.take_run(4, 4), Some(4..8));
        assert_eq!(q.take_run(5, 1), None, "taken");
        assert_eq!(q.fresh(6).collect::<Vec<_>>(), vec![0, 1, 2, 3, 8, 9]);
        assert_eq!(q.take(10), Some(0..4), "the lowest run stops at the one taken ahead");
        assert_eq!(q.handed_out(), 8);
        assert_eq!(q.take(10), Some(8..12), "past it");
        assert!(q.is_empty());
        let mut q = RangeQueue::starting_at(0, 12);
        assert_eq!(q.take_run(4, 4), Some(4..8));
        q.give_back([5, 6]);
        assert_eq!(q.handed_out(), 2);
        assert_eq!(q.take(3), Some(0..3));
        assert_eq!(q.take(9), Some(3..4));
        assert_eq!(q.take(9), Some(5..7), "given back ahead: fresh again");
        assert_eq!(q.take(9), Some(8..12));
        assert!(q.is_empty());
    }
}

#[cfg(test)]
mod restart_tests {
    use super::*;

    #[test]
    fn a_restored_queue_starts_at_the_watermark() {
        let mut q = RangeQueue::starting_at(5, 7);
        assert_eq!(q.take(4), Some(5..7));
        assert_eq!(RangeQueue::starting_at(9, 7).take(1), None);
    }
}
