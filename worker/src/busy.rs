//! How busy the producer is: the fraction of wall time its thread spends
//! making batches (reading, transforming, collating), which every heartbeat
//! reports (`WorkerHeartbeatRequest.busy`) for `loaderctl top`. Time spent
//! waiting for a task or for a ring slot is idle: a worker whose trainer
//! reads slowly shows idle, one that cannot keep up shows busy.
//!
//! The producer opens a spell when it starts a batch and closes it when the
//! batch is made or fails; the link reads and resets the tally once per
//! heartbeat. Both sides touch only atomics, so a batch costs two atomic
//! stores and no lock. A spell still open when the link reads is split at
//! that instant, so a batch longer than a heartbeat interval counts in both
//! intervals instead of showing idle and then over 100%. Every operation
//! takes the instant it happens at, which is how the accounting is tested.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// `BusyMeter::open` when no spell is open.
const IDLE: u64 = u64::MAX;

/// Busy time of one thread, read and reset by another.
#[derive(Debug)]
pub(crate) struct BusyMeter {
    /// Instants are kept as nanoseconds since this one, to fit an atomic.
    origin: Instant,
    /// Busy nanoseconds since the last read: closed spells, and the part of
    /// an open one after the last read.
    busy_ns: AtomicU64,
    /// Start of the open spell, or [`IDLE`]; a read moves it to the read's
    /// instant after counting the part before.
    open: AtomicU64,
    /// Instant of the last read (the creation at first): the wall time the
    /// next read divides by starts here.
    last_read: AtomicU64,
}

impl BusyMeter {
    /// A meter that counts from `origin`, idle.
    pub(crate) fn new(origin: Instant) -> Self {
        Self {
            origin,
            busy_ns: AtomicU64::new(0),
            open: AtomicU64::new(IDLE),
            last_read: AtomicU64::new(0),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos())
            .unwrap_or(IDLE - 1)
            .min(IDLE - 1)
    }

    /// The producer started a batch at `at`.
    pub(crate) fn start(&self, at: Instant) {
        self.open.store(self.nanos(at), Ordering::Release);
    }

    /// The producer finished (or gave up) the batch at `at`.
    pub(crate) fn stop(&self, at: Instant) {
        let start = self.open.swap(IDLE, Ordering::AcqRel);
        if start != IDLE {
            self.busy_ns
                .fetch_add(self.nanos(at).saturating_sub(start), Ordering::AcqRel);
        }
    }

    /// A spell that opened at `at` and closes when dropped.
    pub(crate) fn spell(&self, at: Instant) -> Spell<'_> {
        self.start(at);
        Spell(self)
    }

    /// The fraction (0 to 1) of the time since the previous read (or since
    /// `origin`) that was busy, up to `at`; the next read counts from `at`.
    pub(crate) fn take(&self, at: Instant) -> f64 {
        let now = self.nanos(at);
        let mut start = self.open.load(Ordering::Acquire);
        while start != IDLE {
            // Count the open spell up to now and restart it at now, unless
            // the producer closed it (or opened another) meanwhile.
            match self.open.compare_exchange_weak(
                start,
                now.max(start),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.busy_ns
                        .fetch_add(now.saturating_sub(start), Ordering::AcqRel);
                    break;
                }
                Err(current) => start = current,
            }
        }
        let busy = self.busy_ns.swap(0, Ordering::AcqRel);
        let wall = now.saturating_sub(self.last_read.swap(now, Ordering::AcqRel));
        if wall == 0 {
            return 0.0;
        }
        // A spell closed just after the split above may add a little of
        // the next interval to this one: clamp.
        (busy as f64 / wall as f64).clamp(0.0, 1.0)
    }
}

/// An open busy spell: closed, at the instant it is dropped, on every path
/// out of a batch (made, failed, abandoned).
#[derive(Debug)]
pub(crate) struct Spell<'a>(&'a BusyMeter);

impl Drop for Spell<'_> {
    fn drop(&mut self) {
        self.0.stop(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn an_idle_producer_is_not_busy() {
        let t0 = Instant::now();
        let m = BusyMeter::new(t0);
        assert_eq!(m.take(t0 + ms(1000)), 0.0);
        assert_eq!(m.take(t0 + ms(2000)), 0.0);
    }

    #[test]
    fn closed_spells_add_up_over_the_interval_and_reset() {
        let t0 = Instant::now();
        let m = BusyMeter::new(t0);
        m.start(t0 + ms(100));
        m.stop(t0 + ms(300));
        m.start(t0 + ms(500));
        m.stop(t0 + ms(600));
        let busy = m.take(t0 + ms(1000));
        assert!(close(busy, 0.3), "{busy}");
        // Nothing since the read.
        assert_eq!(m.take(t0 + ms(2000)), 0.0);
    }

    #[test]
    fn an_open_spell_is_split_at_the_read() {
        let t0 = Instant::now();
        let m = BusyMeter::new(t0);
        m.start(t0 + ms(750));
        let first = m.take(t0 + ms(1000));
        assert!(close(first, 0.25), "{first}");
        m.stop(t0 + ms(1500));
        let second = m.take(t0 + ms(2000));
        assert!(close(second, 0.5), "{second}");
    }

    #[test]
    fn a_batch_longer_than_the_interval_is_fully_busy_in_each() {
        let t0 = Instant::now();
        let m = BusyMeter::new(t0);
        m.start(t0);
        assert!(close(m.take(t0 + ms(1000)), 1.0));
        assert!(close(m.take(t0 + ms(1500)), 1.0));
        m.stop(t0 + ms(2500));
        assert!(close(m.take(t0 + ms(2500)), 1.0));
        assert_eq!(m.take(t0 + ms(3000)), 0.0);
    }

    #[test]
    fn intervals_are_measured_from_the_previous_read() {
        let t0 = Instant::now();
        let m = BusyMeter::new(t0);
        assert_eq!(m.take(t0 + ms(1000)), 0.0);
        m.start(t0 + ms(1000));
        m.stop(t0 + ms(1100));
        // 100 ms busy of the 200 ms since the previous read, not of 1.2 s.
        let busy = m.take(t0 + ms(1200));
        assert!(close(busy, 0.5), "{busy}");
        // Two reads at the same instant: no interval, nothing busy.
        assert_eq!(m.take(t0 + ms(1200)), 0.0);
    }

    #[test]
    fn a_spell_guard_closes_when_dropped() {
        let m = BusyMeter::new(Instant::now());
        {
            let _spell = m.spell(Instant::now());
            assert_ne!(m.open.load(Ordering::Acquire), IDLE);
        }
        assert_eq!(m.open.load(Ordering::Acquire), IDLE);
    }
}
