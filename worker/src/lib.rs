//! Loader's worker: pulls tasks from the coordinator, builds batches, and
//! serves them to trainers.
//!
//! # Layout
//! - [`config`]: [`WorkerConfig`], the settings a CLI or an embedding
//!   program fills in.
//! - [`cli`]: the `loader-worker` command line ([`main_with_args`]).
//! - `link`: the coordinator link — registration with bounded retry, the
//!   heartbeat loop (lease, reports, tasks, consumers that ended) and
//!   self-fencing.
//! - `drain`: when a draining worker may leave, including handing back
//!   batches that a live consumer does not fetch.
//! - `blobs`: the files a job needs beside its spec (a pickled Python
//!   dataset), found in the host's blob directory or fetched into it from
//!   the coordinator, before the job's dataset opens.
//! - `producer`: the thread that turns tasks into batches, FIFO, one batch
//!   at a time, with a per-job cache of opened datasets; it picks each
//!   batch's transport.
//! - `fetch_ahead`: telling a dataset that reads from a store which
//!   batches the producer makes next, so their fetches overlap.
//! - `storage_use`: the process's reads from stores, for its heartbeats.
//! - [`dataset`]: the [`Dataset`](dataset::Dataset) trait, the built-in
//!   datasets (`synthetic`, `tokens`, `npy`, `image_folder`, `webdataset`)
//!   and [`Datasets`], which a custom worker binary extends with its own
//!   (see [`run_with_datasets`] and `examples/custom-worker`).
//! - `mapped`: read-only mappings of dataset files guarded against the
//!   file changing under them (a SIGBUS becomes the job's corrupt-sample
//!   error naming the file, never the worker's death).
//! - [`image`]: the image pipeline (decode, crops, resizes, flips,
//!   normalize) that the image datasets run per sample.
//! - `batch_spans`: the produce and deliver spans of a batch sampled for
//!   tracing, children of the coordinator's span of it.
//! - `busy`: the fraction of wall time the producer spends making batches,
//!   marked around each batch and read by the link for each heartbeat.
//! - [`collate`]: one batch written in place into one buffer in the wire
//!   format of `loader_proto::batch`.
//! - `batch_buffers`: the buffers of batches made outside a ring slot,
//!   handed out again once a batch is dropped (no fresh pages per batch).
//! - `delivery`: where one batch goes (a ring slot or the gRPC outbox),
//!   written there and handed over, one path for both transports.
//! - `window`: how many batches this worker holds per consumer of each
//!   job, sized by the job's batch bytes, announced to the coordinator.
//! - [`budget`]: the memory the batches a worker holds may take, and the
//!   refusal of a job whose batches do not fit it.
//! - `meters`: what the worker records for Prometheus, with each
//!   consumer's handles built once (served with `--metrics-listen`).
//! - `outbox`: per-consumer queues of produced batches, handed out one per
//!   credit to the consumer's current `Fetch` stream.
//! - the shared-memory transport to co-located trainers (one Unix socket
//!   connection per trainer ring, its memfd mapped, batches collated
//!   straight into granted slots) is `loader_ring::worker`; the outboxes
//!   are its [`DeliveryLog`](loader_ring::worker::DeliveryLog).
//! - [`sample_cache`]: samples kept across epochs in a file the
//!   co-located workers of one loader share (a memfd or an unnamed file),
//!   written once per index, read without locks.
//! - `service`: the `BatchService` gRPC server (with health and reflection).
//! - [`error`]: [`WorkerError`], and the one mapping of errors to gRPC
//!   statuses.

mod batch_buffers;
mod batch_spans;
mod blobs;
pub mod budget;
mod busy;
mod cache_use;
pub mod cli;
pub mod collate;
pub mod config;
pub mod dataset;
mod delivery;
mod drain;
pub mod error;
mod fetch_ahead;
#[doc(hidden)]
pub mod fuzzing;
pub mod image;
mod kept_batches;
mod link;
pub(crate) mod mapped;
mod meters;
mod outbox;
mod producer;
#[cfg(test)]
mod ring_tests;
pub mod sample_cache;
mod service;
mod storage_use;
mod window;

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use cli::{main_with_args, main_with_datasets};
pub use config::WorkerConfig;
pub use dataset::{Dataset, DatasetError, Datasets, SampleKey, SampleTensor, Transform, Transformed};
pub use error::WorkerError;

use crate::blobs::BlobFetcher;
use crate::link::Link;
use crate::outbox::Outboxes;
use crate::producer::Producer;
use crate::window::Windows;
use loader_process::blobs::BlobDir;
use loader_process::security::{ClientSecurity, Role, SecurityArgs, ServerSecurity};
use loader_proto::pb::RegisterWorkerRequest;
use loader_ring::worker::Rings;

/// How long open connections get to close after the worker stops (their
/// streams have already ended).
const GRACE: Duration = Duration::from_secs(2);
/// How long a stopping worker waits for its producer to close its
/// datasets (a batch in progress is abandoned at its end).
const PRODUCER_GRACE: Duration = Duration::from_millis(500);

/// Runs a worker on `listener` until `shutdown` resolves (`Ok`) or a fatal
/// error: the coordinator cannot be reached within `connect_timeout`, refuses
/// the worker, or the lease is lost.
pub async fn run(
    listener: TcpListener,
    config: WorkerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), WorkerError> {
    run_with_datasets(listener, config, Datasets::new(), shutdown).await
}

/// What the worker checks as a server and presents as a client: trainers
/// fetch only with the trainer token; the worker token (the session keys'
/// secret) must be there too once tokens are on. The TLS files are read
/// here, so unusable ones fail before anything starts.
fn security_settings(args: &SecurityArgs) -> Result<(ServerSecurity, ClientSecurity), WorkerError> {
    let serving = args.server(&[Role::Trainer])?;
    if let Some(tls) = &serving.tls {
        tls.load()?;
    }
    Ok((serving, args.client(Role::Worker)?))
}

/// Removes the blob files nobody used for an hour from the host's blob
/// directory at `path` (a bounded look, so the start stays quick), and
/// refuses a directory that is not this user's. One that does not exist is
/// left so: it is made when a job first needs a blob, not by every worker
/// that starts.
fn sweep_blob_dir(path: &std::path::Path) -> Result<(), WorkerError> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    let dir = BlobDir::open(path)?;
    let swept = dir.sweep(loader_process::blobs::UNUSED_FOR, loader_process::blobs::SWEEP_ENTRIES);
    if swept > 0 {
        tracing::info!(dir = %dir.path().display(), swept, "removed blob files unused for an hour");
    }
    Ok(())
}

/// [`run`] for a worker that also serves the custom datasets registered in
/// `datasets` (jobs whose dataset is `custom { name }`).
pub async fn run_with_datasets(
    listener: TcpListener,
    config: WorkerConfig,
    datasets: Datasets,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), WorkerError> {
    let local = listener
        .local_addr()
        .map_err(|source| WorkerError::Listen { addr: "the given listener".into(), source })?;
    let (serving, calling) = security_settings(&config.security)?;
    let advertise = config
        .advertise
        .clone()
        .unwrap_or_else(|| loader_process::grpc::normalize(&local.to_string(), serving.tls.is_some()));
    if config.advertise.is_none() && local.ip().is_unspecified() {
        tracing::warn!("advertising {advertise}, which trainers cannot reach; set --advertise");
    }
    let node = config.node.clone().unwrap_or_else(loader_process::node::local_node);
    let outboxes = Outboxes::new();
    let rings = Rings::new(outboxes.clone(), advertise.clone(), tokio::runtime::Handle::current());
    let windows = Windows::new(config.max_outstanding);
    let budget = config.memory_budget.unwrap_or_else(budget::detect);
    let (coordinator, channel) = match link::channel(&config.coordinator, &calling) {
        Ok(c) => c,
        Err(e) => {
            rings.close();
            return Err(e);
        }
    };
    let blob_dir = config.blob_dir.clone().unwrap_or_else(loader_process::blobs::path_from_env);
    if let Err(e) = sweep_blob_dir(&blob_dir) {
        rings.close();
        return Err(e);
    }
    let blobs = BlobFetcher::new(channel.clone(), coordinator.clone(), tokio::runtime::Handle::current(), blob_dir);
    let datasets = match (config.cache, &config.cache_dir) {
        (Some(bytes), Some(dir)) if config.cache_shared => {
            // Caches of this node's workers that were killed: nobody
            // holds them, and their frames may be of files changed since.
            match sample_cache::on_node::sweep(dir) {
                Ok(0) => {}
                Ok(n) => tracing::info!(dir = %dir.display(), "sample cache: removed {n} left by workers that were killed"),
                Err(e) => tracing::warn!(dir = %dir.display(), "sample cache: cannot look for caches left behind: {e}"),
            }
            datasets.keep_frames_on_node(bytes, dir.clone())
        }
        (Some(bytes), _) => datasets.keep_frames(bytes, config.cache_dir.clone()),
        (None, _) => datasets,
    };
    let producer = Producer::spawn(outboxes.clone(), rings.clone(), windows.clone(), budget, datasets, Some(blobs))
        .map_err(WorkerError::Thread)?;
    producer.keep_shared(config.keep_shared);
    if !config.slow_batch.is_zero() {
        tracing::warn!(extra = ?config.slow_batch, "test knob: every batch is made slower");
        producer.slow_down(config.slow_batch);
    }
    let mut link = Link::new(
        coordinator,
        channel,
        RegisterWorkerRequest {
            address: advertise,
            node,
            memory_budget: budget,
            pid: std::process::id(),
            ..Default::default()
        },
        windows,
        producer.clone(),
        outboxes.clone(),
        rings.clone(),
    );

    let stop = CancellationToken::new();
    let mut server = tokio::spawn(service::serve(listener, outboxes.clone(), serving, stop.clone()));
    let work = async {
        let reg = link
            .register(Instant::now() + config.connect_timeout, config.connect_timeout)
            .await?;
        link.run(reg).await
    };
    let outcome = tokio::select! {
        () = shutdown => Ok(()),
        r = work => r,
        r = &mut server => match r {
            Ok(Ok(())) => Err(WorkerError::Serve("server stopped".into())),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(WorkerError::Serve(e.to_string())),
        },
    };

    producer.stop();
    // Within the trainer's grace before SIGKILL (1 s for embedded workers):
    // the batch at hand is abandoned, then the datasets close.
    let stopping = producer.clone();
    if !tokio::task::spawn_blocking(move || stopping.wait_ended(PRODUCER_GRACE)).await.unwrap_or(false) {
        tracing::debug!("the producer did not end within {PRODUCER_GRACE:?}");
    }
    outboxes.close();
    // Fenced or stopping: no more writes into any ring, and every mapping
    // goes with its connection.
    rings.close();
    stop.cancel();
    // A fenced worker leaves at once: its streams may cross a cut link that
    // would hold a graceful close for the whole grace period.
    let grace = if matches!(outcome, Err(WorkerError::LeaseLost { .. })) { Duration::ZERO } else { GRACE };
    if !server.is_finished() && tokio::time::timeout(grace, &mut server).await.is_err() {
        tracing::info!("connections still open after {grace:?}; closing them");
        server.abort();
    }
    outcome
}
