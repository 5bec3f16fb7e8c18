//! [`BlockedClock`]: the time a batch waits on a trainer that does not
//! take it, added to a gauge as the wait goes, so a scrape during a long
//! wait sees it rise. The worker's gRPC outbox and its ring writer (in
//! `loader-ring`) both wait on trainers, and count the wait the same way.

use std::time::{Duration, Instant};

use metrics::Gauge;

/// While a batch waits on a trainer that does not take it, the wait is
/// added to its gauge at least this often, so a scrape sees it rise.
pub const BLOCKED_TICK: Duration = Duration::from_millis(250);

/// Adds the time a batch waits on its trainer to a gauge as the wait goes:
/// call [`tick`](Self::tick) at every wake-up of the wait; dropping it ends
/// the wait.
#[derive(Debug)]
pub struct BlockedClock<'a> {
    gauge: &'a Gauge,
    /// Start of the part of the wait not yet added.
    since: Option<Instant>,
}

impl<'a> BlockedClock<'a> {
    /// A clock that runs only while `tick` says the batch is blocked.
    #[inline]
    pub fn new(gauge: &'a Gauge) -> Self {
        Self { gauge, since: None }
    }

    /// Adds the wait since the last tick, and keeps counting while
    /// `blocked`.
    #[inline]
    pub fn tick(&mut self, blocked: bool) {
        let now = Instant::now();
        if let Some(since) = self.since.take() {
            self.gauge.increment(now.saturating_duration_since(since).as_secs_f64());
        }
        if blocked {
            self.since = Some(now);
        }
    }

    /// Whether the batch is blocked now (so the wait should wake within
    /// [`BLOCKED_TICK`]).
    #[inline]
    pub fn running(&self) -> bool {
        self.since.is_some()
    }
}

impl Drop for BlockedClock<'_> {
    fn drop(&mut self) {
        self.tick(false);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn a_blocked_clock_adds_only_blocked_time_and_adds_it_as_it_goes() {
        // A gauge over a plain atomic (f64 bits), read back directly.
        let value = Arc::new(AtomicU64::new(0));
        let gauge = Gauge::from_arc(Arc::clone(&value));
        let read = || f64::from_bits(value.load(Ordering::Relaxed));
        let pause = Duration::from_millis(20);

        let mut clock = BlockedClock::new(&gauge);
        clock.tick(false);
        std::thread::sleep(pause);
        clock.tick(true);
        assert_eq!(read(), 0.0, "time before the block is not blocked time");
        assert!(clock.running());
        std::thread::sleep(pause);
        clock.tick(true);
        let first = read();
        assert!(first >= pause.as_secs_f64(), "{first}");
        std::thread::sleep(pause);
        drop(clock);
        let second = read();
        assert!(second >= first + pause.as_secs_f64(), "the wait up to the drop is added: {second}");
    }
}
