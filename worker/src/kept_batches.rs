//! [`KeptBatches`]: a shared stream's batches kept after they were sent,
//! for its subscribers that trail.
//!
//! Trainers subscribed to one shared stream rarely read in step: one
//! starts a second later, another's step is slower. A batch made for the
//! ones ahead is copied to those close behind them; one further behind
//! would only have its ring filled with batches it cannot read yet. So the
//! worker keeps what it made, up to a budget (`--keep-shared`) and for at
//! most [`KEPT_FOR`], and the coordinator sends a trailing subscriber's
//! ranges to the worker that made them (`server/src/kept_ranges.rs`),
//! which serves them from here instead of making them again. A batch of a
//! shared stream is the same bytes for every subscriber (same samples,
//! same seeds), so serving a kept one is exactly making it again, less the
//! work. The oldest batches go first when the budget is full; one that is
//! gone is simply made again.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use bytes::Bytes;
use loader_job::window::KEPT_FOR;

/// Which batch: job, rank, sequence number.
type Key = (u64, u32, u64);

/// A kept batch: its bytes (the header names the rank, not a subscriber)
/// and the samples it holds.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub(crate) bytes: Bytes,
    pub(crate) samples: u64,
}

/// Recent batches of shared streams, oldest first out.
#[derive(Debug)]
pub(crate) struct KeptBatches {
    budget: u64,
    held: u64,
    /// Each batch with the serial number of its latest `keep`.
    batches: BTreeMap<Key, (Kept, u64)>,
    /// Keys in the order they came, with their serial numbers and when.
    order: VecDeque<(Key, u64, Instant)>,
    serial: u64,
}

impl KeptBatches {
    /// Keeps at most `budget` bytes of batches (0: none).
    pub(crate) fn new(budget: u64) -> Self {
        Self { budget, held: 0, batches: BTreeMap::new(), order: VecDeque::new(), serial: 0 }
    }

    /// Keeps batch `seq` of `rank` of `job_id`, made at `now`, letting the
    /// oldest go to stay in the budget. A batch larger than the whole
    /// budget is not kept.
    pub(crate) fn keep(&mut self, (job_id, rank, seq): Key, kept: Kept, now: Instant) {
        let len = kept.bytes.len() as u64;
        if len > self.budget {
            return;
        }
        self.serial += 1;
        if let Some((old, _)) = self.batches.insert((job_id, rank, seq), (kept, self.serial)) {
            self.held -= old.bytes.len() as u64;
        }
        self.held += len;
        self.order.push_back(((job_id, rank, seq), self.serial, now));
        self.let_go(now);
        while self.held > self.budget {
            self.drop_oldest();
        }
    }

    /// The kept batch `seq` of `rank` of `job_id`, if it is still here.
    pub(crate) fn get(&mut self, key: Key, now: Instant) -> Option<Kept> {
        self.let_go(now);
        self.batches.get(&key).map(|(kept, _)| kept.clone())
    }

    /// Whether batch `seq` of `rank` of `job_id` is kept (until its time
    /// is up).
    pub(crate) fn has(&self, key: Key) -> bool {
        self.batches.contains_key(&key)
    }

    /// Bytes kept.
    pub(crate) fn held(&self) -> u64 {
        self.held
    }

    /// Lets go of batches kept longer than [`KEPT_FOR`] by `now`.
    pub(crate) fn let_go(&mut self, now: Instant) {
        while self.order.front().is_some_and(|&(_, _, at)| now.saturating_duration_since(at) > KEPT_FOR) {
            self.drop_oldest();
        }
    }

    fn drop_oldest(&mut self) {
        let Some((key, serial, _)) = self.order.pop_front() else { return };
        // A batch kept again later has a newer entry: this one is stale.
        if self.batches.get(&key).is_some_and(|&(_, latest)| latest == serial)
            && let Some((old, _)) = self.batches.remove(&key)
        {
            self.held -= old.bytes.len() as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn batch(len: usize) -> Kept {
        Kept { bytes: Bytes::from(vec![7u8; len]), samples: 1 }
    }

    #[test]
    fn the_oldest_batches_go_first_to_stay_in_the_budget() {
        let now = Instant::now();
        let mut kept = KeptBatches::new(300);
        for seq in 0..3 {
            kept.keep((1, 0, seq), batch(100), now);
        }
        assert!(kept.get((1, 0, 0), now).is_some());
        kept.keep((1, 0, 3), batch(100), now);
        assert!(kept.get((1, 0, 0), now).is_none(), "the oldest went");
        assert_eq!(kept.get((1, 0, 3), now).map(|k| k.bytes.len()), Some(100));
        assert_eq!(kept.held(), 300);
        // Another rank and job are other batches.
        assert!(kept.get((1, 1, 3), now).is_none() && kept.get((2, 0, 3), now).is_none());
        // Larger than the budget: not kept, nothing let go for it.
        kept.keep((1, 0, 9), batch(301), now);
        assert!(kept.get((1, 0, 9), now).is_none());
        assert_eq!(kept.held(), 300);
    }

    #[test]
    fn a_batch_kept_again_stays_and_is_counted_once() {
        let now = Instant::now();
        let mut kept = KeptBatches::new(250);
        kept.keep((1, 0, 0), batch(100), now);
        kept.keep((1, 0, 1), batch(100), now);
        kept.keep((1, 0, 0), batch(100), now);
        assert_eq!(kept.held(), 200);
        kept.keep((1, 0, 2), batch(100), now);
        // 1 went (the oldest); 0 was kept again after it.
        assert!(kept.get((1, 0, 1), now).is_none());
        assert!(kept.get((1, 0, 0), now).is_some() && kept.get((1, 0, 2), now).is_some());
        assert_eq!(kept.held(), 200);
    }

    #[test]
    fn batches_go_after_a_while() {
        let now = Instant::now();
        let mut kept = KeptBatches::new(1 << 20);
        kept.keep((1, 0, 0), batch(10), now);
        kept.keep((2, 0, 0), batch(10), now + KEPT_FOR);
        assert!(kept.get((1, 0, 0), now + KEPT_FOR).is_some());
        assert!(kept.get((1, 0, 0), now + KEPT_FOR + Duration::from_millis(1)).is_none());
        assert_eq!(kept.held(), 10);
        kept.let_go(now + KEPT_FOR * 2 + Duration::from_millis(1));
        assert_eq!(kept.held(), 0);
    }

    #[test]
    fn a_budget_of_zero_keeps_nothing() {
        let now = Instant::now();
        let mut kept = KeptBatches::new(0);
        kept.keep((1, 0, 0), batch(1), now);
        assert!(kept.get((1, 0, 0), now).is_none());
        assert_eq!(kept.held(), 0);
    }
}
