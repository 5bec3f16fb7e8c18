//! What a trainer records for Prometheus, when its options ask for a
//! metrics endpoint (`LoaderOptions::metrics_listen`; served by
//! `loader_process::telemetry::metrics`, see docs/operations.md). The
//! handles are built once per loader, labelled with its job and rank;
//! without a recorder installed they are no-ops.

use std::time::Duration;

use metrics::{Counter, Gauge};

/// One loader's handles.
pub(crate) struct TrainerMeters {
    /// Batches `next()` yielded.
    batches: Counter,
    /// Samples in them.
    samples: Counter,
    /// Time `next()` waited for a batch.
    stall: Gauge,
}

impl std::fmt::Debug for TrainerMeters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainerMeters").finish_non_exhaustive()
    }
}

impl Default for TrainerMeters {
    /// Handles that record nothing (metrics off).
    fn default() -> Self {
        Self {
            batches: Counter::noop(),
            samples: Counter::noop(),
            stall: Gauge::noop(),
        }
    }
}

impl TrainerMeters {
    /// The handles of the loader of `rank` in job `job_id`.
    pub(crate) fn new(job_id: u64, rank: u32) -> Self {
        let job = job_id.to_string();
        let rank = rank.to_string();
        Self {
            batches: metrics::counter!("loader_trainer_batches_consumed_total", "job_id" => job.clone(), "rank" => rank.clone()),
            samples: metrics::counter!("loader_trainer_samples_consumed_total", "job_id" => job.clone(), "rank" => rank.clone()),
            stall: metrics::gauge!("loader_trainer_stall_seconds_total", "job_id" => job, "rank" => rank),
        }
    }

    /// A batch of `samples` samples was yielded.
    pub(crate) fn consumed(&self, samples: usize) {
        self.batches.increment(1);
        self.samples.increment(samples as u64);
    }

    /// `next()` waited `waited` for a batch.
    pub(crate) fn stalled(&self, waited: Duration) {
        self.stall.increment(waited.as_secs_f64());
    }
}
