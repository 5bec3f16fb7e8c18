//! A worker's heartbeat report, applied: batches delivered and failed, its
//! windows, how busy it was, its cache and storage use.

use std::sync::Arc;

use loader_proto::pb;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Coordinator, backup, cache_use, storage_use};

/// What a worker's heartbeat reports.
#[derive(Debug, Default)]
pub(crate) struct WorkerReport {
    /// Batches handed to their consumers since the last report.
    pub(crate) delivered: Vec<pb::Delivered>,
    /// Tasks it could not complete.
    pub(crate) failed: Vec<pb::Failed>,
    /// Its window per job (see `loader_job::window`).
    pub(crate) windows: Vec<pb::JobWindow>,
    /// Fraction of wall time its producer was busy since its previous
    /// heartbeat (shown to operators only).
    pub(crate) busy: f64,
    /// Its sample cache use per job since it started (see `cache_use`).
    pub(crate) cache_use: Vec<pb::JobCacheUse>,
    /// Its reads from object stores since it started, if any (see
    /// `storage_use`).
    pub(crate) storage_use: Option<pb::StorageUse>,
}

impl Coordinator {
    /// Records delivered and failed batches and the worker's windows; the
    /// worker's own wake-up (see `WorkerState::wake`), None when the worker
    /// is unknown.
    pub(super) fn apply_report(&self, worker_id: u64, report: WorkerReport) -> Option<Arc<Notify>> {
        let WorkerReport { delivered, failed, windows, busy, cache_use, storage_use } = report;
        let mut guard = self.lock();
        let t = &mut *guard;
        let w = t.workers.workers.get_mut(&worker_id)?;
        let own = Arc::clone(&w.wake);
        w.last_seen = Instant::now();
        if busy.is_finite() {
            w.busy = busy.clamp(0.0, 1.0);
        }
        w.set_windows(windows.into_iter().map(|jw| (jw.job_id, jw.batches)));
        storage_use::record(w, storage_use);
        let mut credited = Vec::new();
        for d in delivered {
            let key = (d.job_id, d.consumer);
            let Some(held) = w.outstanding.get_mut(&key) else { continue };
            // Only batches this worker was holding count: a report can
            // never deliver a batch twice.
            let moved: Vec<u64> = d.seqs.iter().copied().filter(|s| held.remove(s)).collect();
            t.traces.delivered(key, &moved);
            credited.push((key, moved.clone()));
            let n = moved.len() as u64;
            w.delivered += n;
            crate::meters::delivered(d.job_id, n);
            if n > 0
                && let Some(job) = t.jobs.get_mut(d.job_id)
            {
                job.delivered_any = true;
                w.delivered_samples += moved.iter().map(|&seq| job.plan.batch_len(seq)).sum::<u64>();
            }
            if let Some(c) = t.jobs.get_mut(d.job_id).and_then(|j| j.consumers.get_mut(d.consumer as usize)) {
                c.delivered += n;
                // Second copies of batches taken back after delivery: re-sent
                // (counted once here; a backup's own re-send of one is not
                // counted again).
                for s in &moved {
                    if c.redeliver.remove(s) {
                        c.resent += 1;
                        if let Some(b) = c.backup.as_mut() {
                            b.resend.remove(s);
                        }
                    }
                }
                let consumed = c.consumed;
                let unacked: Vec<u64> = moved.into_iter().filter(|&s| s >= consumed).collect();
                if !unacked.is_empty() {
                    w.unacked.entry(key).or_default().extend(unacked);
                    t.workers.unacked_by.entry(key).or_default().insert(worker_id);
                }
            }
        }
        for (key, seqs) in credited {
            backup::delivered(t, key, worker_id, &seqs);
        }
        cache_use::record(t, worker_id, cache_use);
        let Some(w) = t.workers.workers.get_mut(&worker_id) else {
            return Some(own);
        };
        for f in failed {
            if let Some(held) = w.outstanding.get_mut(&(f.job_id, f.consumer)) {
                held.retain(|s| !(f.start_seq..f.end_seq).contains(s));
            }
            if let Some(job) = t.jobs.get_mut(f.job_id)
                && job.error.is_none()
            {
                tracing::warn!(job_id = f.job_id, error = %f.error, "job failed");
                job.error = Some(f.error);
                job.end_life();
                t.traces.forget(f.job_id, None);
            }
        }
        Some(own)
    }
}
