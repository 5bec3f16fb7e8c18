//! How many batches of a job may be in flight per consumer: a window sized
//! by bytes, not by a count of batches.
//!
//! Every hand-off in the pipeline costs about the same whatever a batch
//! holds: a coordinator round trip per range of batches, a delivery report,
//! a ring grant and report, a wake-up. With a fixed count of batches in
//! flight (say 8), a 4 KB token window pays those costs every few
//! microseconds of work and the pipeline runs at the speed of its round
//! trips, while a 10 MB image batch pays them once per millisecond of
//! copying. Sizing the window by bytes keeps the memory it holds the same
//! for every shape and lets small batches travel in large windows, so the
//! costs are paid per window instead of per batch.
//!
//! A window is also bounded in time: batches that take long to make (a
//! costly decode, a slow custom dataset) keep a short window, so a worker
//! that dies or drains has little to hand back or finish, and one slow
//! worker holds up the in-order stream only briefly.
//!
//! The worker sizes the window it holds per consumer (it owns that memory,
//! knows the batch bytes once a job's dataset is open, and measures how long
//! a batch takes to make) and tells the coordinator, which then hands out
//! ranges of a quarter of it; the trainer sizes its ring and its stream
//! credits by the bytes rule alone (it cannot know the time before the
//! first batch, and slots only cost memory).

use std::time::Duration;

/// Bytes of batches one window holds: enough that a window of small
/// batches covers several milliseconds of work, small enough that the
/// memory a worker holds per consumer stays modest.
pub const WINDOW_BYTES: u64 = 32 << 20;

/// How long a worker keeps a shared stream's batch it made, for
/// subscribers that trail the one it was made for (`loader-worker
/// --keep-shared`), and how long the coordinator sends such subscribers to
/// it. Trainers of a sweep started together trail each other by less than
/// a second; ones started by hand, by seconds.
pub const KEPT_FOR: Duration = Duration::from_secs(30);

/// Most batches in one window. Past this, the per-batch costs are already
/// a small share of a window's time, and larger windows only lengthen the
/// stretch one slow worker can hold up the in-order stream.
pub const MAX_WINDOW: u32 = 256;

/// Work one window holds: about this long to make all of its batches.
pub const WINDOW_TIME: Duration = Duration::from_millis(50);

/// Ranges a window is handed out in: a worker gets new work when a quarter
/// of its window is delivered, while three quarters are still in flight.
pub const RANGES_PER_WINDOW: u32 = 4;

/// The window for batches of `batch_bytes`: as many as `WINDOW_BYTES`
/// holds, at least `at_least` (the configured prefetch) and at most
/// `MAX_WINDOW` (unless `at_least` asks for more).
pub fn batches(batch_bytes: u64, at_least: u32) -> u32 {
    let at_least = at_least.max(1);
    let by_bytes = WINDOW_BYTES / batch_bytes.max(1);
    let by_bytes = u32::try_from(by_bytes).unwrap_or(u32::MAX).min(MAX_WINDOW);
    by_bytes.max(at_least)
}

/// The window a worker holds for batches of `batch_bytes` that take
/// `batch_time` each to make: the bytes rule of [`batches`], cut to what
/// `WINDOW_TIME` of work holds, never below `at_least`.
pub fn held(batch_bytes: u64, batch_time: Duration, at_least: u32) -> u32 {
    let by_time = WINDOW_TIME.as_nanos() / batch_time.as_nanos().max(1);
    let by_time = u32::try_from(by_time).unwrap_or(u32::MAX);
    batches(batch_bytes, at_least).min(by_time).max(at_least.max(1))
}

/// Batches per range handed out for a window of `window` batches: a quarter
/// of it, at least `at_least` (the coordinator's configured range).
pub fn range_len(window: u64, at_least: u64) -> u64 {
    (window / u64::from(RANGES_PER_WINDOW)).max(at_least).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_batches_get_large_windows_and_large_ones_keep_the_prefetch() {
        // A 10 MB image batch: the configured prefetch.
        assert_eq!(batches(9_633_000, 8), 8);
        // A 4 KB token window: capped.
        assert_eq!(batches(4_200, 8), MAX_WINDOW);
        // 3x32x32 uint8 at batch 256 (~790 KB): by bytes.
        assert_eq!(batches(790_000, 8), 42);
        // Degenerate sizes never divide by zero or go below one.
        assert_eq!(batches(0, 0), MAX_WINDOW);
        assert_eq!(batches(u64::MAX, 0), 1);
        // A prefetch above the cap wins: the user asked for it.
        assert_eq!(batches(4_200, 1000), 1000);
    }

    #[test]
    fn slow_batches_keep_a_short_window() {
        let us = Duration::from_micros;
        // A 4 KB token window made in 2 µs: the bytes rule's cap.
        assert_eq!(held(4_200, us(2), 8), MAX_WINDOW);
        // 1 ms a batch: 50 of them.
        assert_eq!(held(4_200, us(1_000), 8), 50);
        // 16 ms a batch (a slow decode): the configured prefetch.
        assert_eq!(held(4_200, us(16_000), 8), 8);
        // Large and fast: bytes decide.
        assert_eq!(held(9_633_000, us(100), 8), 8);
        assert_eq!(held(4_200, Duration::ZERO, 8), MAX_WINDOW);
    }

    #[test]
    fn ranges_are_a_quarter_of_the_window() {
        assert_eq!(range_len(256, 2), 64);
        assert_eq!(range_len(8, 2), 2);
        assert_eq!(range_len(1, 0), 1);
    }
}
