//! `loader-server`: the coordinator of a Loader deployment.
//!
//! It owns the registered jobs and the split of each into consumers and
//! batches, the table of workers and trainer sessions, the per-consumer
//! queues of batch ranges, and the delivery progress of every batch. Workers
//! pull ranges with their heartbeats; trainers learn where to fetch from.
//!
//! # Layout
//! - [`config`]: [`ServerConfig`], the settings tests and the CLI fill.
//! - `coordinator`: the state and the operations on it (assignment, reports,
//!   leases); `coordinator::requeue` is the one path by which batches go
//!   back to a queue (a worker left, or a consumer lost its last session).
//! - `admission`: refuses a job whose batches fit no worker's memory.
//! - `blobs`: the blobs jobs reference (pickled datasets), uploaded by
//!   trainers and read by workers in chunks, held within `--blob-budget`.
//! - `jobs`, `workers`, `sessions`, `range_queue`: the tables it keeps.
//! - `journal`: jobs and watermarks in redb, so a restart resumes delivery.
//! - `traces`: the root span of each batch sampled for tracing, from
//!   assignment to delivery, and the context that goes with its task.
//! - `meters`: what the coordinator records for Prometheus (leases,
//!   requeues, deliveries, trainers' stall).
//! - `service`: the gRPC services, thin adapters over the coordinator,
//!   and KEDA's external scaler (`service::keda`).
//! - `autoscale`: the policy that sizes the pool on the trainers' stall.
//! - `pool`: the worker pool (`--worker-pool local|kubernetes`), sized by
//!   `loaderctl scale` or the autoscaler.
//! - [`error`]: errors and their single mapping to gRPC codes.
//! - [`cli`]: the `loader-server` command line.

mod admission;
mod autoscale;
mod blobs;
pub mod cli;
pub mod config;
mod coordinator;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
mod jobs;
mod journal;
mod meters;
mod pool;
mod kept_ranges;
mod lanes;
mod range_queue;
mod service;
mod sessions;
mod traces;
mod workers;

use std::future::Future;
use std::sync::Arc;

use loader_proto::pb::{
    admin_service_server::AdminServiceServer, trainer_service_server::TrainerServiceServer,
    worker_service_server::WorkerServiceServer,
};
use loader_process::grpc::{Access, Services};
use loader_process::security::Role;
use tokio::net::TcpListener;

pub use config::{DEFAULT_LEASE_TTL, HEARTBEATS_PER_LEASE, LocalPoolConfig, ServerConfig, WorkerPoolConfig, heartbeat_interval};

use crate::coordinator::Coordinator;
use crate::pool::WorkerPool;
use crate::service::{admin::AdminApi, trainer::TrainerApi, worker::WorkerApi};

/// Why the coordinator could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The gRPC server failed.
    #[error(transparent)]
    Serve(#[from] loader_process::grpc::server::ServeError),
    /// The journal could not be opened or read.
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    /// The listening socket has no address.
    #[error("cannot read the listening address: {0}")]
    Address(std::io::Error),
    /// The worker pool could not start its first workers.
    #[error("worker pool: {0}")]
    Pool(error::CoordinatorError),
}

/// Serves the coordinator on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let pool = match &config.worker_pool {
        Some(pool) => {
            let addr = listener.local_addr().map_err(ServerError::Address)?;
            let url = loader_process::grpc::normalize(&addr.to_string(), config.security.tls.is_some());
            Some(Arc::new(WorkerPool::open(pool, url).await.map_err(ServerError::Pool)?))
        }
        None => None,
    };
    let security = config.security.clone();
    let coordinator = Coordinator::open(config)?;
    let stop = tokio_util::sync::CancellationToken::new();
    let reaper = tokio::spawn(coordinator.clone().reap_leases(stop.clone()));
    if let Some(pool) = &pool {
        pool.start(&coordinator, &stop).map_err(ServerError::Pool)?;
    }
    let shutdown = {
        let stop = stop.clone();
        async move {
            shutdown.await;
            stop.cancel();
        }
    };
    // Who may call what (docs/security.md): KEDA's scaler client sends no
    // headers, so its service also admits a verified client certificate.
    let services = Services::new(loader_proto::pb::FILE_DESCRIPTOR_SET)
        .with_connections(coordinator.connections.clone())
        .serve(Access::Role(Role::Worker), WorkerServiceServer::new(WorkerApi(coordinator.clone())))
        .serve(Access::Role(Role::Trainer), TrainerServiceServer::new(TrainerApi(coordinator.clone())))
        .serve(Access::RoleOrClientCert(Role::Admin), service::keda::server(coordinator.clone()))
        .serve(Access::Role(Role::Admin), AdminServiceServer::new(AdminApi { coordinator, pool: pool.clone() }));
    let served = loader_process::grpc::serve(listener, services, &security, shutdown).await;
    stop.cancel();
    let _ = reaper.await;
    if let Some(pool) = pool {
        pool.stop().await;
    }
    served?;
    Ok(())
}
