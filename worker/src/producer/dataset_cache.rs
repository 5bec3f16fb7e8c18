//! The datasets of recent jobs, kept open between their tasks.

use std::collections::HashMap;
use std::sync::Arc;

use loader_proto::ConsumerKey;
use loader_proto::pb::JobSpec;

use super::TaskError;
use crate::blobs::BlobFetcher;
use crate::dataset::{Dataset, Datasets};

/// Jobs whose datasets stay open; older ones are closed first.
const DATASET_CACHE: usize = 8;


/// Open datasets of recent jobs. A job's dataset closes when every
/// consumer this worker served it for ended (its trainers finished or
/// left), or when more recent jobs push it out: what it holds open (files,
/// mappings, its kept frames) goes with it.
#[derive(Debug, Default)]
pub(super) struct DatasetCache {
    open: HashMap<u64, (Arc<dyn Dataset>, u64)>,
    /// Use counter, for evicting the least recently used job.
    clock: u64,
    /// The consumers each open job's tasks were for, until they end.
    consumers: HashMap<u64, std::collections::HashSet<u32>>,
}

impl DatasetCache {
    /// Notes that `job_id`'s dataset serves `consumers`.
    pub(super) fn serves(&mut self, job_id: u64, consumers: impl Iterator<Item = u32>) {
        self.consumers.entry(job_id).or_default().extend(consumers);
    }

    /// Closes the datasets whose consumers all ended. A consumer that
    /// comes back, or another rank, opens its job's dataset again.
    pub(super) fn ended(&mut self, ended: &[ConsumerKey]) {
        for &(job_id, consumer) in ended {
            let Some(left) = self.consumers.get_mut(&job_id) else { continue };
            left.remove(&consumer);
            if left.is_empty() {
                self.consumers.remove(&job_id);
                self.open.remove(&job_id);
                tracing::debug!(job = job_id, "dataset closed: every consumer it served ended");
            }
        }
    }

    pub(super) fn open(
        &mut self,
        job_id: u64,
        spec: &JobSpec,
        datasets: &Datasets,
        blobs: Option<&BlobFetcher>,
    ) -> Result<Arc<dyn Dataset>, TaskError> {
        self.clock += 1;
        if let Some((ds, used)) = self.open.get_mut(&job_id) {
            *used = self.clock;
            return Ok(Arc::clone(ds));
        }
        // Failures are not cached: a file that appears later is picked up by
        // the next task.
        let ds = if spec.blobs.is_empty() {
            datasets.open(spec)?
        } else {
            // The blobs stay open until the dataset has read them.
            let local = blobs.ok_or(TaskError::NoBlobFetcher)?.localize(spec)?;
            datasets.open(&local.apply(spec))?
        };
        if self.open.len() >= DATASET_CACHE
            && let Some(oldest) = self.open.iter().min_by_key(|(_, (_, used))| *used).map(|(id, _)| *id)
        {
            self.open.remove(&oldest);
            self.consumers.remove(&oldest);
        }
        self.open.insert(job_id, (Arc::clone(&ds), self.clock));
        Ok(ds)
    }
}
