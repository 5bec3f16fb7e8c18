//! The public face of the SDK: [`LoaderBuilder`] opens a session, and
//! [`Loader`] yields its batches, blocking ([`Iterator`]) or async
//! ([`Loader::next_batch`], [`Loader::into_stream`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use loader_proto::pb::{Job, JobSpec};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::batch::{Batch, Expected};
use crate::connect;
use crate::consumer::{Consumer, STALL_GRACE};
use crate::error::LoaderError;
use crate::event;
pub use crate::session::DEFAULT_COORDINATOR_TIMEOUT;
use crate::ring::{ConnContext, GapWatch, Inbox, Ring, RingConfig, SlotRing};
use crate::routes::Routes;
use crate::session::Session;
use crate::state::LoaderState;
use crate::wake::WaitSet;

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
    /// Offer co-located workers a shared-memory ring (true) or take every
    /// batch over gRPC.
    shared_memory: bool,
    /// Slots, slot size, socket directory and peers of the ring.
    ring: RingConfig,
    /// Continue where a saved state left off; replaces `spec`, `rank` and
    /// `world_size`.
    resume: Option<LoaderState>,
    /// The first batch to yield when there is no `resume`: an epoch other
    /// than the first without starting (and restarting) at batch 0.
    start_at: Option<u64>,
    /// How long the coordinator may not answer before the loader fails.
    coordinator_timeout: Duration,
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
            shared_memory: true,
            ring: RingConfig::default(),
            resume: None,
            start_at: None,
            coordinator_timeout: DEFAULT_COORDINATOR_TIMEOUT,
        }
    }

    /// How long the coordinator may stop answering while the loader runs
    /// (a restart on the same address is survived within it) before
    /// iteration fails with `LoaderError::CoordinatorLost` (default 15 s),
    /// on every transport.
    pub fn coordinator_timeout(mut self, timeout: Duration) -> Self {
        self.coordinator_timeout = timeout;
        self
    }

    /// The job to create, or to attach to when a job of the same name exists.
    pub fn job(mut self, spec: JobSpec) -> Self {
        self.spec = Some(spec);
        self
    }

    /// Continues exactly where the loader that produced `state` (see
    /// [`Loader::state`]) left off: the new loader yields the batches it had
    /// not yielded, in the same order and with the same samples, and nothing
    /// it had. The job, rank and world size come from `state` (whatever
    /// [`job`](Self::job), [`rank`](Self::rank) and
    /// [`world_size`](Self::world_size) say); the coordinator may be another
    /// one, with any number of workers: the job is created there when it does
    /// not exist. In-order and out-of-order loaders both resume exactly.
    pub fn resume(mut self, state: LoaderState) -> Self {
        self.resume = Some(state);
        self
    }

    /// Starts at batch `seq` of this rank's sequence (`epoch x
    /// batches_per_epoch` begins an epoch), as a loader that had yielded
    /// every batch before it: what `DistributedSampler.set_epoch` before the
    /// first batch asks for. A [`resume`](Self::resume) state takes
    /// precedence.
    pub fn start_at(mut self, seq: u64) -> Self {
        self.start_at = Some(seq);
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

    /// Batches each worker may send ahead of consumption, at least (default
    /// 8). Small batches get more: the window is sized by bytes (32 MiB of
    /// batches, 256 at most; see [`loader_proto::window`]), so a token
    /// window of 4 KB does not pay a hand-off per batch.
    pub fn prefetch(mut self, prefetch: u32) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Yield strictly in sequence order (default) or as batches arrive.
    pub fn in_order(mut self, in_order: bool) -> Self {
        self.in_order = in_order;
        self
    }

    /// Whether workers on this machine deliver through a shared-memory ring
    /// (default true; they write batches straight into this process's
    /// memory) or everything streams over gRPC (false). Remote workers
    /// always stream over gRPC.
    pub fn shared_memory(mut self, enabled: bool) -> Self {
        self.shared_memory = enabled;
        self
    }

    /// Geometry of the shared-memory ring: `slot_count` slots of `slot_size`
    /// bytes each (a multiple of 64 and of the page size; default: the
    /// batch's size as the spec tells it, at most 16 MiB, and twice as many
    /// slots as batches in flight, at least 4). A batch larger than a slot
    /// streams over gRPC instead. Memory is only touched as slots fill.
    pub fn ring(mut self, slot_count: u32, slot_size: u64) -> Self {
        self.ring.slot_count = Some(slot_count);
        self.ring.slot_size = slot_size;
        self
    }

    /// Binds the ring's socket in a private directory under `dir` instead of
    /// the abstract socket namespace: for a worker that shares that
    /// directory but not this process's network namespace. (A sidecar in
    /// the same Kubernetes pod shares the network namespace and needs no
    /// directory.) The directory is removed when the loader is dropped.
    pub fn ring_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.ring.dir = Some(dir.into());
        self
    }

    /// Lets workers running as user `uid` attach to the ring too (by
    /// default only this process's own user may).
    pub fn allow_ring_peer_uid(mut self, uid: u32) -> Self {
        self.ring.allowed_uids.insert(uid);
        self
    }

    /// Points the builder at another coordinator.
    #[cfg(feature = "embedded")]
    pub(crate) fn coordinator(mut self, coordinator: impl Into<String>) -> Self {
        self.coordinator = coordinator.into();
        self
    }

    /// The saved state to continue from, if one was given.
    #[cfg(feature = "embedded")]
    pub(crate) fn resume_state(&self) -> Option<&LoaderState> {
        self.resume.as_ref()
    }

    /// The batch to start at, if one was given.
    #[cfg(feature = "embedded")]
    pub(crate) fn start_seq(&self) -> Option<u64> {
        self.start_at
    }

    /// Fails on ring settings that cannot work, before anything starts.
    #[cfg(feature = "embedded")]
    pub(crate) fn check_ring(&self) -> Result<(), LoaderError> {
        if self.shared_memory {
            self.ring.geometry(self.prefetch)?;
        }
        Ok(())
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
        let (mut spec, rank, world_size, resume) = match &self.resume {
            Some(state) => (
                state.spec()?,
                state.rank(),
                Some(state.world_size()),
                Some((state.next_seq(), state.yielded_above().clone())),
            ),
            None => {
                let spec = self.spec.clone().ok_or_else(|| {
                    LoaderError::InvalidArgument(
                        "no job given: call .job(spec) before building the loader".into(),
                    )
                })?;
                let start = self.start_at.map(|seq| (seq, BTreeSet::new()));
                (spec, self.rank, self.world_size, start)
            }
        };
        if let Some(w) = world_size {
            spec.consumers = w;
        }
        if rank >= spec.consumers {
            return Err(LoaderError::InvalidArgument(format!(
                "rank {} is outside world size {}",
                rank, spec.consumers
            )));
        }
        if self.prefetch == 0 {
            return Err(LoaderError::InvalidArgument("prefetch must be > 0".into()));
        }
        let plan = crate::spec::validate(&spec)?;
        if let (None, Some(seq)) = (&self.resume, self.start_at) {
            let total = plan.total_batches();
            if seq > total {
                return Err(LoaderError::InvalidArgument(format!(
                    "cannot start at batch {seq}: rank {rank} of this job has only {total} batches"
                )));
            }
        } else if let Some((next_seq, above)) = &resume {
            let total = plan.total_batches();
            if *next_seq > total || above.last().is_some_and(|&s| s >= total) {
                return Err(LoaderError::State(format!(
                    "invalid loader state: it has yielded batches up to {}, but rank {rank} of its job has only {total}",
                    above.last().copied().unwrap_or(*next_seq)
                )));
            }
        }
        // Batches in flight are counted in bytes (`loader_proto::window`):
        // small batches get a long window, a ring of many small slots and
        // as many stream credits, so hand-offs are paid per window.
        let batch_bytes = crate::spec::batch_bytes(&spec);
        let window = batch_bytes.map_or(self.prefetch, |b| loader_proto::window::batches(b, self.prefetch));
        let mut ring = if self.shared_memory {
            let config = self.ring.sized_for(batch_bytes);
            let geometry = config.geometry(window)?;
            match Ring::bind(&config, geometry, window) {
                Ok(ring) => Some(ring),
                Err(e) => {
                    tracing::warn!("no shared-memory ring, every batch streams over gRPC: {e}");
                    None
                }
            }
        } else {
            None
        };
        let socket = ring
            .as_ref()
            .and_then(|r| r.socket().to_str())
            .unwrap_or_default()
            .to_owned();
        let submitted_epochs = spec.epochs;
        let address = connect::normalize(&self.coordinator);
        let channel = connect::coordinator(&address).await?;
        let resume_at = resume.as_ref().map(|(next_seq, _)| *next_seq);
        let session = Arc::new(
            Session::open(&address, channel, spec.clone(), rank, socket, resume_at)
                .await?
                .lost_after(self.coordinator_timeout),
        );
        let job = session.job().clone();
        let spec = job.spec.clone().unwrap_or(spec);
        let epochs = job.spec.as_ref().map_or(submitted_epochs, |s| s.epochs);
        let total = job.batches_per_epoch * u64::from(epochs);
        let expected = Expected {
            job_id: job.job_id,
            consumer: rank,
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
            let inbox = Arc::new(Inbox::new(ring.shared(), Arc::clone(&wait), expected));
            let ctx = ConnContext {
                session: session.clone(),
                expected,
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
        let mut consumer = Consumer::new(events_rx, wait, session, stalled, total, self.in_order);
        if let (Some(inbox), Some(gap)) = (inbox, gap) {
            consumer = consumer.with_ring(inbox, gap);
        }
        if let Some((next_seq, above)) = resume {
            consumer = consumer.resuming(next_seq, above);
        }
        Ok(Loader {
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
            #[cfg(feature = "embedded")]
            cluster: None,
            #[cfg(feature = "embedded")]
            events: events_tx,
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
    /// Set by [`LoaderBuilder::build`]: the runtime the loader owns.
    runtime: Option<Runtime>,
    /// Embedded mode's coordinator and workers; dropped after everything else.
    #[cfg(feature = "embedded")]
    pub(crate) cluster: Option<crate::embedded::LocalCluster>,
    /// The consumer's event channel, for embedded mode's supervisor to end
    /// the iteration with an error when its workers keep dying.
    #[cfg(feature = "embedded")]
    pub(crate) events: event::EventTx,
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

    /// The Unix socket co-located workers attach to the shared-memory ring
    /// through; None when the ring is off (or could not be set up). By
    /// default a name in Linux's abstract socket namespace, written as tokio
    /// takes it, with a leading NUL byte (no file exists, so nothing is left
    /// behind even by SIGKILL); a path under [`LoaderBuilder::ring_dir`]
    /// when that was set.
    pub fn ring_socket(&self) -> Option<&Path> {
        self.ring.as_ref().map(Ring::socket)
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
    /// predecessors yielded).
    pub fn yielded(&self) -> u64 {
        self.consumer.yielded()
    }

    /// Where this loader stands, to save with a checkpoint and continue from
    /// with [`LoaderBuilder::resume`]: the job, the rank and world size, and
    /// the batches yielded so far (exactly those handed out by `next()`, not
    /// those prefetched). Cheap; call it between two `next()` calls, e.g.
    /// right after the training step that consumed the last batch.
    pub fn state(&self) -> LoaderState {
        let (next_seq, above): (u64, BTreeSet<u64>) = self.consumer.position();
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
        let item = self
            .consumer
            .next_blocking_checked(Some(every), interrupted)?;
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
        let _enter = self.handle.enter();
        // This thread sleeps in the consumer's wait set: a worker's report
        // wakes it directly, without a hop through the runtime.
        let item = self.consumer.next_blocking();
        self.finish_if_due();
        item
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
