//! [`KeptRanges`]: which worker keeps which recent batches of a shared
//! stream, so that a subscriber that trails the others is sent to the
//! worker holding what it needs next instead of having it made again.
//!
//! Workers keep the batches of a shared stream they made for a while
//! (`loader-worker --keep-shared`, `worker/src/kept_batches.rs`). The
//! coordinator records where each range of a rank went; when a trailing
//! or late subscriber's next range is one a worker made, only that worker
//! is given it, and serves it from memory (or makes it again, when it has
//! let it go: the routing is a hint, never a promise). An entry older than
//! [`KEPT_FOR`] routes nothing, so a subscriber never waits on a worker
//! for long: after that any worker may make its range.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use tokio::time::Instant;

/// How long a range routes its subscribers to the worker that made it.
/// Workers keep batches as long ([`loader_job::window::KEPT_FOR`]), and
/// trainers started together or seconds apart trail each other by far
/// less.
pub(crate) const KEPT_FOR: Duration = loader_job::window::KEPT_FOR;

/// Most ranges recorded per job; the oldest go first.
const MAX_RANGES: usize = 1 << 16;

/// Where the recent ranges of a shared stream's ranks were made.
#[derive(Debug, Default)]
pub(crate) struct KeptRanges {
    /// By (rank, first seq): one past the last seq, the worker, and when.
    ranges: BTreeMap<(u32, u64), Made>,
}

#[derive(Debug, Clone, Copy)]
struct Made {
    end: u64,
    worker_id: u64,
    at: Instant,
}

/// Where a subscriber's next range should be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Any worker: nobody keeps it.
    Anywhere,
    /// This worker keeps the batches up to (not including) this seq.
    Here { until: u64 },
    /// Another worker keeps them: leave the range to it (and wake it: its
    /// long poll may not end for a heartbeat interval otherwise).
    Elsewhere { worker_id: u64 },
}

impl KeptRanges {
    /// Records that `worker_id` made `range` of `rank` at `now`.
    pub(crate) fn made(&mut self, rank: u32, range: &Range<u64>, worker_id: u64, now: Instant) {
        if range.is_empty() {
            return;
        }
        self.ranges.insert((rank, range.start), Made { end: range.end, worker_id, at: now });
        if self.ranges.len() > MAX_RANGES {
            self.forget_older_than(now);
        }
        while self.ranges.len() > MAX_RANGES {
            let oldest = self.ranges.iter().min_by_key(|(_, m)| m.at).map(|(&k, _)| k);
            oldest.map(|k| self.ranges.remove(&k));
        }
    }

    /// Where a range of `rank` starting at `start` should be made, asked
    /// by worker `worker_id` at `now`.
    pub(crate) fn route(&self, rank: u32, start: u64, worker_id: u64, now: Instant) -> Route {
        let Some((_, made)) = self.ranges.range((rank, 0)..=(rank, start)).next_back() else {
            return Route::Anywhere;
        };
        if made.end <= start || now.saturating_duration_since(made.at) > KEPT_FOR {
            return Route::Anywhere;
        }
        if made.worker_id == worker_id { Route::Here { until: made.end } } else { Route::Elsewhere { worker_id: made.worker_id } }
    }

    /// Forgets what `worker_id` made: it left, drains, or a trainer cannot
    /// reach it.
    pub(crate) fn forget_worker(&mut self, worker_id: u64) {
        self.ranges.retain(|_, m| m.worker_id != worker_id);
    }

    /// Forgets ranges made before `now - KEPT_FOR`.
    fn forget_older_than(&mut self, now: Instant) {
        self.ranges.retain(|_, m| now.saturating_duration_since(m.at) <= KEPT_FOR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_routes_to_the_worker_that_made_it_until_it_is_stale() {
        let now = Instant::now();
        let mut kept = KeptRanges::default();
        kept.made(0, &(8..12), 1, now);
        kept.made(0, &(12..16), 2, now);
        kept.made(1, &(8..12), 3, now);
        assert_eq!(kept.route(0, 10, 1, now), Route::Here { until: 12 });
        assert_eq!(kept.route(0, 10, 2, now), Route::Elsewhere { worker_id: 1 });
        assert_eq!(kept.route(0, 12, 2, now), Route::Here { until: 16 });
        assert_eq!(kept.route(1, 8, 3, now), Route::Here { until: 12 });
        // Before, between and past the recorded ranges: anyone.
        assert_eq!(kept.route(0, 7, 2, now), Route::Anywhere);
        assert_eq!(kept.route(0, 16, 2, now), Route::Anywhere);
        assert_eq!(kept.route(2, 8, 2, now), Route::Anywhere);
        // Stale entries route nothing.
        assert_eq!(kept.route(0, 10, 2, now + KEPT_FOR + Duration::from_millis(1)), Route::Anywhere);
        // A worker that left keeps nothing.
        kept.forget_worker(1);
        assert_eq!(kept.route(0, 10, 2, now), Route::Anywhere);
    }

    #[test]
    fn the_record_is_bounded() {
        let now = Instant::now();
        let mut kept = KeptRanges::default();
        for s in 0..(MAX_RANGES as u64 + 10) {
            kept.made(0, &(s..s + 1), 1, now + Duration::from_nanos(s));
        }
        assert_eq!(kept.ranges.len(), MAX_RANGES);
        assert_eq!(kept.route(0, 0, 2, now), Route::Anywhere, "the oldest went first");
        assert_eq!(kept.route(0, MAX_RANGES as u64 + 9, 2, now), Route::Elsewhere { worker_id: 1 });
    }
}
