//! The window this worker holds per consumer of each job: how many batches
//! it may have undelivered, sized by the job's batch bytes (see
//! [`loader_proto::window`]).
//!
//! The producer learns a job's batch bytes when it opens the job's dataset;
//! the coordinator link announces the windows in every heartbeat (the
//! coordinator hands out ranges by them) and reports deliveries when half a
//! consumer's window is delivered.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

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
    /// Window per job id, in batches.
    jobs: Mutex<BTreeMap<u64, u32>>,
}

impl Windows {
    /// No job sized yet.
    pub(crate) fn new(at_least: u32) -> Arc<Self> {
        Arc::new(Self { at_least: at_least.max(1), jobs: Mutex::new(BTreeMap::new()) })
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, u32>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sizes the window of `job_id` for batches of `batch_bytes`.
    pub(crate) fn learn(&self, job_id: u64, batch_bytes: u64) {
        let batches = loader_proto::window::batches(batch_bytes, self.at_least);
        let mut jobs = self.lock();
        if jobs.insert(job_id, batches).is_none() && jobs.len() > KEPT {
            // Job ids grow: the smallest is the oldest.
            jobs.pop_first();
        }
    }

    /// The configured `max_outstanding`: the window of a job not sized yet.
    pub(crate) fn at_least(&self) -> u32 {
        self.at_least
    }

    /// The window of `job_id`, in batches.
    pub(crate) fn of(&self, job_id: u64) -> u32 {
        self.lock().get(&job_id).copied().unwrap_or(self.at_least)
    }

    /// Every sized window, for a heartbeat.
    pub(crate) fn announce(&self) -> Vec<JobWindow> {
        self.lock().iter().map(|(&job_id, &batches)| JobWindow { job_id, batches }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_sized_by_batch_bytes_and_unknown_ones_get_the_configured_window() {
        let w = Windows::new(8);
        assert_eq!(w.of(1), 8);
        w.learn(1, 4_200);
        w.learn(2, 10 << 20);
        assert_eq!(w.of(1), loader_proto::window::MAX_WINDOW);
        assert_eq!(w.of(2), 8);
        assert_eq!(
            w.announce(),
            vec![JobWindow { job_id: 1, batches: loader_proto::window::MAX_WINDOW }, JobWindow { job_id: 2, batches: 8 }]
        );
        for job in 3..100 {
            w.learn(job, 1 << 20);
        }
        assert_eq!(w.announce().len(), KEPT, "old jobs are forgotten");
        assert_eq!(w.of(1), 8);
    }
}
