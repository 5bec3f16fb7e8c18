//! The public face of the SDK: [`Loader`] yields the batches of an open
//! session, blocking ([`Iterator`]) or async ([`Loader::next_batch`],
//! [`Loader::into_stream`]); [`open`] opens one for the builder
//! ([`LoaderBuilder`](crate::LoaderBuilder)), which checked what to open.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use loader_proto::pb::{Job, JobSpec};
use loader_ring::trainer::{ConnContext, Inbox, Ring, SlotRing};
use loader_ring::wake::WaitSet;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::batch::{Batch, Expected};
use crate::connect;
use crate::consumer::{Consumer, STALL_GRACE};
#[cfg(feature = "embedded")]
use crate::embedded::LocalCluster;
use crate::error::LoaderError;
use crate::event;
use crate::gap::GapWatch;
use crate::meters::TrainerMeters;
use crate::options::LoaderOptions;
use crate::pin::{Backend, Device, Opening, PinStage, Pull};
use crate::routes::Routes;
use crate::session::Session;
use crate::state::LoaderState;

/// The session a loader opens, checked by the builder: which job, as which
/// rank, from which batch.
#[derive(Debug)]
pub(crate) struct Seat {
    /// The job; its `consumers` is the world size.
    pub(crate) spec: JobSpec,
    /// This trainer's rank, below the world size.
    pub(crate) rank: u32,
    /// The first batch to yield and those above it already yielded (a saved
    /// state), or None to start at batch 0.
    pub(crate) start: Option<(u64, BTreeSet<u64>)>,
}

/// Batches from this size on are received on one runtime thread, smaller
/// ones on two. What the thread does per batch (HTTP/2 frames, checks, a
/// wake-up) is paid per batch, its copy from the socket per byte: with
/// large batches two threads hand the streams' wake-ups to each other and
/// spend more CPU per GB received, while one thread has room for several
/// GB/s; with small batches at hundreds of thousands a second one thread is
/// the bottleneck (both measured in docs/benchmarks.md, "Receiving over
/// gRPC": `bench/recv_cpu.py`, `bench/ab.py --transport grpc`).
const ONE_THREAD_FROM: u64 = 64 << 10;

/// Runtime threads for a loader whose batches are `batch_bytes` long
/// (unknown: two).
fn runtime_threads(batch_bytes: Option<u64>) -> usize {
    match batch_bytes {
        Some(bytes) if bytes >= ONE_THREAD_FROM => 1,
        _ => 2,
    }
}

/// Opens `seat`'s session on the coordinator at `coordinator` on a small
/// runtime of the loader's own; for synchronous training loops.
pub(crate) fn open_blocking(
    coordinator: &str,
    seat: Seat,
    options: &LoaderOptions,
) -> Result<Loader, LoaderError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(runtime_threads(crate::footprint::batch_bytes(&seat.spec)))
        .thread_name("loader-client")
        .enable_all()
        .build()
        .map_err(|e| LoaderError::Runtime(e.to_string()))?;
    let mut loader = runtime.block_on(open(coordinator, seat, options))?;
    loader.runtime = Some(runtime);
    Ok(loader)
}

/// Opens `seat`'s session on the coordinator at `coordinator` on the
/// caller's tokio runtime: binds the ring, connects, and starts the
/// background tasks. `seat` and `options` were checked by the builder.
pub(crate) async fn open(
    coordinator: &str,
    seat: Seat,
    options: &LoaderOptions,
) -> Result<Loader, LoaderError> {
    let Seat { spec, rank, start: resume } = seat;
    // Before any handle is made: handles made without the recorder record
    // nothing.
    let metrics_addr = match options.metrics_addr()? {
        Some(addr) => Some(
            loader_process::telemetry::metrics::serve(addr)
                .map_err(|e| LoaderError::InvalidArgument(format!("metrics_listen: {e}")))?,
        ),
        None => None,
    };
    let (mut ring, window) = bind_ring(&spec, options)?;
    // Before anything connects: a device that cannot be used is an error
    // (or, for `auto`, the host) before any batch is asked for.
    let (stage, device_fallback) = open_stage(options, ring.as_ref())?;
    let socket = ring
        .as_ref()
        .and_then(|r| r.socket().to_str())
        .unwrap_or_default()
        .to_owned();
    let submitted_epochs = spec.epochs;
    let address = connect::normalize(coordinator);
    let channel = connect::coordinator(&address, loader_process::security::Role::Trainer).await?;
    let resume_at = resume.as_ref().map(|(next_seq, _)| *next_seq);
    let session = Arc::new(
        Session::open(&address, channel, spec.clone(), rank, socket, resume_at)
            .await?
            .lost_after(options.coordinator_timeout),
    );
    let job = session.job().clone();
    let spec = job.spec.clone().unwrap_or(spec);
    let epochs = job.spec.as_ref().map_or(submitted_epochs, |s| s.epochs);
    let total = job.batches_per_epoch * u64::from(epochs);
    let expected = Expected {
        job_id: job.job_id,
        consumer: rank,
        stream: session.stream(),
        batches_per_epoch: job.batches_per_epoch,
        total,
    };

    let wait = Arc::new(
        WaitSet::new()
            .map_err(|e| LoaderError::Runtime(format!("cannot create an epoll set: {e}")))?,
    );
    let (events_tx, events_rx) = event::channel(Arc::clone(&wait));
    let stalled = Arc::new(Notify::new());
    let stop = CancellationToken::new();
    tokio::spawn(
        session
            .clone()
            .run_heartbeats(events_tx.clone(), stop.child_token()),
    );
    let inbox = ring.as_mut().map(|ring| {
        let inbox = Arc::new(Inbox::new(ring.shared(), Arc::clone(&wait)));
        let ctx = ConnContext {
            session_id: session.id_watch(),
            owner: (expected.job_id, expected.stream),
            inbox: Arc::clone(&inbox),
        };
        ring.serve(ctx, stop.child_token());
        inbox
    });
    let slots = ring.as_ref().map(Ring::shared);
    let routes = Routes::new(
        session.clone(),
        expected,
        window,
        events_tx.clone(),
        stalled.clone(),
    );
    let gap = slots
        .clone()
        .map(|ring| GapWatch::new(ring, routes.listed(), session.lease_ttl(), STALL_GRACE));
    tokio::spawn(routes.run(stop.child_token()));
    let mut consumer = Consumer::new(events_rx, wait, session, stalled, total, options.in_order);
    if metrics_addr.is_some() {
        consumer = consumer.with_meters(TrainerMeters::new(job.job_id, rank));
    }
    if let (Some(inbox), Some(gap)) = (inbox, gap) {
        consumer = consumer.with_ring(inbox, expected, gap);
    }
    if let Some((next_seq, above)) = resume {
        consumer = consumer.resuming(next_seq, above);
    }
    Ok(Loader {
        stage,
        device_fallback,
        consumer,
        job,
        spec,
        rank,
        total,
        ring,
        slots,
        stop,
        handle: Handle::current(),
        runtime: None,
        metrics_addr,
        #[cfg(feature = "embedded")]
        cluster: None,
        #[cfg(feature = "embedded")]
        events: events_tx,
    })
}

/// The shared-memory ring for `spec`'s batches and the window (batches in
/// flight) they travel in; no ring with shared memory off, or when one
/// cannot be made (every batch then streams over gRPC). Batches in flight
/// are counted in bytes (`loader_job::window`): small batches get a long
/// window, a ring of many small slots and as many stream credits, so
/// hand-offs are paid per window.
fn bind_ring(spec: &JobSpec, options: &LoaderOptions) -> Result<(Option<Ring>, u32), LoaderError> {
    let batch_bytes = crate::footprint::batch_bytes(spec);
    let window = batch_bytes.map_or(options.prefetch, |b| loader_job::window::batches(b, options.prefetch));
    if !options.shared_memory {
        return Ok((None, window));
    }
    let config = options.ring_config().sized_for(batch_bytes);
    let geometry = config.geometry(window)?;
    match Ring::bind(&config, geometry, window) {
        Ok(ring) => Ok((Some(ring), window)),
        Err(e) => {
            tracing::warn!("no shared-memory ring, every batch streams over gRPC: {e}");
            Ok((None, window))
        }
    }
}

/// The pin stage for `options.device` over `ring`'s memory, and why the
/// device fell back to the host, if it did (`auto` without a usable GPU).
fn open_stage(options: &LoaderOptions, ring: Option<&Ring>) -> Result<(Option<PinStage>, Option<String>), LoaderError> {
    Ok(match Backend::open(options.device, ring.map(Ring::shared))? {
        Opening::Staged(opened) => (
            Some(PinStage::new(opened.backend, opened.device, options.device_prefetch, options.coordinator_timeout)?),
            None,
        ),
        Opening::Host => (None, None),
        Opening::FellBack(why) => (None, Some(why)),
    })
}

/// A trainer's stream of batches: every batch of its rank, exactly once, in
/// order unless asked otherwise. Iterate it (blocking) or turn it into a
/// [`Stream`]. Dropping it stops its background tasks (and, in embedded
/// mode, the coordinator and workers it started).
#[derive(Debug)]
pub struct Loader {
    /// The pin-memory stage, for a loader with a device; dropped first, so
    /// every copy completes while the ring is still there.
    stage: Option<PinStage>,
    /// Why `device: auto` stayed on the host, for hosts that log it their
    /// own way (Python's `logging`).
    device_fallback: Option<String>,
    /// Reorders, de-duplicates and counts.
    consumer: Consumer,
    /// The job as the coordinator planned it.
    job: Job,
    /// The job's spec (its `consumers` is the world size), for `state()`.
    spec: JobSpec,
    /// This loader's rank, for `state()`.
    rank: u32,
    /// Batches this rank receives over all epochs.
    total: u64,
    /// The shared-memory ring's socket; its directory is removed on drop.
    ring: Option<Ring>,
    /// The ring's slots, for [`Loader::ring_slots`].
    slots: Option<Arc<SlotRing>>,
    /// Stops the heartbeat, routes and fetch tasks.
    stop: CancellationToken,
    /// Where the background tasks run, for the blocking iterator.
    handle: Handle,
    /// Set by [`open_blocking`]: the runtime the loader owns.
    runtime: Option<Runtime>,
    /// Where this process serves its metrics, when the options asked.
    metrics_addr: Option<SocketAddr>,
    /// Embedded mode's coordinator and workers, handed over by the builder;
    /// dropped after everything else.
    #[cfg(feature = "embedded")]
    pub(crate) cluster: Option<LocalCluster>,
    /// The consumer's event channel, for embedded mode's supervisor to end
    /// the iteration with an error when its workers keep dying.
    #[cfg(feature = "embedded")]
    pub(crate) events: event::EventTx,
}

impl Loader {
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

    /// Where this process serves Prometheus metrics (`GET /metrics`), when
    /// [`LoaderOptions::metrics_listen`](crate::LoaderOptions::metrics_listen)
    /// asked for it: the bound address, so port 0 tells which port.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The Unix socket co-located workers attach to the shared-memory ring
    /// through; None when the ring is off (or could not be set up). By
    /// default a name in Linux's abstract socket namespace, written as tokio
    /// takes it, with a leading NUL byte (no file exists, so nothing is left
    /// behind even by SIGKILL); a path under
    /// [`ring_dir`](crate::LoaderBuilder::ring_dir) when that was set.
    pub fn ring_socket(&self) -> Option<&Path> {
        self.ring.as_ref().map(Ring::socket)
    }

    /// Process ids of the workers embedded mode started (empty for a loader
    /// fed by a coordinator elsewhere): for diagnostics and for tests that
    /// check no worker outlives its loader.
    #[cfg(feature = "embedded")]
    pub fn worker_pids(&self) -> Vec<u32> {
        self.cluster
            .as_ref()
            .map(LocalCluster::pids)
            .unwrap_or_default()
    }

    /// The URL of the coordinator embedded mode started in this process
    /// (None for a loader fed by a coordinator elsewhere): `loaderctl
    /// status --coordinator URL` shows its workers, its job and the job's
    /// sample cache.
    #[cfg(feature = "embedded")]
    pub fn coordinator_address(&self) -> Option<String> {
        self.cluster.as_ref().map(|c| c.address().to_owned())
    }

    /// Slots of the shared-memory ring by state: free, granted to a worker,
    /// held by batches not yet dropped. None without a ring.
    pub fn ring_slots(&self) -> Option<RingSlots> {
        self.slots.as_ref().map(|s| {
            let c = s.census();
            RingSlots {
                free: c.free,
                granted: c.granted,
                held: c.held,
            }
        })
    }

    /// Batches yielded so far (for a resumed loader, including those its
    /// predecessors yielded); not those the pin stage holds.
    pub fn yielded(&self) -> u64 {
        let held = self.stage.as_ref().map_or(0, |s| s.pending().count() as u64);
        self.consumer.yielded().saturating_sub(held)
    }

    /// Where the batches land: the device asked for, or for `auto` the one
    /// it resolved to ([`Device::Cpu`] when no GPU was usable).
    pub fn device(&self) -> Device {
        self.stage.as_ref().map_or(Device::Cpu, PinStage::device)
    }

    /// Why a loader asked for `auto` stayed on the host (no driver library,
    /// no GPU, ...); None when it did not ask for `auto` or got a GPU.
    pub fn device_fallback(&self) -> Option<&str> {
        self.device_fallback.as_deref()
    }

    /// For a loader on a GPU: true when the shared-memory ring is registered
    /// with the driver, so batches are DMA'd from their slots with no
    /// staging copy (false: through pinned staging buffers).
    pub fn ring_registered(&self) -> bool {
        self.stage.as_ref().is_some_and(PinStage::ring_registered)
    }

    /// For a loader with a device: device buffers held now (by queued
    /// copies and by batches not yet dropped) and the most there can be.
    pub fn device_buffers(&self) -> Option<(usize, usize)> {
        self.stage.as_ref().map(|s| (s.buffers_held(), s.buffers()))
    }

    /// Where this loader stands, to save with a checkpoint and continue from
    /// with [`LoaderBuilder::resume`](crate::LoaderBuilder::resume): the
    /// job, the rank and world size, and the batches yielded so far (exactly
    /// those handed out by `next()`, not those prefetched). Cheap; call it between two `next()` calls, e.g.
    /// right after the training step that consumed the last batch.
    pub fn state(&self) -> LoaderState {
        let (next_seq, above): (u64, BTreeSet<u64>) = self.consumer.position();
        // Batches the pin stage took from the consumer but did not yield.
        let (next_seq, above) = match &self.stage {
            Some(stage) => crate::pin::unyield(next_seq, above, stage.pending()),
            None => (next_seq, above),
        };
        LoaderState::new(&self.spec, self.rank, next_seq, above)
    }

    /// Like [`Iterator::next`], but calls `interrupted` every `every` while
    /// it blocks and returns the first error it gives. Nothing is lost by an
    /// interruption: the batch being waited for is yielded by the next call.
    /// For hosts whose users must be able to stop a blocked call, such as
    /// Python's Ctrl-C (the callback checks for signals).
    pub fn next_interruptible<E>(
        &mut self,
        every: Duration,
        interrupted: impl FnMut() -> Result<(), E>,
    ) -> Result<Option<Result<Batch, LoaderError>>, E> {
        let _enter = self.handle.enter();
        // Like `Iterator::next`: this thread sleeps in the consumer's wait
        // set (woken by a worker's report), with a timeout at each check.
        let item = match self.stage.as_mut() {
            None => self.consumer.next_blocking_checked(Some(every), interrupted)?,
            Some(stage) => {
                let mut interrupted = interrupted;
                staged(stage, &mut self.consumer, |c| {
                    c.next_blocking_checked(Some(every), &mut interrupted)
                })?
            }
        };
        self.finish_if_due();
        Ok(item)
    }

    /// After the last batch: the final heartbeat, so the coordinator shows
    /// the job complete at once.
    fn finish_if_due(&mut self) {
        if self.consumer.take_finish_due() {
            let finish = self.consumer.finish();
            match &self.runtime {
                Some(rt) => rt.block_on(finish),
                None => futures::executor::block_on(finish),
            }
        }
    }

    /// The next batch, awaiting it; `None` after the last one.
    pub async fn next_batch(&mut self) -> Option<Result<Batch, LoaderError>> {
        let Some(stage) = self.stage.as_mut() else {
            return self.consumer.next().await;
        };
        // Bounded: each round queues one copy or stops; the stage asks for
        // at most `device_prefetch + 1`.
        loop {
            match stage.plan() {
                Err(e) => return Some(Err(e)),
                Ok(Pull::Enough) => break,
                Ok(Pull::Must(lease)) => {
                    let item = self.consumer.next().await;
                    stage.accept(item, lease);
                }
                Ok(Pull::May(lease)) => match self.consumer.try_next() {
                    Some(item) => stage.accept(item, lease),
                    None => break,
                },
            }
        }
        // The last batch came through `try_next`, which leaves the final
        // heartbeat to its caller.
        if self.consumer.take_finish_due() {
            self.consumer.finish().await;
        }
        stage.pop()
    }

    /// The same batches as an async [`Stream`].
    pub fn into_stream(self) -> BatchStream {
        let inner = futures::stream::unfold(self, |mut loader| async move {
            let item = loader.next_batch().await?;
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
    /// [`LoaderBuilder::build_async`](crate::LoaderBuilder::build_async),
    /// call this from a thread that is not driving that runtime (e.g.
    /// `spawn_blocking`).
    fn next(&mut self) -> Option<Self::Item> {
        let _enter = self.handle.enter();
        // This thread sleeps in the consumer's wait set: a worker's report
        // wakes it directly, without a hop through the runtime.
        let item = match self.stage.as_mut() {
            None => self.consumer.next_blocking(),
            Some(stage) => match staged(stage, &mut self.consumer, |c| Ok::<_, Infallible>(c.next_blocking())) {
                Ok(item) => item,
                Err(never) => match never {},
            },
        };
        self.finish_if_due();
        item
    }
}

/// The blocking front of the pin stage: pulls what the stage asks for
/// (`must` when it has nothing queued, only a ready batch otherwise), then
/// yields its next batch. Bounded: each round queues one copy or stops,
/// and the stage asks for at most `device_prefetch + 1`.
fn staged<E>(
    stage: &mut PinStage,
    consumer: &mut Consumer,
    mut must: impl FnMut(&mut Consumer) -> Result<Option<Result<Batch, LoaderError>>, E>,
) -> Result<Option<Result<Batch, LoaderError>>, E> {
    loop {
        match stage.plan() {
            Err(e) => return Ok(Some(Err(e))),
            Ok(Pull::Enough) => break,
            // An interruption drops the lease (its place returns to the
            // pool) and loses no batch: the consumer keeps it.
            Ok(Pull::Must(lease)) => {
                let item = must(consumer)?;
                stage.accept(item, lease);
            }
            Ok(Pull::May(lease)) => match consumer.try_next() {
                Some(item) => stage.accept(item, lease),
                None => break,
            },
        }
    }
    Ok(stage.pop())
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

/// How the slots of a loader's shared-memory ring are used right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSlots {
    /// Free, waiting for a worker to need one.
    pub free: usize,
    /// Granted to a worker, which may be writing a batch into it.
    pub granted: usize,
    /// Held by batches (yielded or waiting to be) not yet dropped.
    pub held: usize,
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
