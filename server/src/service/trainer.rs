//! `TrainerService`: jobs, sessions, heartbeats and routes for trainers, and
//! the upload of the blobs their jobs need.

use loader_proto::pb::{self, trainer_service_server::TrainerService};
use tonic::{Request, Response, Status};

use crate::blobs::Chunk;
use crate::coordinator::Coordinator;
use crate::error::{CoordinatorError, check_version};

#[derive(Debug)]
pub(crate) struct TrainerApi(pub(crate) Coordinator);

#[tonic::async_trait]
impl TrainerService for TrainerApi {
    async fn create_or_attach_job(
        &self,
        request: Request<pb::CreateOrAttachJobRequest>,
    ) -> Result<Response<pb::CreateOrAttachJobResponse>, Status> {
        let r = request.into_inner();
        check_version(r.protocol_version)?;
        let spec = r.spec.ok_or(CoordinatorError::Missing("spec"))?;
        let (job, attached) = self.0.create_or_attach(spec)?;
        Ok(Response::new(pb::CreateOrAttachJobResponse { job: Some(job), attached }))
    }

    async fn open_session(
        &self,
        request: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionResponse>, Status> {
        let connection = self.0.connections.of(&request);
        let r = request.into_inner();
        check_version(r.protocol_version)?;
        let (session_id, job, consumer) =
            self.0.open_session(r.job_id, r.consumer, r.subscriber, r.node, r.ring_socket, r.resume.then_some(r.start_seq))?;
        self.0.seen_on(session_id, connection);
        Ok(Response::new(pb::OpenSessionResponse {
            session_id,
            consumer,
            session_key: self.0.session_key(session_id, r.job_id, consumer),
            job: Some(job),
            lease_ttl_ms: self.0.config.lease_ttl.as_millis() as u64,
            heartbeat_interval_ms: self.0.config.heartbeat_interval.as_millis() as u64,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::SessionHeartbeatRequest>,
    ) -> Result<Response<pb::SessionHeartbeatResponse>, Status> {
        let connection = self.0.connections.of(&request);
        let r = request.into_inner();
        check_version(r.protocol_version)?;
        self.0.check_session_key(r.session_id, &r.session_key)?;
        self.0.seen_on(r.session_id, connection);
        self.0.unreachable(r.session_id, &r.unreachable_workers);
        let response = match self.0.session_heartbeat(r.session_id, r.consumed, r.stall_ms) {
            Some(job_error) => pb::SessionHeartbeatResponse { reopen: false, job_error },
            None => pb::SessionHeartbeatResponse { reopen: true, job_error: String::new() },
        };
        // After the progress: a backup is judged against what the trainer
        // has consumed, which tells which workers are past start-up.
        if let Some(seq) = r.late_seq {
            self.0.late(r.session_id, seq);
        }
        Ok(Response::new(response))
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let r = request.into_inner();
        check_version(r.protocol_version)?;
        self.0.check_session_key(r.session_id, &r.session_key)?;
        self.0.close_session(r.session_id, r.consumed);
        Ok(Response::new(pb::CloseSessionResponse {}))
    }

    async fn put_blob(&self, request: Request<pb::PutBlobRequest>) -> Result<Response<pb::PutBlobResponse>, Status> {
        let r = request.into_inner();
        check_version(r.protocol_version)?;
        let chunk = Chunk { sha256: r.sha256, size: r.size, offset: r.offset, data: r.data };
        let at = self.0.put_blob(chunk)?;
        Ok(Response::new(pb::PutBlobResponse { held: at.held, next_offset: at.next_offset }))
    }

    async fn routes(&self, request: Request<pb::RoutesRequest>) -> Result<Response<pb::RoutesResponse>, Status> {
        let r = request.into_inner();
        self.0.check_session_key(r.session_id, &r.session_key)?;
        let (routes, job_error) = self.0.routes(r.session_id)?;
        Ok(Response::new(pb::RoutesResponse { routes, job_error }))
    }
}
