//! A blocking `AdminService` client for tests: every call bounded, every
//! wait a poll with a deadline.

use std::future::Future;
use std::time::Duration;

use loader_proto::pb::admin_service_client::AdminServiceClient;
use loader_proto::pb::{
    DrainWorkerRequest, JobInfo, ListJobsRequest, ListSessionsRequest, ListWorkersRequest, SessionInfo, WorkerInfo,
};
use loader_process::grpc::Channel;
use loader_process::security::ClientSecurity;

/// Longest one admin call may take.
const CALL: Duration = Duration::from_secs(5);

/// The operator's view of a coordinator.
#[derive(Debug)]
pub struct Admin {
    /// Drives the calls; a test thread has no runtime of its own.
    runtime: tokio::runtime::Runtime,
    client: AdminServiceClient<Channel>,
}

impl Admin {
    /// A client for the coordinator at `url`; connects lazily, so a
    /// coordinator that is down fails calls, not this.
    pub fn new(url: &str) -> Admin {
        Admin::with_security(url, &ClientSecurity::none())
    }

    /// A client presenting `security`'s TLS settings and token.
    pub fn with_security(url: &str, security: &ClientSecurity) -> Admin {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("admin runtime");
        let channel = {
            let _enter = runtime.enter();
            loader_process::grpc::endpoint(url, security).expect("coordinator URL").connect_lazy()
        };
        Admin { runtime, client: AdminServiceClient::new(channel) }
    }

    fn call<T, F: Future<Output = Result<tonic::Response<T>, tonic::Status>>>(
        &self,
        what: &str,
        f: impl FnOnce(AdminServiceClient<Channel>) -> F,
    ) -> Result<T, String> {
        let client = self.client.clone();
        self.runtime.block_on(async move {
            match tokio::time::timeout(CALL, f(client)).await {
                Ok(Ok(reply)) => Ok(reply.into_inner()),
                Ok(Err(status)) => Err(format!("{what}: {:?}: {}", status.code(), status.message())),
                Err(_) => Err(format!("{what}: no answer within {CALL:?}")),
            }
        })
    }

    /// The registered workers.
    pub fn workers(&self) -> Result<Vec<WorkerInfo>, String> {
        self.call("ListWorkers", |mut c| async move { c.list_workers(ListWorkersRequest {}).await }).map(|r| r.workers)
    }

    /// The open trainer sessions.
    pub fn sessions(&self) -> Result<Vec<SessionInfo>, String> {
        self.call("ListSessions", |mut c| async move { c.list_sessions(ListSessionsRequest {}).await })
            .map(|r| r.sessions)
    }

    /// The jobs with their consumers' progress.
    pub fn jobs(&self) -> Result<Vec<JobInfo>, String> {
        self.call("ListJobs", |mut c| async move { c.list_jobs(ListJobsRequest {}).await }).map(|r| r.jobs)
    }

    /// Tells worker `worker_id` to drain.
    pub fn drain(&self, worker_id: u64) -> Result<(), String> {
        self.call("DrainWorker", |mut c| async move { c.drain_worker(DrainWorkerRequest { worker_id }).await })
            .map(|_| ())
    }

    /// The id of the worker serving at `addr` (its `listening` address).
    pub fn worker_id(&self, addr: &str) -> Result<u64, String> {
        let workers = self.workers()?;
        workers
            .iter()
            .find(|w| w.address.trim_start_matches("http://") == addr)
            .map(|w| w.worker_id)
            .ok_or_else(|| format!("no worker listed at {addr}; listed: {workers:?}"))
    }

    /// Polls `check` until it returns Some or `limit` passes (then panics
    /// with `what` and the last error).
    pub fn wait_for<T>(
        &self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut(&Admin) -> Result<Option<T>, String>,
    ) -> T {
        crate::wait::wait_for(what, limit, || check(self)?.ok_or_else(|| "not yet".to_owned()))
    }
}
