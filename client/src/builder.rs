//! [`LoaderBuilder`]: what a [`Loader`] reads (the job, this rank, where
//! to start), where its coordinator is (a URL, or one that embedded mode
//! starts in this process with local workers) and how it delivers
//! ([`LoaderOptions`]). `build` checks all it can before anything starts,
//! starts embedded mode's cluster when asked to, and opens the session on
//! the coordinator's address (`loader::open`).

use std::collections::BTreeSet;
#[cfg(feature = "embedded")]
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use loader_proto::pb::JobSpec;
#[cfg(feature = "embedded")]
use loader_server::ServerConfig;

#[cfg(feature = "embedded")]
use crate::embedded::{ClusterConfig, LocalCluster};
use crate::error::LoaderError;
use crate::loader::{self, Loader, Seat};
use crate::options::{LoaderOptions, RingSize};
use crate::pin::Device;
use crate::state::LoaderState;

/// Settings of a [`Loader`]; start with [`Loader::builder`] (a coordinator
/// elsewhere) or [`Loader::local_builder`] (embedded mode).
#[derive(Debug, Clone)]
pub struct LoaderBuilder {
    /// Where the coordinator is, or what embedded mode starts.
    source: Source,
    /// The job to create or attach to.
    spec: Option<JobSpec>,
    /// This trainer's data-parallel rank.
    rank: Option<u32>,
    /// Overrides `spec.consumers` when set.
    world_size: Option<u32>,
    /// Continue where a saved state left off; replaces `spec`, and `rank`
    /// and `world_size` when they are not set.
    resume: Option<LoaderState>,
    /// Samples per batch of a resumed job, when not the saved one's.
    resume_batch_size: Option<u32>,
    /// The first batch to yield when there is no `resume`: an epoch other
    /// than the first without starting (and restarting) at batch 0.
    start_at: Option<u64>,
    /// How batches are delivered; the setters below write into it.
    options: LoaderOptions,
    /// The first embedded-only setter called on a builder for a coordinator
    /// elsewhere: `build` fails naming it instead of ignoring it.
    misplaced: Option<&'static str>,
}

/// Where a loader's coordinator comes from.
#[derive(Debug, Clone)]
enum Source {
    /// A coordinator already running at this URL (`host:port` too).
    Coordinator(String),
    /// Embedded mode: a coordinator started in this process, and workers.
    #[cfg(feature = "embedded")]
    Local(Box<ClusterConfig>),
}

impl Loader {
    /// A builder for a loader fed by the coordinator at `coordinator`.
    pub fn builder(coordinator: impl Into<String>) -> LoaderBuilder {
        LoaderBuilder::new(coordinator)
    }

    /// A loader over a coordinator started in-process and `workers` local
    /// worker processes: the drop-in for `DataLoader(num_workers=N)`.
    #[cfg(feature = "embedded")]
    pub fn local(spec: JobSpec, workers: usize) -> Result<Loader, LoaderError> {
        Self::local_builder(spec, workers).build()
    }

    /// Like [`Loader::local`], with settings: the options of any loader,
    /// plus [`worker_command`](LoaderBuilder::worker_command),
    /// [`server_config`](LoaderBuilder::server_config) and
    /// [`ready_timeout`](LoaderBuilder::ready_timeout). The loader is rank 0
    /// of 1 (the spec's `consumers` is set to 1).
    #[cfg(feature = "embedded")]
    pub fn local_builder(spec: JobSpec, workers: usize) -> LoaderBuilder {
        LoaderBuilder {
            source: Source::Local(Box::new(ClusterConfig::new(workers))),
            spec: Some(spec),
            ..LoaderBuilder::new(String::new())
        }
    }
}

impl LoaderBuilder {
    /// A builder for the coordinator at `coordinator`.
    pub fn new(coordinator: impl Into<String>) -> Self {
        Self {
            source: Source::Coordinator(coordinator.into()),
            spec: None,
            rank: None,
            world_size: None,
            resume: None,
            resume_batch_size: None,
            start_at: None,
            options: LoaderOptions::default(),
            misplaced: None,
        }
    }

    /// The job to create, or to attach to when a job of the same name exists.
    pub fn job(mut self, spec: JobSpec) -> Self {
        self.spec = Some(spec);
        self
    }

    /// Continues exactly where the loader that produced `state` (see
    /// [`Loader::state`]) left off: the new loader yields the batches it had
    /// not yielded, in the same order and with the same samples, and nothing
    /// it had. The job comes from `state` (whatever [`job`](Self::job)
    /// says); so do the rank and world size unless [`rank`](Self::rank) and
    /// [`world_size`](Self::world_size) are set. The coordinator may be
    /// another one, with any number of workers: the job is created there
    /// when it does not exist. In-order and out-of-order loaders both resume
    /// exactly.
    ///
    /// On another world size (or batch size, see
    /// [`resume_batch_size`](Self::resume_batch_size)) every new rank loads
    /// the same state (one rank's, when the ranks saved at the same step, or
    /// [`LoaderState::merge`] of all of them) and the rest of the job is
    /// re-planned: every sample of the epoch is delivered once over the
    /// whole run (see [`LoaderState::resume_as`]). Embedded mode is one rank
    /// of one, so any state resumes there this way.
    pub fn resume(mut self, state: LoaderState) -> Self {
        self.resume = Some(state);
        self
    }

    /// With [`resume`](Self::resume): samples per batch of the resumed job
    /// (by default the saved job's). Keeping `batch_size x world_size` as
    /// it was keeps the global batches the uninterrupted run would have had.
    pub fn resume_batch_size(mut self, batch_size: u32) -> Self {
        self.resume_batch_size = Some(batch_size);
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
        self.rank = Some(rank);
        self
    }

    /// Number of data-parallel ranks; sets the job's `consumers`.
    pub fn world_size(mut self, world_size: u32) -> Self {
        self.world_size = Some(world_size);
        self
    }

    /// All delivery options at once, replacing any set before (the setters
    /// below each set one of them).
    pub fn options(mut self, options: LoaderOptions) -> Self {
        self.options = options;
        self
    }

    /// Batches each worker may send ahead of consumption, at least (default
    /// 8). Small batches get more: the window is sized by bytes (32 MiB of
    /// batches, 256 at most; see [`loader_job::window`]), so a token
    /// window of 4 KB does not pay a hand-off per batch.
    pub fn prefetch(mut self, prefetch: u32) -> Self {
        self.options.prefetch = prefetch;
        self
    }

    /// Yield strictly in sequence order (default) or as batches arrive.
    pub fn in_order(mut self, in_order: bool) -> Self {
        self.options.in_order = in_order;
        self
    }

    /// Where batches land (default [`Device::Cpu`]): `Device::Cuda(n)`
    /// copies each batch to GPU `n` straight from the shared-memory ring
    /// (feature `cuda`; `build` fails in one line when no GPU is usable),
    /// `Device::Auto` uses GPU 0 when it can and the host otherwise. Parse
    /// a string with `"cuda:0".parse::<Device>()`.
    pub fn device(mut self, device: Device) -> Self {
        self.options.device = device;
        self
    }

    /// Host-to-device copies queued ahead of the batch being yielded
    /// (default 2); GPU memory is bounded by `device_prefetch + 2` batches.
    pub fn device_prefetch(mut self, depth: u32) -> Self {
        self.options.device_prefetch = depth;
        self
    }

    /// Whether workers on this machine deliver through a shared-memory ring
    /// (default true; they write batches straight into this process's
    /// memory) or everything streams over gRPC (false). Remote workers
    /// always stream over gRPC.
    pub fn shared_memory(mut self, enabled: bool) -> Self {
        self.options.shared_memory = enabled;
        self
    }

    /// Geometry of the shared-memory ring: `slot_count` slots of `slot_size`
    /// bytes each (a multiple of 64 and of the page size; default: the
    /// batch's size as the spec tells it, at most 16 MiB, and twice as many
    /// slots as batches in flight, at least 4). A batch larger than a slot
    /// streams over gRPC instead. Memory is only touched as slots fill.
    pub fn ring(mut self, slot_count: u32, slot_size: u64) -> Self {
        self.options.ring = Some(RingSize { slots: slot_count, slot_bytes: slot_size });
        self
    }

    /// Binds the ring's socket in a private directory under `dir` instead of
    /// the abstract socket namespace: for a worker that shares that
    /// directory but not this process's network namespace. (A sidecar in
    /// the same Kubernetes pod shares the network namespace and needs no
    /// directory.) The directory is removed when the loader is dropped.
    pub fn ring_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.options.ring_dir = Some(dir.into());
        self
    }

    /// Lets workers running as user `uid` attach to the ring too (by
    /// default only this process's own user may).
    pub fn allow_ring_peer_uid(mut self, uid: u32) -> Self {
        self.options.allow_ring_peer_uids.insert(uid);
        self
    }

    /// How long the coordinator may stop answering while the loader runs
    /// (a restart on the same address is survived within it) before
    /// iteration fails with `LoaderError::CoordinatorLost` (default 15 s),
    /// on every transport.
    pub fn coordinator_timeout(mut self, timeout: Duration) -> Self {
        self.options.coordinator_timeout = timeout;
        self
    }

    /// Serve this process's Prometheus metrics (batches consumed, stall
    /// time) on `addr` (`IP:PORT`, port 0 for any free one; see
    /// [`Loader::metrics_addr`]). Off by default.
    pub fn metrics_listen(mut self, addr: impl Into<String>) -> Self {
        self.options.metrics_listen = Some(addr.into());
        self
    }

    /// Embedded mode: the command that starts a worker (program, then
    /// leading arguments; `--coordinator URL --listen 127.0.0.1:0` are
    /// appended). Without it: `$LOADER_WORKER_BIN`, else `loader-worker`
    /// next to the current executable or in its parent directory, else
    /// `loader-worker` on `PATH`.
    #[cfg(feature = "embedded")]
    pub fn worker_command(self, command: Option<Vec<OsString>>) -> Self {
        self.local("worker_command", |c| c.worker_command = command)
    }

    /// Embedded mode: starts the workers with `launcher` instead of a
    /// worker command (the Python SDK forks them from a template process).
    #[cfg(feature = "embedded")]
    pub fn worker_launcher(self, launcher: std::sync::Arc<dyn crate::embedded::WorkerLauncher>) -> Self {
        self.local("worker_launcher", |c| c.launcher = Some(launcher))
    }

    /// Embedded mode: settings of the embedded coordinator (lease TTL,
    /// range length...).
    #[cfg(feature = "embedded")]
    pub fn server_config(self, config: ServerConfig) -> Self {
        self.local("server_config", |c| c.server = config)
    }

    /// Embedded mode: how long the workers get to register (default 10 s).
    #[cfg(feature = "embedded")]
    pub fn ready_timeout(self, timeout: Duration) -> Self {
        self.local("ready_timeout", |c| c.ready_timeout = timeout)
    }

    /// Applies an embedded-only setting, or remembers that `setter` was
    /// called on a builder that starts nothing.
    #[cfg(feature = "embedded")]
    fn local(mut self, setter: &'static str, set: impl FnOnce(&mut ClusterConfig)) -> Self {
        match &mut self.source {
            Source::Local(cluster) => set(cluster),
            Source::Coordinator(_) => {
                self.misplaced.get_or_insert(setter);
            }
        }
        self
    }

    /// Connects and opens the session on a small runtime of its own; for
    /// synchronous training loops. In embedded mode, first starts the
    /// coordinator and the workers and waits until every worker has
    /// registered; from async code, call it inside `spawn_blocking`.
    pub fn build(self) -> Result<Loader, LoaderError> {
        self.options.validate()?;
        // A GPU that cannot be used fails here, before processes start.
        crate::pin::preflight(self.options.device)?;
        match self.source {
            Source::Coordinator(ref coordinator) => {
                self.check_misplaced(coordinator)?;
                loader::open_blocking(coordinator, self.seat()?, &self.options)
            }
            #[cfg(feature = "embedded")]
            Source::Local(ref cluster) => {
                let cluster = ClusterConfig::clone(cluster);
                self.build_local(cluster)
            }
        }
    }

    /// Connects and opens the session on the caller's tokio runtime. Not for
    /// embedded mode, which starts processes and blocks: use
    /// [`build`](Self::build) there.
    pub async fn build_async(self) -> Result<Loader, LoaderError> {
        match &self.source {
            Source::Coordinator(coordinator) => {
                self.check_misplaced(coordinator)?;
                loader::open(coordinator, self.seat()?, &self.options).await
            }
            #[cfg(feature = "embedded")]
            Source::Local(_) => Err(LoaderError::InvalidArgument(
                "embedded mode starts processes and blocks: build it with build() (inside spawn_blocking from async code)".into(),
            )),
        }
    }

    /// Fails when an embedded-only setter was called on this builder for a
    /// coordinator elsewhere.
    fn check_misplaced(&self, coordinator: &str) -> Result<(), LoaderError> {
        match self.misplaced {
            Some(setter) => Err(LoaderError::InvalidArgument(format!(
                "{setter} is for embedded mode (Loader::local_builder), but this loader reads from the coordinator at {coordinator}"
            ))),
            None => Ok(()),
        }
    }

    /// The session to open, every setting checked: the job, rank and start
    /// from `resume` or from the setters, and the options.
    fn seat(&self) -> Result<Seat, LoaderError> {
        let (mut spec, rank, world_size, start) = match &self.resume {
            Some(state) => {
                let rank = self.rank.unwrap_or(state.rank());
                let world_size = self.world_size.unwrap_or(state.world_size());
                let resumed = match new_weights(self.spec.as_ref(), &state.spec()?) {
                    Some(w) => state.resume_reweighted(rank, world_size, self.resume_batch_size, &w)?,
                    None => state.resume_as(rank, world_size, self.resume_batch_size)?,
                };
                let mut spec = resumed.spec;
                crate::blobs::carry_sources(&mut spec, self.spec.as_ref());
                let start = Some((resumed.next_seq, resumed.yielded_above));
                (spec, rank, Some(world_size), start)
            }
            None => {
                if self.resume_batch_size.is_some() {
                    return Err(LoaderError::InvalidArgument(
                        "resume_batch_size is for a resumed loader: call .resume(state) too".into(),
                    ));
                }
                let spec = self.spec.clone().ok_or_else(|| {
                    LoaderError::InvalidArgument(
                        "no job given: call .job(spec) before building the loader".into(),
                    )
                })?;
                let start = self.start_at.map(|seq| (seq, BTreeSet::new()));
                (spec, self.rank.unwrap_or(0), self.world_size, start)
            }
        };
        if let Some(w) = world_size {
            spec.consumers = w;
        }
        // A fresh job's mixture is cut into its own global batches; a
        // resumed one's spec already holds the first job's.
        fix_mix_block(&mut spec);
        if rank >= spec.consumers {
            return Err(LoaderError::InvalidArgument(format!(
                "rank {} is outside world size {}",
                rank, spec.consumers
            )));
        }
        self.options.validate()?;
        let plan = crate::spec::validate(&spec)?;
        if let (None, Some(seq)) = (&self.resume, self.start_at) {
            let total = plan.total_batches();
            if seq > total {
                return Err(LoaderError::InvalidArgument(format!(
                    "cannot start at batch {seq}: rank {rank} of this job has only {total} batches"
                )));
            }
        } else if let Some((next_seq, above)) = &start {
            let total = plan.total_batches();
            if *next_seq > total || above.last().is_some_and(|&s| s >= total) {
                return Err(LoaderError::State(format!(
                    "invalid loader state: it has yielded batches up to {}, but rank {rank} of its job has only {total}",
                    above.last().copied().unwrap_or(*next_seq)
                )));
            }
        }
        // A resumed job has no batches before its first: a start below it
        // (a saved state's, or an epoch's start) begins there.
        let first = plan.first_seq();
        let start = start.map(|(seq, above)| (seq.max(first), above)).or((first > 0).then(|| (first, BTreeSet::new())));
        Ok(Seat { spec, rank, start })
    }

    /// Embedded mode: checks everything before any process starts, starts
    /// the cluster, opens the loader as rank 0 of 1 on its coordinator and
    /// hands the cluster to the loader.
    #[cfg(feature = "embedded")]
    fn build_local(mut self, cluster: ClusterConfig) -> Result<Loader, LoaderError> {
        if self.rank.is_some_and(|r| r != 0) || self.world_size.is_some_and(|w| w != 1) {
            return Err(LoaderError::InvalidArgument(format!(
                "embedded mode runs one rank, but rank {} of {} was asked for; read from a coordinator with Loader::builder",
                self.rank.unwrap_or(0),
                self.world_size.unwrap_or(1)
            )));
        }
        // One rank of one: a state of another world size is re-planned.
        self.rank = Some(0);
        let mut spec = match &self.resume {
            Some(state) => match new_weights(self.spec.as_ref(), &state.spec()?) {
                Some(w) => state.resume_reweighted(0, 1, self.resume_batch_size, &w)?.spec,
                None => state.resume_as(0, 1, self.resume_batch_size)?.spec,
            },
            None => self.spec.clone().ok_or_else(|| {
                LoaderError::InvalidArgument(
                    "no job given: call .job(spec) before building the loader".into(),
                )
            })?,
        };
        spec.consumers = 1;
        fix_mix_block(&mut spec);
        // Fail on a bad spec, start, option or ring before starting any
        // process.
        let plan = crate::spec::validate(&spec)?;
        if let (None, Some(seq)) = (&self.resume, self.start_at)
            && seq > plan.total_batches()
        {
            return Err(LoaderError::InvalidArgument(format!(
                "cannot start at batch {seq}: this job has only {} batches",
                plan.total_batches()
            )));
        }
        if self.resume.is_none() {
            self.spec = Some(spec);
        }
        self.world_size = Some(1);
        self.options.validate()?;
        if self.options.shared_memory {
            self.options.ring_config().geometry(self.options.prefetch)?;
        }
        let seat = self.seat()?;
        let mut cluster = LocalCluster::start(cluster)?;
        let mut loader = loader::open_blocking(cluster.address(), seat, &self.options)?;
        cluster.supervise(loader.events.clone())?;
        loader.cluster = Some(cluster);
        Ok(loader)
    }
}

#[cfg(all(test, feature = "embedded"))]
mod tests {
    use loader_proto::pb::Dtype;

    use super::*;

    fn four_batches() -> JobSpec {
        // 64 samples in batches of 16: 4 batches.
        crate::spec::synthetic(64, &[4], Dtype::U8)
            .batch_size(16)
            .build()
            .expect("spec")
    }

    /// A worker command that cannot run: a check that fails with its own
    /// message shows that nothing was started before it.
    fn nonexistent_worker() -> Option<Vec<OsString>> {
        Some(vec![OsString::from("/nonexistent/loader-worker")])
    }

    #[test]
    fn a_start_past_the_job_is_one_line_before_any_process_starts() {
        let e = Loader::local_builder(four_batches(), 1)
            .worker_command(nonexistent_worker())
            .start_at(5)
            .build()
            .expect_err("past the end");
        assert_eq!(
            e.to_string(),
            "cannot start at batch 5: this job has only 4 batches"
        );
    }

    #[test]
    fn a_resume_batch_size_without_a_state_is_one_line_before_any_process_starts() {
        let e = Loader::local_builder(four_batches(), 1)
            .worker_command(nonexistent_worker())
            .resume_batch_size(8)
            .build()
            .expect_err("nothing to resume");
        assert_eq!(
            e.to_string(),
            "resume_batch_size is for a resumed loader: call .resume(state) too"
        );
    }

    #[test]
    fn bad_options_are_one_line_before_any_process_starts() {
        let e = Loader::local_builder(four_batches(), 1)
            .worker_command(nonexistent_worker())
            .prefetch(0)
            .build()
            .expect_err("prefetch 0");
        assert_eq!(e.to_string(), "prefetch must be > 0");
        let e = Loader::local_builder(four_batches(), 1)
            .worker_command(nonexistent_worker())
            .ring(0, 64 << 10)
            .build()
            .expect_err("no slots");
        assert!(e.to_string().starts_with("ring slot count 0"), "{e}");
    }

    #[test]
    fn embedded_only_setters_on_a_coordinator_builder_fail_at_build() {
        for (setter, builder) in [
            ("worker_command", Loader::builder("127.0.0.1:1").worker_command(None)),
            ("server_config", Loader::builder("127.0.0.1:1").server_config(ServerConfig::default())),
            ("ready_timeout", Loader::builder("127.0.0.1:1").ready_timeout(Duration::from_secs(1))),
        ] {
            let e = builder.job(four_batches()).build().expect_err(setter).to_string();
            assert!(e.starts_with(setter) && e.contains("Loader::local_builder"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn embedded_mode_is_one_rank_and_builds_blocking() {
        let e = Loader::local_builder(four_batches(), 1)
            .worker_command(nonexistent_worker())
            .rank(1)
            .world_size(2)
            .build()
            .expect_err("rank 1 of 2");
        assert!(e.to_string().contains("rank 1 of 2"), "{e}");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let e = runtime
            .block_on(Loader::local_builder(four_batches(), 1).build_async())
            .expect_err("async");
        assert!(e.to_string().contains("build()"), "{e}");
    }
}

/// A mixture's new weights at a resume: those of the job given with
/// `.job(spec)` beside `.resume(state)`, when they differ from the saved
/// job's (a curriculum's next stage).
fn new_weights(given: Option<&JobSpec>, saved: &JobSpec) -> Option<Vec<f64>> {
    let weights = |s: &JobSpec| match s.dataset.as_ref()?.kind.as_ref()? {
        loader_proto::pb::dataset_spec::Kind::Mix(m) => Some(m.sources.iter().map(|s| s.weight).collect::<Vec<f64>>()),
        _ => None,
    };
    let new = weights(given?)?;
    (Some(&new) != weights(saved).as_ref()).then_some(new)
}

/// Records the global batch a mixture's blocks are cut by, when the spec
/// leaves it to the job (0): what the job opens with, which a resume on
/// another world size must keep. The trainer's, not the spec author's: it
/// depends on the world size the loader opens the job with.
fn fix_mix_block(spec: &mut JobSpec) {
    if let Some(loader_proto::pb::dataset_spec::Kind::Mix(m)) = spec.dataset.as_mut().and_then(|d| d.kind.as_mut())
        && m.block == 0
    {
        m.block = u64::from(spec.batch_size) * u64::from(spec.consumers.max(1));
    }
}
