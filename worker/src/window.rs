//! The window this worker holds per consumer of each job: how many batches
//! it may have undelivered, sized by the job's batch bytes (see
//! [`loader_job::window`]).
//!
//! The producer learns a job's batch bytes when it opens the job's dataset
//! and how long a batch takes to make as it makes them (a job's window
//! stays at the configured `max_outstanding` until both are known); the
//! coordinator link announces the windows in every heartbeat (the
//! coordinator hands out ranges by them) and reports deliveries when half a
//! consumer's window is delivered.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use loader_proto::pb::JobWindow;

/// Jobs whose windows are kept and announced; the producer keeps at most
/// this many datasets open, so older jobs are long finished.
const KEPT: usize = 64;

/// Windows by job, shared by the producer (learns) and the link (reads).
#[derive(Debug)]
pub(crate) struct Windows {
    /// The configured `max_outstanding`: the window of a job not sized yet,
    /// and the least any window holds.
    at_least: u32,
    /// What is known of each job, by job id.
    jobs: Mutex<BTreeMap<u64, Job>>,
}

/// One job's batches, as measured.
#[derive(Debug, Clone, Copy, Default)]
struct Job {
    /// Bytes of a full batch.
    bytes: Option<u64>,
    /// Smoothed time to make one batch.
    time: Option<Duration>,
}

impl Windows {
    /// No job sized yet.
    pub(crate) fn new(at_least: u32) -> Arc<Self> {
        Arc::new(Self { at_least: at_least.max(1), jobs: Mutex::new(BTreeMap::new()) })
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Job>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The configured `max_outstanding`: the window of a job not sized yet.
    pub(crate) fn at_least(&self) -> u32 {
        self.at_least
    }

    /// Records the bytes of a full batch of `job_id`.
    pub(crate) fn learn_bytes(&self, job_id: u64, bytes: u64) {
        self.job(job_id, |j| j.bytes = Some(bytes));
    }

    /// Records that a batch of `job_id` took `time` to make.
    pub(crate) fn learn_time(&self, job_id: u64, time: Duration) {
        self.job(job_id, |j| {
            // An eighth of each new sample: steady under jitter, and within
            // a few tasks of a new rate.
            j.time = Some(j.time.map_or(time, |old| (old * 7 + time) / 8));
        });
    }

    fn job(&self, job_id: u64, change: impl FnOnce(&mut Job)) {
        let mut jobs = self.lock();
        let known = jobs.contains_key(&job_id);
        change(jobs.entry(job_id).or_default());
        if !known && jobs.len() > KEPT {
            // Job ids grow: the smallest is the oldest.
            jobs.pop_first();
        }
    }

    fn window(&self, job: Option<&Job>) -> u32 {
        match job {
            Some(Job { bytes: Some(bytes), time: Some(time) }) => {
                loader_job::window::held(*bytes, *time, self.at_least)
            }
            _ => self.at_least,
        }
    }

    /// The window of `job_id`, in batches.
    pub(crate) fn of(&self, job_id: u64) -> u32 {
        self.window(self.lock().get(&job_id))
    }

    /// Every sized window, for a heartbeat.
    pub(crate) fn announce(&self) -> Vec<JobWindow> {
        let jobs = self.lock();
        jobs.iter()
            .filter(|(_, j)| j.bytes.is_some() && j.time.is_some())
            .map(|(&job_id, j)| JobWindow { job_id, batches: self.window(Some(j)) })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_sized_by_batch_bytes_and_time_and_unknown_ones_get_the_configured_window() {
        let us = Duration::from_micros;
        let w = Windows::new(8);
        assert_eq!(w.of(1), 8);
        w.learn_bytes(1, 4_200);
        assert_eq!(w.of(1), 8, "no time measured yet");
        assert!(w.announce().is_empty());
        w.learn_time(1, us(2));
        w.learn_bytes(2, 10 << 20);
        w.learn_time(2, us(100));
        w.learn_bytes(3, 4_200);
        w.learn_time(3, us(20_000));
        assert_eq!(w.of(1), loader_job::window::MAX_WINDOW);
        assert_eq!(w.of(2), 8, "large batches");
        assert_eq!(w.of(3), 8, "slow batches");
        assert_eq!(
            w.announce(),
            vec![
                JobWindow { job_id: 1, batches: loader_job::window::MAX_WINDOW },
                JobWindow { job_id: 2, batches: 8 },
                JobWindow { job_id: 3, batches: 8 },
            ]
        );
        // The time is smoothed: one slow batch does not collapse a window,
        // a run of them does.
        w.learn_time(1, us(1_000));
        assert_eq!(w.of(1), loader_job::window::MAX_WINDOW);
        for _ in 0..40 {
            w.learn_time(1, us(1_000));
        }
        assert_eq!(w.of(1), 50);
        for job in 4..100 {
            w.learn_bytes(job, 1 << 20);
            w.learn_time(job, us(10));
        }
        assert_eq!(w.announce().len(), KEPT, "old jobs are forgotten");
        assert_eq!(w.of(1), 8);
    }
}
