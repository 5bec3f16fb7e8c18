//! `AdminService`: what operators and `loaderctl status` see.

use loader_proto::pb::{self, admin_service_server::AdminService};
use tonic::{Request, Response, Status};

use std::sync::Arc;

use crate::autoscale::Policy;
use crate::coordinator::Coordinator;
use crate::error::CoordinatorError;
use crate::pool::WorkerPool;

#[derive(Debug)]
pub(crate) struct AdminApi {
    pub(crate) coordinator: Coordinator,
    /// The worker pool, when the coordinator runs one.
    pub(crate) pool: Option<Arc<WorkerPool>>,
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn list_workers(
        &self,
        _request: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        Ok(Response::new(pb::ListWorkersResponse { workers: self.coordinator.list_workers() }))
    }

    async fn drain_worker(
        &self,
        request: Request<pb::DrainWorkerRequest>,
    ) -> Result<Response<pb::DrainWorkerResponse>, Status> {
        self.coordinator.drain_worker(request.into_inner().worker_id)?;
        Ok(Response::new(pb::DrainWorkerResponse {}))
    }

    async fn scale_workers(
        &self,
        request: Request<pb::ScaleWorkersRequest>,
    ) -> Result<Response<pb::ScaleWorkersResponse>, Status> {
        let pool = self.pool.as_ref().ok_or(CoordinatorError::NoWorkerPool)?;
        Ok(Response::new(pool.scale(&self.coordinator, request.into_inner().workers).await?))
    }

    async fn autoscale(
        &self,
        request: Request<pb::AutoscaleRequest>,
    ) -> Result<Response<pb::AutoscaleResponse>, Status> {
        let pool = self.pool.as_ref().ok_or(CoordinatorError::NoWorkerPool)?;
        let r = request.into_inner();
        let policy = if r.off {
            None
        } else {
            let cooldown = std::time::Duration::from_millis(r.cooldown_ms);
            Some(Policy::new(r.min, r.max, r.target_stall, cooldown).map_err(CoordinatorError::BadScaling)?)
        };
        pool.autoscale(policy);
        Ok(Response::new(pb::AutoscaleResponse {}))
    }

    async fn list_sessions(
        &self,
        _request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        Ok(Response::new(pb::ListSessionsResponse { sessions: self.coordinator.list_sessions() }))
    }

    async fn list_jobs(&self, _request: Request<pb::ListJobsRequest>) -> Result<Response<pb::ListJobsResponse>, Status> {
        Ok(Response::new(pb::ListJobsResponse { jobs: self.coordinator.list_jobs() }))
    }
}
