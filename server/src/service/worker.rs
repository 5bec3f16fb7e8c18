//! `WorkerService`: registration, heartbeats and task pulls, and reads of
//! the blobs jobs need.

use std::time::Duration;

use loader_proto::pb::{self, worker_service_server::WorkerService};
use tonic::{Request, Response, Status};

use crate::coordinator::{Coordinator, HeartbeatOutcome, WorkerReport};
use crate::error::check_version;

#[derive(Debug)]
pub(crate) struct WorkerApi(pub(crate) Coordinator);

#[tonic::async_trait]
impl WorkerService for WorkerApi {
    async fn register_worker(
        &self,
        request: Request<pb::RegisterWorkerRequest>,
    ) -> Result<Response<pb::RegisterWorkerResponse>, Status> {
        let r = request.into_inner();
        check_version(r.protocol_version)?;
        let worker_id = self.0.register_worker(r.address, r.node, r.max_outstanding, r.memory_budget);
        self.0.note_pid(worker_id, r.pid);
        Ok(Response::new(pb::RegisterWorkerResponse {
            worker_id,
            lease_ttl_ms: self.0.config.lease_ttl.as_millis() as u64,
            heartbeat_interval_ms: self.0.config.heartbeat_interval.as_millis() as u64,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::WorkerHeartbeatRequest>,
    ) -> Result<Response<pb::WorkerHeartbeatResponse>, Status> {
        let r = request.into_inner();
        check_version(r.protocol_version)?;
        // Held open at most one heartbeat interval (a third of the lease),
        // so a waiting worker still renews well in time.
        let wait = Duration::from_millis(r.wait_ms).min(self.0.config.heartbeat_interval);
        let report = WorkerReport {
            delivered: r.delivered,
            failed: r.failed,
            windows: r.windows,
            busy: r.busy,
            cache_use: r.cache_use,
            storage_use: r.storage_use,
        };
        let response = match self.0.worker_heartbeat(r.worker_id, report, wait).await {
            HeartbeatOutcome::Reregister => pb::WorkerHeartbeatResponse { reregister: true, ..Default::default() },
            HeartbeatOutcome::Tasks { tasks, drain, ended } => pb::WorkerHeartbeatResponse {
                tasks,
                reregister: false,
                drain,
                ended: ended.into_iter().map(|(job_id, consumer)| pb::ConsumerId { job_id, consumer }).collect(),
            },
        };
        Ok(Response::new(response))
    }

    async fn get_blob(&self, request: Request<pb::GetBlobRequest>) -> Result<Response<pb::GetBlobResponse>, Status> {
        let r = request.into_inner();
        check_version(r.protocol_version)?;
        let (data, size) = self.0.get_blob(&r.sha256, r.offset, r.max_bytes)?;
        Ok(Response::new(pb::GetBlobResponse { data, size }))
    }

    async fn deregister(
        &self,
        request: Request<pb::DeregisterRequest>,
    ) -> Result<Response<pb::DeregisterResponse>, Status> {
        let r = request.into_inner();
        check_version(r.protocol_version)?;
        self.0.deregister(r.worker_id)?;
        Ok(Response::new(pb::DeregisterResponse {}))
    }
}
