//! What operators are shown: the workers, sessions and jobs, with their
//! progress.

use loader_proto::pb;
use tokio::time::Instant;

use super::Coordinator;

impl Coordinator {
    pub(crate) fn list_workers(&self) -> Vec<pb::WorkerInfo> {
        let t = self.lock();
        let now = Instant::now();
        t.workers
            .workers
            .iter()
            .map(|(&id, w)| pb::WorkerInfo {
                worker_id: id,
                address: w.address.clone(),
                node: w.node.clone(),
                outstanding: w.outstanding_total(),
                delivered: w.delivered,
                last_seen_ms: now.duration_since(w.last_seen).as_millis() as u64,
                draining: w.draining,
                busy: w.busy,
                delivered_samples: w.delivered_samples,
                pid: w.pid,
                storage: w.storage_use.clone(),
            })
            .collect()
    }

    pub(crate) fn list_sessions(&self) -> Vec<pb::SessionInfo> {
        let t = self.lock();
        let now = Instant::now();
        let mut out: Vec<pb::SessionInfo> = t
            .sessions
            .sessions
            .iter()
            .map(|(&id, s)| pb::SessionInfo {
                session_id: id,
                job_id: s.job_id,
                consumer: s.consumer,
                node: s.node.clone(),
                ring: !s.ring_socket.is_empty(),
                last_seen_ms: now.duration_since(s.last_seen).as_millis() as u64,
                stall_ms: s.stall_ms,
            })
            .collect();
        out.sort_by_key(|s| s.session_id);
        out
    }

    pub(crate) fn list_jobs(&self) -> Vec<pb::JobInfo> {
        let t = self.lock();
        t.jobs
            .iter()
            .map(|j| pb::JobInfo {
                job: Some(j.job.clone()),
                consumers: j
                    .consumers
                    .iter()
                    .enumerate()
                    .map(|(i, c)| pb::ConsumerProgress {
                        consumer: i as u32,
                        assigned: c.queue.handed_out(),
                        delivered: c.delivered,
                        resent: c.resent,
                        consumed: c.consumed,
                        total: j.plan.total_batches(),
                        backup_launched: c.backups.launched,
                        backup_won: c.backups.won,
                        backup_wasted: c.backups.wasted,
                        subscribes_to: c.subscribes_to,
                        left: c.left,
                        assigned_alone: c.assigned_alone,
                    })
                    .collect(),
                error: j.error.clone().unwrap_or_default(),
                cache: j.cache.clone(),
            })
            .collect()
    }
}
