//! When a draining worker may leave.
//!
//! A draining worker takes no new tasks, produces the ones it holds and
//! hands their batches to its consumers. It is done when it holds nothing:
//! every batch delivered, or dropped because its consumer ended (the
//! coordinator says so in a heartbeat response once the consumer's last
//! session is gone). A consumer that is alive but does not fetch would still
//! hold the drain forever, so the drain also ends after `patience` (the
//! lease TTL) in which nothing moved: no batch produced, none handed over.
//! The worker then deregisters with batches still held, and the coordinator
//! takes them back exactly as it does when a lease expires (undelivered and
//! unacknowledged batches to the front of their consumers' queues), so
//! another worker produces them for whoever fetches them later. A trainer
//! that was fetching slowly pays at most what a worker's death costs it:
//! a few batches produced again.

use std::time::Duration;

use tokio::time::Instant;

/// What a draining worker does after a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainStep {
    /// Keep producing and delivering.
    Continue,
    /// Nothing is held: deregister.
    Done,
    /// Batches are held but nothing moved for the whole patience:
    /// deregister, and the coordinator requeues them.
    HandBack,
}

/// A drain in progress.
#[derive(Debug, Clone)]
pub(crate) struct Drain {
    /// How long the drain waits without progress before handing back.
    patience: Duration,
    /// The outboxes' progress count when it last moved.
    progress: u64,
    /// When it last moved (or the drain began).
    since: Instant,
}

impl Drain {
    /// A drain ordered at `now`, with the outboxes' progress count then.
    pub(crate) fn new(patience: Duration, progress: u64, now: Instant) -> Self {
        Self { patience, progress, since: now }
    }

    /// How long it waits without progress.
    pub(crate) fn patience(&self) -> Duration {
        self.patience
    }

    /// Decides after a heartbeat: `held_nothing` when no task is queued or
    /// running and no batch waits, `progress` the outboxes' count now.
    pub(crate) fn step(&mut self, held_nothing: bool, progress: u64, now: Instant) -> DrainStep {
        if held_nothing {
            return DrainStep::Done;
        }
        if progress != self.progress {
            self.progress = progress;
            self.since = now;
            return DrainStep::Continue;
        }
        if now.saturating_duration_since(self.since) >= self.patience {
            DrainStep::HandBack
        } else {
            DrainStep::Continue
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATIENCE: Duration = Duration::from_secs(1);

    #[test]
    fn a_drain_with_nothing_held_is_done_at_once() {
        let t0 = Instant::now();
        assert_eq!(Drain::new(PATIENCE, 5, t0).step(true, 5, t0), DrainStep::Done);
    }

    #[test]
    fn held_batches_nobody_takes_are_handed_back_after_the_patience() {
        let t0 = Instant::now();
        let mut d = Drain::new(PATIENCE, 5, t0);
        assert_eq!(d.step(false, 5, t0 + PATIENCE / 2), DrainStep::Continue);
        assert_eq!(d.step(false, 5, t0 + PATIENCE), DrainStep::HandBack);
    }

    #[test]
    fn progress_restarts_the_patience() {
        let t0 = Instant::now();
        let mut d = Drain::new(PATIENCE, 5, t0);
        // A batch produced or taken just before the patience ran out.
        assert_eq!(d.step(false, 6, t0 + PATIENCE - Duration::from_millis(1)), DrainStep::Continue);
        assert_eq!(d.step(false, 6, t0 + PATIENCE), DrainStep::Continue);
        assert_eq!(d.step(false, 6, t0 + 2 * PATIENCE), DrainStep::HandBack);
        // Whatever the clock says, holding nothing is done, not handed back.
        assert_eq!(d.step(true, 6, t0 + 3 * PATIENCE), DrainStep::Done);
    }
}
