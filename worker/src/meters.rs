//! What a worker records for Prometheus (served when `loader-worker` runs
//! with `--metrics-listen`; see `loader_process::telemetry::metrics` and
//! docs/operations.md).
//!
//! The handles of one consumer (job, rank) are built once, when the worker
//! first produces for it, and shared by the producer thread, the consumer's
//! outbox and its `Fetch` streams: recording a batch is a few atomic adds
//! and, for a histogram, a push into its lock-free bucket. Without a
//! recorder installed every handle is a no-op.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use loader_proto::ConsumerKey;
use metrics::{Counter, Gauge, Histogram};

/// Consumers whose handles are kept; past it the cache starts over (the
/// handles are registered again, to the same series).
const KEPT: usize = 1024;

/// The handles of every consumer this worker produced for.
#[derive(Debug, Default)]
pub(crate) struct Meters {
    consumers: Mutex<HashMap<ConsumerKey, Arc<ConsumerMeters>>>,
}

impl Meters {
    /// The handles of `key`, built the first time.
    pub(crate) fn consumer(&self, key: ConsumerKey) -> Arc<ConsumerMeters> {
        let mut consumers = self.consumers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = consumers.get(&key) {
            return Arc::clone(m);
        }
        if consumers.len() >= KEPT {
            consumers.clear();
        }
        let m = Arc::new(ConsumerMeters::new(key));
        consumers.insert(key, Arc::clone(&m));
        m
    }
}

/// Batches outboxes hold and credits trainers granted on `Fetch` streams
/// and not yet used, over every consumer (sampled on each heartbeat).
pub(crate) fn outboxes(batches: usize, credits: u64) {
    metrics::gauge!("loader_worker_outbox_batches").set(batches as f64);
    metrics::gauge!("loader_worker_fetch_credits").set(credits as f64);
}

/// The fraction (0 to 1) of the last heartbeat interval the producer
/// spent making batches (see `crate::busy`).
pub(crate) fn busy(fraction: f64) {
    metrics::gauge!("loader_worker_busy_ratio").set(fraction);
}

/// Bytes of shared streams' batches kept for trailing subscribers
/// (sampled on each heartbeat).
pub(crate) fn kept_bytes(bytes: u64) {
    metrics::gauge!("loader_worker_shared_kept_bytes").set(bytes as f64);
}

/// A shared stream's batch served from the kept batches instead of made.
pub(crate) fn kept_served(job_id: u64) {
    metrics::counter!("loader_worker_shared_kept_served_total", "job_id" => job_id.to_string()).increment(1);
}

/// Batches, samples and bytes handed to a consumer over one transport.
#[derive(Debug)]
pub(crate) struct Delivery {
    batches: Counter,
    samples: Counter,
    bytes: Counter,
}

impl Delivery {
    fn new(job: &str, transport: &'static str) -> Self {
        Self {
            batches: metrics::counter!("loader_worker_batches_delivered_total", "job_id" => job.to_owned(), "transport" => transport),
            samples: metrics::counter!("loader_worker_samples_delivered_total", "job_id" => job.to_owned(), "transport" => transport),
            bytes: metrics::counter!("loader_worker_bytes_delivered_total", "job_id" => job.to_owned(), "transport" => transport),
        }
    }

    /// One batch of `samples` samples and `bytes` bytes was handed over.
    pub(crate) fn record(&self, samples: u64, bytes: u64) {
        self.batches.increment(1);
        self.samples.increment(samples);
        self.bytes.increment(bytes);
    }
}

/// The handles of one consumer (job, rank).
pub(crate) struct ConsumerMeters {
    /// Batches written into the trainer's shared-memory ring.
    pub(crate) shm: Delivery,
    /// Batches sent on the consumer's `Fetch` stream.
    pub(crate) grpc: Delivery,
    /// Per batch: reading and transforming its samples.
    read: Histogram,
    /// Per batch: the rest of making it (buffer, header, tensor table).
    collate: Histogram,
    /// Per batch: from made to handed over (see docs/operations.md).
    deliver: Histogram,
    /// Time batches waited for a free slot of the trainer's ring.
    pub(crate) blocked_shm: Gauge,
    /// Time batches waited for a credit of the trainer's stream.
    pub(crate) blocked_grpc: Gauge,
    /// Corrupt samples left out under `on_corrupt: skip`.
    skipped: Counter,
}

impl std::fmt::Debug for ConsumerMeters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerMeters").finish_non_exhaustive()
    }
}

impl ConsumerMeters {
    fn new((job_id, consumer): ConsumerKey) -> Self {
        let job = job_id.to_string();
        let stage = |stage: &'static str| metrics::histogram!("loader_worker_stage_seconds", "job_id" => job.clone(), "stage" => stage);
        let blocked = |transport: &'static str| {
            metrics::gauge!(
                "loader_worker_blocked_seconds_total",
                "job_id" => job.clone(),
                "consumer" => consumer.to_string(),
                "transport" => transport
            )
        };
        Self {
            shm: Delivery::new(&job, "shm"),
            grpc: Delivery::new(&job, "grpc"),
            read: stage("read"),
            collate: stage("collate"),
            deliver: stage("deliver"),
            blocked_shm: blocked("shm"),
            blocked_grpc: blocked("grpc"),
            skipped: metrics::counter!("loader_worker_skipped_samples_total", "job_id" => job.clone()),
        }
    }

    /// One batch was made in `took`, `read` of it reading and transforming
    /// its samples.
    pub(crate) fn made(&self, took: Duration, read: Duration) {
        self.read.record(read.as_secs_f64());
        self.collate.record(took.saturating_sub(read).as_secs_f64());
    }

    /// One batch took `took` from made to handed over.
    pub(crate) fn delivered_after(&self, took: Duration) {
        self.deliver.record(took.as_secs_f64());
    }

    /// `n` corrupt samples were left out of a batch.
    pub(crate) fn skipped(&self, n: usize) {
        if n > 0 {
            self.skipped.increment(n as u64);
        }
    }
}
