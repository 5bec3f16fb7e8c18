//! `AdminService`: what operators and `loaderctl status` see.

use loader_proto::pb::{self, admin_service_server::AdminService};
use tonic::{Request, Response, Status};

use crate::coordinator::Coordinator;

#[derive(Debug)]
pub(crate) struct AdminApi(pub(crate) Coordinator);

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn list_workers(
        &self,
        _request: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        Ok(Response::new(pb::ListWorkersResponse { workers: self.0.list_workers() }))
    }

    async fn drain_worker(
        &self,
        request: Request<pb::DrainWorkerRequest>,
    ) -> Result<Response<pb::DrainWorkerResponse>, Status> {
        self.0.drain_worker(request.into_inner().worker_id)?;
        Ok(Response::new(pb::DrainWorkerResponse {}))
    }

    async fn list_sessions(
        &self,
        _request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        Ok(Response::new(pb::ListSessionsResponse { sessions: self.0.list_sessions() }))
    }

    async fn list_jobs(&self, _request: Request<pb::ListJobsRequest>) -> Result<Response<pb::ListJobsResponse>, Status> {
        Ok(Response::new(pb::ListJobsResponse { jobs: self.0.list_jobs() }))
    }
}
