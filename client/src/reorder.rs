//! The reorder buffer: turns batches arriving from several workers, possibly
//! twice (a re-produced range after a worker's lease expired), into one
//! stream that holds every sequence number exactly once — in order by
//! default, in arrival order on request.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Why an arriving item was not kept. The caller still owes the stream its
/// credit back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// That sequence number is already waiting in the buffer.
    Duplicate,
    /// That sequence number was already yielded.
    Late,
}

/// Items keyed by sequence number, with a record of what was yielded.
#[derive(Debug)]
pub(crate) struct Reorder<T> {
    /// Yield strictly by `seq` (true) or by arrival (false).
    in_order: bool,
    /// Every `seq` below this was yielded: the consumed watermark.
    watermark: u64,
    /// Sequence numbers above the watermark already yielded (only ever
    /// non-empty out of order), so a late copy is still recognised.
    yielded_above: BTreeSet<u64>,
    /// Items waiting to be yielded.
    pending: BTreeMap<u64, T>,
    /// Arrival order of `pending`, for out-of-order mode.
    arrival: VecDeque<u64>,
}

impl<T> Reorder<T> {
    /// An empty buffer expecting `seq` 0 first.
    pub(crate) fn new(in_order: bool) -> Self {
        Self {
            in_order,
            watermark: 0,
            yielded_above: BTreeSet::new(),
            pending: BTreeMap::new(),
            arrival: VecDeque::new(),
        }
    }

    /// A buffer for a consumer resumed from a saved state: every `seq` below
    /// `watermark`, and those in `yielded_above`, were yielded before.
    pub(crate) fn resuming(in_order: bool, watermark: u64, yielded_above: BTreeSet<u64>) -> Self {
        let mut r = Self::new(in_order);
        r.watermark = watermark;
        r.yielded_above = yielded_above;
        // A state never lists the watermark itself, but be safe.
        while r.yielded_above.remove(&r.watermark) {
            r.watermark += 1;
        }
        r
    }

    /// Sequence numbers above the watermark already yielded.
    pub(crate) fn yielded_above(&self) -> &BTreeSet<u64> {
        &self.yielded_above
    }

    /// Accepts `item` for `seq`, or hands it back when it is a duplicate or
    /// was already yielded.
    pub(crate) fn insert(&mut self, seq: u64, item: T) -> Result<(), (Dropped, T)> {
        if seq < self.watermark || self.yielded_above.contains(&seq) {
            return Err((Dropped::Late, item));
        }
        if self.pending.contains_key(&seq) {
            return Err((Dropped::Duplicate, item));
        }
        self.pending.insert(seq, item);
        if !self.in_order {
            self.arrival.push_back(seq);
        }
        Ok(())
    }

    /// The next item to yield, if it has arrived.
    pub(crate) fn pop(&mut self) -> Option<(u64, T)> {
        let seq = if self.in_order {
            *self
                .pending
                .first_key_value()
                .filter(|(s, _)| **s == self.watermark)?
                .0
        } else {
            self.arrival.pop_front()?
        };
        let item = self.pending.remove(&seq)?;
        self.mark_yielded(seq);
        Some((seq, item))
    }

    fn mark_yielded(&mut self, seq: u64) {
        if seq != self.watermark {
            self.yielded_above.insert(seq);
            return;
        }
        self.watermark += 1;
        while self.yielded_above.remove(&self.watermark) {
            self.watermark += 1;
        }
    }

    /// Whether items are yielded by `seq`.
    pub(crate) fn in_order(&self) -> bool {
        self.in_order
    }

    /// All `seq < watermark` were yielded: what the heartbeat reports.
    pub(crate) fn watermark(&self) -> u64 {
        self.watermark
    }

    /// Items waiting, lowest `seq` first.
    pub(crate) fn pending_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut T> {
        self.pending.values_mut()
    }

    /// Items waiting (arrived but not yielded).
    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain<T>(r: &mut Reorder<T>) -> Vec<u64> {
        std::iter::from_fn(|| r.pop().map(|(s, _)| s)).collect()
    }

    #[test]
    fn in_order_holds_back_until_the_gap_fills() {
        let mut r = Reorder::new(true);
        for s in [2, 1, 4] {
            r.insert(s, ()).expect("new");
        }
        assert_eq!(drain(&mut r), Vec::<u64>::new());
        r.insert(0, ()).expect("new");
        assert_eq!(drain(&mut r), vec![0, 1, 2]);
        assert_eq!(r.watermark(), 3);
        r.insert(3, ()).expect("new");
        assert_eq!(drain(&mut r), vec![3, 4]);
        assert_eq!((r.watermark(), r.len()), (5, 0));
    }

    #[test]
    fn out_of_order_yields_by_arrival_and_tracks_the_watermark() {
        let mut r = Reorder::new(false);
        for s in [2, 0, 3] {
            r.insert(s, ()).expect("new");
        }
        assert_eq!(drain(&mut r), vec![2, 0, 3]);
        assert_eq!(r.watermark(), 1);
        r.insert(1, ()).expect("new");
        assert_eq!(drain(&mut r), vec![1]);
        assert_eq!(r.watermark(), 4);
    }

    #[test]
    fn a_resumed_buffer_drops_what_was_yielded_before() {
        let mut r = Reorder::resuming(false, 3, BTreeSet::from([5]));
        for s in [0, 2, 5] {
            assert_eq!(r.insert(s, ()), Err((Dropped::Late, ())), "{s}");
        }
        for s in [4, 3, 6] {
            r.insert(s, ()).expect("new");
        }
        assert_eq!(drain(&mut r), vec![4, 3, 6]);
        assert_eq!(r.watermark(), 7);
        let mut r = Reorder::resuming(true, 3, BTreeSet::new());
        assert_eq!(r.insert(1, ()), Err((Dropped::Late, ())));
        r.insert(4, ()).expect("new");
        r.insert(3, ()).expect("new");
        assert_eq!(drain(&mut r), vec![3, 4]);
    }

    #[test]
    fn duplicates_and_late_copies_are_handed_back() {
        for in_order in [true, false] {
            let mut r = Reorder::new(in_order);
            r.insert(0, "a").expect("new");
            r.insert(1, "b").expect("new");
            assert_eq!(r.insert(1, "b2"), Err((Dropped::Duplicate, "b2")));
            assert_eq!(r.pop(), Some((0, "a")));
            assert_eq!(r.insert(0, "a2"), Err((Dropped::Late, "a2")));
            if !in_order {
                r.insert(5, "f").expect("new");
            }
            assert_eq!(r.pop(), Some((1, "b")));
            if !in_order {
                assert_eq!(r.pop(), Some((5, "f")));
                // Yielded above the watermark: still recognised as late.
                assert_eq!(r.insert(5, "f2"), Err((Dropped::Late, "f2")));
                assert_eq!(r.watermark(), 2);
            }
            assert_eq!(r.pop(), None);
        }
    }
}
