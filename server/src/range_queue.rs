//! The queue of one consumer's batch sequence numbers still to be handed out.

use std::ops::Range;

/// Sequence numbers `0..end` of one consumer, handed out lowest first in
/// small ranges, so the batches the trainer needs next are produced first.
#[derive(Debug, Clone)]
pub(crate) struct RangeQueue {
    /// First sequence number never handed out.
    next: u64,
    /// One past the last sequence number of the consumer.
    end: u64,
}

impl RangeQueue {
    pub(crate) fn new(end: u64) -> Self {
        Self { next: 0, end }
    }

    /// Takes up to `max` consecutive sequence numbers, lowest first.
    pub(crate) fn take(&mut self, max: u64) -> Option<Range<u64>> {
        if max == 0 || self.next >= self.end {
            return None;
        }
        let start = self.next;
        self.next = (start + max).min(self.end);
        Some(start..self.next)
    }

    /// Number of sequence numbers handed out.
    pub(crate) fn handed_out(&self) -> u64 {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_in_order_in_bounded_ranges() {
        let mut q = RangeQueue::new(7);
        assert_eq!(q.take(0), None);
        assert_eq!(q.take(3), Some(0..3));
        assert_eq!(q.take(3), Some(3..6));
        assert_eq!(q.take(3), Some(6..7));
        assert_eq!(q.take(3), None);
        assert_eq!(q.handed_out(), 7);
    }
}
