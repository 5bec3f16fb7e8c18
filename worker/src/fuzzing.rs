//! Entry points for the fuzz targets (`fuzz/`), not an API: the worker's
//! `BatchService` over in-memory outboxes (its side of the ring is fuzzed
//! through `loader_ring::fuzzing`).

use std::sync::Arc;

use bytes::Bytes;
use loader_proto::pb::batch_service_server::BatchService;
use tokio_util::sync::CancellationToken;

use crate::outbox::Outboxes;
use crate::service::FetchService;

/// The worker's `BatchService` with outboxes a target can fill.
#[derive(Debug)]
pub struct Fetch {
    /// The queues `Fetch` streams take batches from.
    outboxes: Arc<Outboxes>,
    /// Stops the streams' background tasks.
    stop: CancellationToken,
}

impl Default for Fetch {
    fn default() -> Self {
        Self { outboxes: Outboxes::new(), stop: CancellationToken::new() }
    }
}

impl Fetch {
    /// The service, as the worker's server mounts it.
    pub fn service(&self) -> impl BatchService {
        FetchService::new(Arc::clone(&self.outboxes), None, self.stop.clone())
    }

    /// Queues `batch` as the producer would: sequence number `seq` of
    /// consumer `consumer` of job `job_id`.
    pub fn push(&self, job_id: u64, consumer: u32, seq: u64, batch: Bytes) {
        self.outboxes.push((job_id, consumer), seq, batch, 1, tracing::Span::none());
    }

    /// Stops the service, as the worker's shutdown does.
    pub fn stop(&self) {
        self.stop.cancel();
        self.outboxes.close();
    }
}
