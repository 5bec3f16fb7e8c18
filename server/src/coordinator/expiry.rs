//! Leases that run out: workers and sessions expired on a timer, and a
//! job failed once the workers that made it keep dying before any of its
//! batches was delivered.

use tokio::time::Instant;

use super::{Coordinator, Tables, end_sessions, retire};

/// Workers that may die holding batches of a job none of whose batches was
/// ever delivered, before the job is failed.
const POISON_DEATHS: u32 = 3;

/// Counts one more worker that died holding batches of `job_id`; fails the
/// job once `POISON_DEATHS` died before any batch of it was delivered. A
/// job that delivered once is never failed this way: workers killed while
/// it runs (an in-order trainer may legitimately stop all deliveries while
/// it waits for a dead worker's batch) are not its fault.
fn poisoned(t: &mut Tables, job_id: u64, address: &str) {
    let Some(job) = t.jobs.get_mut(job_id) else { return };
    if job.delivered_any {
        return;
    }
    job.deaths_before_delivery += 1;
    if job.deaths_before_delivery >= POISON_DEATHS && job.error.is_none() {
        let error = format!(
            "{} workers died while producing batches of job {job_id} and none was ever delivered (the last was {address}); \
             the job is failed so that it takes down no more: check its batch size, sample shape and dataset",
            job.deaths_before_delivery
        );
        tracing::warn!(job_id, "job failed: {error}");
        job.error = Some(error);
        job.end_life();
        t.traces.forget(job_id, None);
    }
}

impl Coordinator {
    /// Expires every worker and session whose lease ran out by `now`. A dead
    /// worker's undelivered and unacknowledged batches go back to their
    /// consumers' queues, to be produced by another worker; a dead session
    /// is forgotten, so its ring is no longer routed to, and when it was the
    /// last session of its consumer, the consumer ends: what workers hold
    /// for it goes back to its queue and they are told to drop it. Returns
    /// the number of workers and sessions expired.
    pub(crate) fn expire(&self, now: Instant) -> (usize, usize) {
        let ttl = self.config.lease_ttl;
        let mut guard = self.lock();
        let t = &mut *guard;
        let dead: Vec<u64> = t
            .workers
            .workers
            .iter()
            .filter(|(_, w)| now.saturating_duration_since(w.last_seen) > ttl)
            .map(|(&id, _)| id)
            .collect();
        for &id in &dead {
            // Jobs it was making batches of: a job whose workers keep dying
            // before any of its batches is delivered is failed, so that it
            // takes down no more of them.
            let held: std::collections::BTreeSet<u64> = t.workers.workers.get(&id).map_or_else(Default::default, |w| {
                w.outstanding.iter().filter(|(_, s)| !s.is_empty()).map(|(&(job_id, _), _)| job_id).collect()
            });
            if let Some((address, requeued)) = retire(t, id) {
                tracing::warn!(worker_id = id, %address, requeued, "worker lease expired");
                for job_id in held {
                    poisoned(t, job_id, &address);
                }
            }
        }
        let (sessions, told) = end_sessions(t, "session lease expired", |_, s| now.saturating_duration_since(s.last_seen) > ttl);
        crate::meters::lease_expired("worker", dead.len());
        crate::meters::lease_expired("session", sessions);
        crate::meters::tables(t.workers.workers.len(), t.sessions.sessions.len(), t.jobs.iter().count());
        drop(guard);
        // Wake long polls: requeued batches, and workers to tell.
        if !dead.is_empty() || told > 0 {
            self.work_available.notify_waiters();
        }
        (dead.len(), sessions)
    }

    /// Expires leases every `reap_interval` (a quarter TTL) until `stop` is
    /// cancelled.
    pub(crate) async fn reap_leases(self, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(loader_job::lease::reap_interval(self.config.lease_ttl));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => { self.expire(Instant::now()); }
            }
        }
    }
}
