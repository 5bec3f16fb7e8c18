//! The public face of the SDK: [`LoaderBuilder`] opens a session, and
//! [`Loader`] yields its batches, blocking ([`Iterator`]) or async
//! ([`Loader::next_batch`], [`Loader::into_stream`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use loader_proto::pb::{Job, JobSpec};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::batch::{Batch, Expected};
use crate::connect;
use crate::consumer::Consumer;
use crate::error::LoaderError;
use crate::routes::Routes;
use crate::session::Session;

/// Credits per worker stream unless told otherwise.
pub const DEFAULT_PREFETCH: u32 = 8;

/// Settings of a [`Loader`]; start with [`Loader::builder`].
#[derive(Debug, Clone)]
pub struct LoaderBuilder {
    /// Coordinator URL (`host:port` is accepted too).
    coordinator: String,
    /// The job to create or attach to.
    spec: Option<JobSpec>,
    /// This trainer's data-parallel rank.
    rank: u32,
    /// Overrides `spec.consumers` when set.
    world_size: Option<u32>,
    /// Credits per worker stream: bounds the batches held per worker.
    prefetch: u32,
    /// Yield by sequence number (true) or as batches arrive.
    in_order: bool,
}

impl LoaderBuilder {
    /// A builder for the coordinator at `coordinator`.
    pub fn new(coordinator: impl Into<String>) -> Self {
        Self {
            coordinator: coordinator.into(),
            spec: None,
            rank: 0,
            world_size: None,
            prefetch: DEFAULT_PREFETCH,
            in_order: true,
        }
    }

    /// The job to create, or to attach to when a job of the same name exists.
    pub fn job(mut self, spec: JobSpec) -> Self {
        self.spec = Some(spec);
        self
    }

    /// This trainer's rank (consumer index), default 0.
    pub fn rank(mut self, rank: u32) -> Self {
        self.rank = rank;
        self
    }

    /// Number of data-parallel ranks; sets the job's `consumers`.
    pub fn world_size(mut self, world_size: u32) -> Self {
        self.world_size = Some(world_size);
        self
    }

    /// Batches each worker may send ahead of consumption (default 8).
    pub fn prefetch(mut self, prefetch: u32) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Yield strictly in sequence order (default) or as batches arrive.
    pub fn in_order(mut self, in_order: bool) -> Self {
        self.in_order = in_order;
        self
    }

    /// Connects and opens the session on a small runtime of its own; for
    /// synchronous training loops.
    pub fn build(self) -> Result<Loader, LoaderError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("loader-client")
            .enable_all()
            .build()
            .map_err(|e| LoaderError::Runtime(e.to_string()))?;
        let mut loader = runtime.block_on(self.build_async())?;
        loader.runtime = Some(runtime);
        Ok(loader)
    }

    /// Connects and opens the session on the caller's tokio runtime.
    pub async fn build_async(self) -> Result<Loader, LoaderError> {
        let mut spec = self.spec.ok_or_else(|| {
            LoaderError::InvalidArgument(
                "no job given: call .job(spec) before building the loader".into(),
            )
        })?;
        if let Some(w) = self.world_size {
            spec.consumers = w;
        }
        if self.rank >= spec.consumers {
            return Err(LoaderError::InvalidArgument(format!(
                "rank {} is outside world size {}",
                self.rank, spec.consumers
            )));
        }
        if self.prefetch == 0 {
            return Err(LoaderError::InvalidArgument("prefetch must be > 0".into()));
        }
        crate::spec::validate(&spec)?;
        let submitted_epochs = spec.epochs;
        let address = connect::normalize(&self.coordinator);
        let channel = connect::coordinator(&address).await?;
        let session = Arc::new(Session::open(&address, channel, spec, self.rank).await?);
        let job = session.job().clone();
        let epochs = job.spec.as_ref().map_or(submitted_epochs, |s| s.epochs);
        let total = job.batches_per_epoch * u64::from(epochs);
        let expected = Expected {
            job_id: job.job_id,
            consumer: self.rank,
            batches_per_epoch: job.batches_per_epoch,
            total,
        };

        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let stalled = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        tokio::spawn(
            session
                .clone()
                .run_heartbeats(events_tx.clone(), stop.child_token()),
        );
        let routes = Routes::new(
            session.clone(),
            expected,
            self.prefetch,
            events_tx,
            stalled.clone(),
        );
        tokio::spawn(routes.run(stop.child_token()));
        Ok(Loader {
            consumer: Consumer::new(events_rx, session, stalled, total, self.in_order),
            job,
            total,
            stop,
            handle: Handle::current(),
            runtime: None,
            #[cfg(feature = "embedded")]
            cluster: None,
        })
    }
}

/// A trainer's stream of batches: every batch of its rank, exactly once, in
/// order unless asked otherwise. Iterate it (blocking) or turn it into a
/// [`Stream`]. Dropping it stops its background tasks (and, in embedded
/// mode, the coordinator and workers it started).
#[derive(Debug)]
pub struct Loader {
    /// Reorders, de-duplicates and counts.
    consumer: Consumer,
    /// The job as the coordinator planned it.
    job: Job,
    /// Batches this rank receives over all epochs.
    total: u64,
    /// Stops the heartbeat, routes and fetch tasks.
    stop: CancellationToken,
    /// Where the background tasks run, for the blocking iterator.
    handle: Handle,
    /// Set by [`LoaderBuilder::build`]: the runtime the loader owns.
    runtime: Option<Runtime>,
    /// Embedded mode's coordinator and workers; dropped after everything else.
    #[cfg(feature = "embedded")]
    pub(crate) cluster: Option<crate::embedded::LocalCluster>,
}

impl Loader {
    /// A builder for a loader fed by the coordinator at `coordinator`.
    pub fn builder(coordinator: impl Into<String>) -> LoaderBuilder {
        LoaderBuilder::new(coordinator)
    }

    /// The job as the coordinator planned it.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// Batches per epoch for this rank (`len(DataLoader)`).
    pub fn batches_per_epoch(&self) -> u64 {
        self.job.batches_per_epoch
    }

    /// Batches over all epochs for this rank.
    pub fn total_batches(&self) -> u64 {
        self.total
    }

    /// Batches yielded so far.
    pub fn yielded(&self) -> u64 {
        self.consumer.yielded()
    }

    /// The next batch, awaiting it; `None` after the last one.
    pub async fn next_batch(&mut self) -> Option<Result<Batch, LoaderError>> {
        self.consumer.next().await
    }

    /// The same batches as an async [`Stream`].
    pub fn into_stream(self) -> BatchStream {
        let inner = futures::stream::unfold(self, |mut loader| async move {
            let item = loader.consumer.next().await?;
            Some((item, loader))
        });
        BatchStream {
            inner: Box::pin(inner),
        }
    }
}

impl Iterator for Loader {
    type Item = Result<Batch, LoaderError>;

    /// Blocks until the next batch. With a loader from
    /// [`LoaderBuilder::build_async`], call this from a thread that is not
    /// driving that runtime (e.g. `spawn_blocking`).
    fn next(&mut self) -> Option<Self::Item> {
        match &self.runtime {
            Some(rt) => rt.block_on(self.consumer.next()),
            None => {
                let _enter = self.handle.enter();
                futures::executor::block_on(self.consumer.next())
            }
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(rt) = self.runtime.take() {
            // Never blocks, so dropping a loader inside async code is fine.
            rt.shutdown_background();
        }
    }
}

/// [`Loader`] as an async [`Stream`] of batches.
pub struct BatchStream {
    inner: Pin<Box<dyn Stream<Item = Result<Batch, LoaderError>> + Send>>,
}

impl std::fmt::Debug for BatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchStream").finish_non_exhaustive()
    }
}

impl Stream for BatchStream {
    type Item = Result<Batch, LoaderError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}
