//! The autoscaling policy of the worker pool: how many workers to run, from
//! the signal only the coordinator holds — the trainers' stall (the share of
//! their time spent waiting for a batch, from their session heartbeats).
//!
//! Each look ([`Autoscaler::decide`]) compares the counters of the last
//! [`Load`] with the one before (the coordinator looks once a second):
//! - **grow** by one while the stall is above the target and the pool is
//!   below its maximum, unless the last worker added did not help: after a
//!   growth the consumption rate must rise by more than [`HELPS`] (Cachew's
//!   rule: keep adding while the batch time improves by more than a few
//!   percent), else the pool stays at that size until the load changes (a
//!   shrink, or the stall falling under the target);
//! - **shrink** by one while the stall is under half the target (the
//!   hysteresis band) and the workers are mostly idle (mean busy share
//!   under [`IDLE_BUSY`]), down to the minimum;
//! - never twice within the cool-down, which also keeps the counters that
//!   straddle a change out of the next decision; outside `min..=max` it
//!   goes back inside at once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Most workers a pool runs (here, with the other bounds, so the pool and
/// the policy share one number): a typo (`--workers 10000`) must not fork
/// ten thousand processes or ask a cluster for ten thousand pods.
pub(crate) const MAX_WORKERS: u32 = 1024;

/// Growth must raise the consumption rate by more than this share.
pub(crate) const HELPS: f64 = 0.05;

/// Workers busier than this on average are not idle enough to shrink.
pub(crate) const IDLE_BUSY: f64 = 0.6;

/// The cool-down when the request leaves it at 0.
pub(crate) const DEFAULT_COOLDOWN: Duration = Duration::from_secs(3);

/// What the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Policy {
    /// Fewest workers.
    pub(crate) min: u32,
    /// Most workers.
    pub(crate) max: u32,
    /// Stall share (0 to 1) above which the pool grows.
    pub(crate) target_stall: f64,
    /// Wait after a change before the next.
    pub(crate) cooldown: Duration,
}

impl Policy {
    /// Checks the request's bounds; one line when they are wrong.
    pub(crate) fn new(min: u32, max: u32, target_stall: f64, cooldown: Duration) -> Result<Self, String> {
        if min == 0 || min > max {
            return Err(format!("autoscale bounds {min}..{max}: need 1 <= min <= max"));
        }
        if max > MAX_WORKERS {
            return Err(format!("autoscale bounds {min}..{max}: a pool runs at most {} workers", MAX_WORKERS));
        }
        if !(target_stall.is_finite() && target_stall > 0.0 && target_stall < 1.0) {
            return Err(format!("target stall {target_stall}: need a share between 0 and 1 (e.g. 0.05 for 5%)"));
        }
        let cooldown = if cooldown.is_zero() { DEFAULT_COOLDOWN } else { cooldown };
        Ok(Self { min, max, target_stall, cooldown })
    }
}

/// The coordinator's counters at one moment.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Load {
    /// When they were read.
    pub(crate) at: Instant,
    /// Each open session's cumulative stall, by session id.
    pub(crate) stall_ms: BTreeMap<u64, u64>,
    /// Batches consumed, summed over every job and consumer.
    pub(crate) consumed: u64,
    /// Mean busy share of the workers (0 to 1).
    pub(crate) busy: f64,
    /// Workers the pool runs (not counting draining ones).
    pub(crate) workers: u32,
}

impl Load {
    /// Reads the counters from the coordinator; the pool runs `workers`.
    pub(crate) fn read(coordinator: &crate::coordinator::Coordinator, workers: u32) -> Self {
        let stall_ms = coordinator.list_sessions().iter().map(|s| (s.session_id, s.stall_ms)).collect();
        let consumed = coordinator
            .list_jobs()
            .iter()
            .flat_map(|j| j.consumers.iter())
            .map(|c| c.consumed)
            .sum();
        let listed = coordinator.list_workers();
        let running: Vec<f64> = listed.iter().filter(|w| !w.draining).map(|w| w.busy).collect();
        let busy = if running.is_empty() { 0.0 } else { running.iter().sum::<f64>() / running.len() as f64 };
        Self { at: Instant::now(), stall_ms, consumed, busy, workers }
    }
}

/// What the last interval looked like.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Interval {
    /// Mean stall share of the sessions open throughout it.
    pub(crate) stall: f64,
    /// Batches consumed per second.
    pub(crate) rate: f64,
}

/// A decision and why, for the log.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decision {
    /// Workers to run.
    pub(crate) workers: u32,
    /// One line.
    pub(crate) reason: String,
}

/// The policy's memory between looks.
#[derive(Debug)]
pub(crate) struct Autoscaler {
    policy: Policy,
    /// The previous look.
    last: Option<Load>,
    /// When the pool last changed.
    changed_at: Option<Instant>,
    /// The rate before the last growth, until the growth is judged.
    grew_from: Option<f64>,
    /// Growing stopped helping at this size.
    ceiling: Option<u32>,
}

impl Autoscaler {
    /// A policy with no history.
    pub(crate) fn new(policy: Policy) -> Self {
        Self { policy, last: None, changed_at: None, grew_from: None, ceiling: None }
    }

    /// Looks at `load`: the number of workers to run now, if it changes.
    pub(crate) fn decide(&mut self, load: Load) -> Option<Decision> {
        let p = self.policy;
        let previous = self.last.replace(load.clone());
        if load.workers < p.min || load.workers > p.max {
            let workers = load.workers.clamp(p.min, p.max);
            return Some(self.changed(load.at, workers, format!("bounds {}..{}", p.min, p.max)));
        }
        if self.changed_at.is_some_and(|t| load.at.duration_since(t) < p.cooldown) {
            return None;
        }
        let interval = interval(previous.as_ref()?, &load)?;
        if let Some(before) = self.grew_from.take() {
            // The first interval wholly after a growth judges it.
            if interval.rate <= before * (1.0 + HELPS) {
                self.ceiling = Some(load.workers);
            }
        }
        if interval.stall < p.target_stall {
            self.ceiling = None;
        }
        if interval.stall > p.target_stall && load.workers < p.max && self.ceiling.is_none_or(|c| load.workers < c) {
            self.grew_from = Some(interval.rate);
            let reason = format!(
                "stall {:.1}% above the target {:.1}%",
                interval.stall * 100.0,
                p.target_stall * 100.0
            );
            return Some(self.changed(load.at, load.workers + 1, reason));
        }
        if interval.stall < p.target_stall / 2.0 && load.busy < IDLE_BUSY && load.workers > p.min {
            self.ceiling = None;
            let reason = format!(
                "stall {:.1}% under half the target and workers {:.0}% busy",
                interval.stall * 100.0,
                load.busy * 100.0
            );
            return Some(self.changed(load.at, load.workers - 1, reason));
        }
        None
    }

    fn changed(&mut self, at: Instant, workers: u32, reason: String) -> Decision {
        self.changed_at = Some(at);
        // Counters that straddle the change say nothing about the new size.
        self.last = None;
        Decision { workers, reason }
    }
}

/// The stall share and consumption rate between two looks (no session open
/// throughout: no stall, as nobody waits); None for looks out of order.
pub(crate) fn interval(from: &Load, to: &Load) -> Option<Interval> {
    let secs = to.at.checked_duration_since(from.at)?.as_secs_f64();
    if secs <= 0.0 {
        return None;
    }
    let mut stalled = 0.0;
    let mut sessions = 0u32;
    for (id, &now) in &to.stall_ms {
        if let Some(&then) = from.stall_ms.get(id) {
            stalled += now.saturating_sub(then) as f64 / 1000.0;
            sessions += 1;
        }
    }
    let stall = if sessions == 0 { 0.0 } else { (stalled / (secs * f64::from(sessions))).clamp(0.0, 1.0) };
    let rate = to.consumed.saturating_sub(from.consumed) as f64 / secs;
    Some(Interval { stall, rate })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Looks one second apart, one session, `workers` workers.
    struct Clock {
        start: Instant,
        secs: u64,
        stall_ms: u64,
        consumed: u64,
    }

    impl Clock {
        fn new() -> Self {
            Self { start: Instant::now(), secs: 0, stall_ms: 0, consumed: 0 }
        }

        /// One second passes with `stall` share of it stalled and `rate`
        /// batches consumed.
        fn tick(&mut self, stall: f64, rate: u64, busy: f64, workers: u32) -> Load {
            self.secs += 1;
            self.stall_ms += (stall * 1000.0) as u64;
            self.consumed += rate;
            Load {
                at: self.start + Duration::from_secs(self.secs),
                stall_ms: BTreeMap::from([(1, self.stall_ms)]),
                consumed: self.consumed,
                busy,
                workers,
            }
        }
    }

    fn policy() -> Policy {
        Policy::new(1, 4, 0.05, Duration::from_secs(2)).expect("policy")
    }

    #[test]
    fn bad_bounds_and_targets_are_one_line_errors() {
        assert_eq!(Policy::new(0, 3, 0.05, Duration::ZERO).expect_err("refused"), "autoscale bounds 0..3: need 1 <= min <= max");
        assert_eq!(Policy::new(4, 3, 0.05, Duration::ZERO).expect_err("refused"), "autoscale bounds 4..3: need 1 <= min <= max");
        assert!(Policy::new(1, 3, 5.0, Duration::ZERO).expect_err("refused").starts_with("target stall 5: need a share"));
        assert_eq!(
            Policy::new(1, 5000, 0.05, Duration::ZERO).expect_err("refused"),
            "autoscale bounds 1..5000: a pool runs at most 1024 workers"
        );
        assert_eq!(Policy::new(1, 3, 0.05, Duration::ZERO).map(|p| p.cooldown), Ok(DEFAULT_COOLDOWN));
    }

    #[test]
    fn grows_while_stalled_and_it_helps_then_holds_and_shrinks_when_idle() {
        let mut a = Autoscaler::new(policy());
        let mut c = Clock::new();
        let mut workers = 1;
        assert_eq!(a.decide(c.tick(0.5, 50, 1.0, workers)), None, "one look is no interval");
        let d = a.decide(c.tick(0.5, 50, 1.0, workers)).expect("grow");
        assert_eq!(d.workers, 2);
        assert_eq!(d.reason, "stall 50.0% above the target 5.0%");
        workers = 2;
        // Within the cool-down: nothing, however stalled.
        assert_eq!(a.decide(c.tick(0.3, 90, 1.0, workers)), None);
        // 90/s against 50/s before: it helped, and the stall is still high.
        assert_eq!(a.decide(c.tick(0.3, 90, 1.0, workers)).map(|d| d.workers), Some(3));
        workers = 3;
        assert_eq!(a.decide(c.tick(0.2, 92, 1.0, workers)), None, "cool-down");
        // 92/s against 90/s: the third worker did not help; hold at 3.
        assert_eq!(a.decide(c.tick(0.2, 92, 1.0, workers)), None);
        assert_eq!(a.decide(c.tick(0.2, 92, 1.0, workers)), None, "holds while stalled");
        // The load falls: no stall, idle workers: shrink one at a time.
        assert_eq!(a.decide(c.tick(0.0, 92, 0.2, workers)).map(|d| d.workers), Some(2));
        workers = 2;
        assert_eq!(a.decide(c.tick(0.0, 92, 0.2, workers)), None, "cool-down");
        assert_eq!(a.decide(c.tick(0.0, 92, 0.2, workers)).map(|d| d.workers), Some(1));
        workers = 1;
        for _ in 0..5 {
            assert_eq!(a.decide(c.tick(0.0, 92, 0.1, workers)), None, "never under the minimum");
        }
    }

    #[test]
    fn the_hysteresis_band_and_busy_workers_keep_the_size() {
        let mut a = Autoscaler::new(policy());
        let mut c = Clock::new();
        a.decide(c.tick(0.04, 50, 0.2, 2));
        // Under the target but above half of it: no change.
        assert_eq!(a.decide(c.tick(0.04, 50, 0.2, 2)), None);
        // No stall, but busy workers (they are what keeps the stall away).
        assert_eq!(a.decide(c.tick(0.0, 50, 0.9, 2)), None);
        assert_eq!(a.decide(c.tick(0.0, 50, 0.2, 2)).map(|d| d.workers), Some(1));
    }

    #[test]
    fn out_of_bounds_comes_back_at_once_and_without_trainers_idle_workers_go() {
        let mut a = Autoscaler::new(Policy::new(2, 3, 0.05, Duration::from_secs(2)).expect("policy"));
        let mut c = Clock::new();
        assert_eq!(a.decide(c.tick(0.0, 0, 0.0, 1)).map(|d| d.workers), Some(2));
        assert_eq!(a.decide(c.tick(0.0, 0, 0.0, 6)).map(|d| d.workers), Some(3), "bounds beat the cool-down");
        let mut idle = Autoscaler::new(policy());
        let at = Instant::now();
        let empty = |s: u64| Load { at: at + Duration::from_secs(s), stall_ms: BTreeMap::new(), consumed: 0, busy: 0.0, workers: 2 };
        assert_eq!(idle.decide(empty(1)), None);
        assert_eq!(idle.decide(empty(2)).map(|d| d.workers), Some(1), "no trainer waits: idle workers go");
    }
}
