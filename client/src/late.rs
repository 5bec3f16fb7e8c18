//! When the in-order consumer has waited too long on one batch: the
//! trigger of a backup task (see the coordinator's `backup` module). Late
//! means waited on past a threshold derived from recent waits: four times
//! a decaying maximum of the waits per batch (about their p99 over the last
//! hundred batches), never under a floor, so a pipeline that is slow for
//! every batch alike raises no alarm while one slow worker does. The wait
//! for the first batch (start-up) never counts, nor the wait for a batch
//! that was late (the straggler's).

use std::time::Duration;

use tokio::time::Instant;

/// No batch is late before this much waiting.
const FLOOR: Duration = Duration::from_millis(500);
/// Late: waited on this many times the typical recent wait.
const FACTOR: u32 = 4;
/// Per batch yielded, the typical wait forgets this share of itself.
const DECAY: f64 = 0.99;

/// The consumer's watch on the batch it waits for.
#[derive(Debug, Default)]
pub(crate) struct LateWatch {
    /// The batch waited on and since when.
    waiting: Option<(u64, Instant)>,
    /// A decaying maximum of the waits per batch yielded.
    typical: Duration,
    /// The batch last reported late (once per batch).
    reported: Option<u64>,
    /// A batch was yielded: start-up is over.
    started: bool,
}

impl LateWatch {
    /// The consumer is about to wait for `seq` at `now`: when it will be
    /// late, if it can be (not before the first batch).
    pub(crate) fn waiting_on(&mut self, seq: u64, now: Instant) -> Option<Instant> {
        if !self.started {
            return None;
        }
        let since = match self.waiting {
            Some((s, since)) if s == seq => since,
            _ => {
                self.waiting = Some((seq, now));
                now
            }
        };
        Some(since + self.threshold())
    }

    /// The batch waited on, if it is late at `now` and not reported yet;
    /// then it counts as reported.
    pub(crate) fn due(&mut self, now: Instant) -> Option<u64> {
        let (seq, since) = self.waiting?;
        if !self.started || self.reported == Some(seq) || now < since + self.threshold() {
            return None;
        }
        self.reported = Some(seq);
        Some(seq)
    }

    /// Batch `seq` was yielded, at `now()` (read only when the consumer
    /// had waited for it: most batches are there before they are asked
    /// for). True when it was the one reported late (the report can be
    /// withdrawn).
    pub(crate) fn yielded(&mut self, seq: u64, now: impl FnOnce() -> Instant) -> bool {
        let waited = match self.waiting.take() {
            Some((s, since)) if s == seq => now() - since,
            _ => Duration::ZERO,
        };
        let was_late = self.reported == Some(seq);
        if self.started {
            // A late batch's wait is the straggler's, not the pipeline's:
            // counted, it would raise the threshold past the next late
            // wait, and the one after (a worker slow for good would stall
            // the trainer longer and longer). A pipeline slow for every
            // batch alike is the coordinator's to spot (its backups lose).
            let counted = if was_late { Duration::ZERO } else { waited };
            self.typical = counted.max(self.typical.mul_f64(DECAY));
        }
        self.started = true;
        if was_late {
            self.reported = None;
        }
        was_late
    }

    fn threshold(&self) -> Duration {
        (self.typical * FACTOR).max(FLOOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_past_the_floor_or_four_typical_waits_once_per_batch_never_at_start_up() {
        let t0 = Instant::now();
        let mut w = LateWatch::default();
        assert_eq!(w.waiting_on(0, t0), None, "start-up is never late");
        assert_eq!(w.due(t0 + Duration::from_secs(10)), None);
        assert!(!w.yielded(0, || t0 + Duration::from_secs(10)));

        let at = w.waiting_on(1, t0).expect("armed");
        assert_eq!(at, t0 + FLOOR);
        assert_eq!(w.due(t0 + FLOOR / 2), None);
        assert_eq!(w.due(t0 + FLOOR), Some(1));
        assert_eq!(w.due(t0 + FLOOR * 2), None, "once per batch");
        assert!(w.yielded(1, || t0 + FLOOR * 3), "the late one arrived");

        // Slow batches alike raise the threshold: a 300 ms wait per batch
        // makes 1.2 s late, and the memory of it decays batch by batch.
        let mut w = LateWatch::default();
        w.yielded(0, || t0);
        w.waiting_on(1, t0);
        w.yielded(1, || t0 + Duration::from_millis(300));
        assert_eq!(w.waiting_on(2, t0), Some(t0 + Duration::from_millis(1200)));
        for seq in 2..300 {
            w.yielded(seq, || t0);
        }
        assert_eq!(w.waiting_on(300, t0), Some(t0 + FLOOR), "forgotten after ~300 quick batches");

        // A worker slow for good: every other batch is late, and the
        // threshold stays where it was instead of growing with each wait.
        let mut w = LateWatch::default();
        w.yielded(0, || t0);
        let mut now = t0;
        for seq in 1..200 {
            let at = w.waiting_on(seq, now).expect("armed");
            let waited = if seq % 2 == 0 {
                assert_eq!(at, now + FLOOR, "batch {seq}: the threshold did not grow");
                assert_eq!(w.due(at), Some(seq));
                FLOOR + Duration::from_millis(50)
            } else {
                Duration::from_millis(10)
            };
            now += waited;
            w.yielded(seq, || now);
        }
    }
}
