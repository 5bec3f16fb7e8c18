//! The trainer's session with the coordinator: creates or attaches to the
//! job, opens the consumer's session (its lease), and keeps the lease alive
//! with heartbeats that carry the consumed watermark and the stall time.
//!
//! A coordinator that restarts forgets sessions (it answers `reopen`, or
//! `NotFound` to `Routes`), and one without its journal forgets the job too.
//! The session then reopens itself: OpenSession without `resume`, so the
//! coordinator continues from its journaled watermark (the consumer drops
//! the copies it already yielded); or, when the job itself is gone,
//! CreateOrAttachJob and OpenSession resumed at the consumer's watermark.
//! While the coordinator is unreachable, heartbeats keep retrying with one
//! warning per outage; batches already held by workers keep flowing.
//!
//! The job's blobs (`crate::blobs`) are uploaded before the job is created
//! and again before every reopen: a restarted coordinator holds none.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use loader_proto::PROTOCOL_VERSION;
use loader_proto::pb::trainer_service_client::TrainerServiceClient;
use loader_proto::pb::{
    CloseSessionRequest, CreateOrAttachJobRequest, Job, JobSpec, OpenSessionRequest,
    OpenSessionResponse, SessionHeartbeatRequest,
};
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tonic::Code;
use loader_process::grpc::Channel;

use crate::connect::{attempt, with_retries};
use crate::error::LoaderError;
use crate::event::{Event, EventTx};
use crate::options::DEFAULT_COORDINATOR_TIMEOUT;
// Until the coordinator says how long leases last and how often to
// heartbeat: its own defaults.
use loader_job::lease::{DEFAULT_LEASE_TTL, heartbeat_interval};

/// Floor on the heartbeat period, however short the coordinator timeout.
const MIN_TICK: Duration = Duration::from_millis(10);

/// What the trainer reports through heartbeats; written by the consumer
/// (and, for the workers it cannot reach, the routes task), read by the
/// heartbeat task.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Every `seq` below this was yielded.
    consumed: AtomicU64,
    /// Microseconds spent blocked waiting for a batch.
    stall_us: AtomicU64,
    /// Workers whose Fetch streams fail while the coordinator lists them.
    unreachable: std::sync::Mutex<Vec<u64>>,
    /// The batch the in-order consumer waits on past its lateness
    /// threshold, if any (`crate::late`).
    late: std::sync::Mutex<Option<u64>>,
}

impl Progress {
    /// Records the consumed watermark.
    pub(crate) fn set_consumed(&self, watermark: u64) {
        self.consumed.store(watermark, Ordering::Relaxed);
    }

    /// The consumed watermark.
    pub(crate) fn consumed(&self) -> u64 {
        self.consumed.load(Ordering::Relaxed)
    }

    /// Records the workers this trainer cannot reach, all of them.
    pub(crate) fn set_unreachable(&self, workers: Vec<u64>) {
        *self.unreachable.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = workers;
    }

    /// The workers this trainer cannot reach.
    pub(crate) fn unreachable(&self) -> Vec<u64> {
        self.unreachable.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Records the batch waited on past the lateness threshold (None: no
    /// longer waited on).
    pub(crate) fn set_late(&self, seq: Option<u64>) {
        *self.late.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = seq;
    }

    /// The batch waited on past the lateness threshold.
    pub(crate) fn late(&self) -> Option<u64> {
        *self.late.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds time spent blocked in `next()`.
    pub(crate) fn add_stall(&self, d: Duration) {
        self.stall_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }
}

/// An open session.
#[derive(Debug)]
pub(crate) struct Session {
    /// Coordinator URL, for error messages.
    address: String,
    /// Reconnects by itself when the coordinator restarts.
    client: TrainerServiceClient<Channel>,
    /// The job as the coordinator planned it.
    job: Job,
    /// This trainer's rank.
    consumer: u32,
    /// The consumer its batches are delivered under: the rank, or on a
    /// shared stream the subscriber the coordinator made for it (kept when
    /// the session reopens).
    stream: u32,
    /// Node identity, for co-location.
    node: String,
    /// The shared-memory ring's socket, announced on every (re)open; empty
    /// for gRPC only.
    ring_socket: String,
    /// Lease length the coordinator gave the session: how long a dead
    /// worker's batches may take to come back.
    lease_ttl: Duration,
    /// Current session id; changes when the coordinator asks to reopen.
    id: watch::Sender<u64>,
    /// The current session's id and key (empty when the coordinator checks
    /// no tokens), set together.
    key: std::sync::Mutex<(u64, Arc<str>)>,
    /// From the coordinator's lease settings.
    heartbeat_interval: Duration,
    /// Watermark and stall time to report.
    progress: Arc<Progress>,
    /// Set by the routes task when the coordinator no longer knows the
    /// session, so the heartbeat task reopens it now rather than next tick.
    reopen_wanted: Notify,
    /// Set by the consumer when a batch is late, for a heartbeat now.
    beat_wanted: Notify,
    /// Set once the session is closed (the trainer finished): heartbeats
    /// stop and a forgotten session is not reopened.
    closed: AtomicBool,
    /// How long the coordinator may not answer before the session gives up
    /// (`LoaderError::CoordinatorLost`).
    lost_after: Duration,
    /// The job's blobs with the files they are read from, uploaded again
    /// when the session reopens (a restarted coordinator holds no blob).
    blobs: JobSpec,
}

impl Session {
    /// Gives up on a coordinator that has not answered for `after`.
    pub(crate) fn lost_after(mut self, after: Duration) -> Self {
        self.lost_after = after;
        self
    }

    /// Creates (or attaches to) the job of `spec` and opens `consumer`'s
    /// session on it, offering the shared-memory ring at `ring_socket`
    /// (empty for none); `resume_at` restarts the consumer at that batch
    /// (see `LoaderBuilder::resume`). Retryable failures are retried within
    /// the connect budget; anything else is returned at once.
    pub(crate) async fn open(
        address: &str,
        channel: Channel,
        spec: JobSpec,
        consumer: u32,
        ring_socket: String,
        resume_at: Option<u64>,
    ) -> Result<Self, LoaderError> {
        let client = TrainerServiceClient::new(channel).max_decoding_message_size(usize::MAX);
        crate::blobs::upload(address, &client, &spec).await?;
        let blobs = JobSpec { blobs: spec.blobs.clone(), ..Default::default() };
        let job = create_or_attach(address, &client, crate::blobs::without_sources(spec)).await?;
        let mut session = Session {
            address: address.to_owned(),
            client,
            job,
            consumer,
            stream: consumer,
            node: loader_process::node::local_node(),
            ring_socket,
            lease_ttl: DEFAULT_LEASE_TTL,
            id: watch::Sender::new(0),
            key: std::sync::Mutex::new((0, "".into())),
            heartbeat_interval: heartbeat_interval(DEFAULT_LEASE_TTL),
            progress: Arc::default(),
            reopen_wanted: Notify::new(),
            beat_wanted: Notify::new(),
            closed: AtomicBool::new(false),
            lost_after: DEFAULT_COORDINATOR_TIMEOUT,
            blobs,
        };
        if let Some(start) = resume_at {
            session.progress.set_consumed(start);
        }
        let opened = session.open_session(resume_at).await?;
        if let Some(job) = opened.job {
            session.job = job;
        }
        session.stream = opened.consumer;
        if opened.heartbeat_interval_ms > 0 {
            session.heartbeat_interval = Duration::from_millis(opened.heartbeat_interval_ms);
        }
        if opened.lease_ttl_ms > 0 {
            session.lease_ttl = Duration::from_millis(opened.lease_ttl_ms);
        }
        Ok(session)
    }

    /// Opens (or reopens) the consumer's session and publishes its id;
    /// `resume_at` restarts the consumer's queue at that batch.
    async fn open_session(
        &self,
        resume_at: Option<u64>,
    ) -> Result<OpenSessionResponse, LoaderError> {
        let address = self.address.as_str();
        let request = OpenSessionRequest {
            protocol_version: PROTOCOL_VERSION,
            job_id: self.job.job_id,
            consumer: self.consumer,
            node: self.node.clone(),
            ring_socket: self.ring_socket.clone(),
            resume: resume_at.is_some(),
            start_seq: resume_at.unwrap_or(0),
            // A reopening subscriber keeps its place (a first open names
            // none: `stream` is still the rank).
            subscriber: (self.shared() && self.stream != self.consumer).then_some(self.stream),
        };
        let opened = with_retries(|| {
            let mut client = self.client.clone();
            let request = request.clone();
            async move { attempt(address, "OpenSession", client.open_session(request)).await }
        })
        .await?;
        tracing::debug!(
            session_id = opened.session_id,
            job_id = self.job.job_id,
            ?resume_at,
            "session open"
        );
        *self.key.lock().unwrap_or_else(|p| p.into_inner()) = (opened.session_id, opened.session_key.as_str().into());
        self.id.send_replace(opened.session_id);
        Ok(opened)
    }

    /// Opens a new session after the coordinator lost this one (restart,
    /// expiry). Without `resume`, the coordinator continues the consumer
    /// from its own journaled watermark, which never exceeds what was
    /// yielded here, so nothing is lost and the consumer drops the copies.
    /// A coordinator that lost the job too (no journal) gets it again, and
    /// the consumer resumes at the watermark yielded here.
    async fn reopen(&self) -> Result<(), LoaderError> {
        let old = self.id();
        // A restarted coordinator lost its blobs: its workers wait for them.
        crate::blobs::upload(&self.address, &self.client, &self.blobs).await?;
        // A subscriber's place is its own to keep (the journal keeps ranks').
        let resume = self.shared().then(|| self.progress.consumed());
        let err = match self.open_session(resume).await {
            Ok(_) => {
                tracing::info!(old, new = self.id(), "session reopened");
                return Ok(());
            }
            Err(e) => e,
        };
        // OpenSession names no session: NotFound means the job is unknown.
        if err.code() != Some(Code::NotFound) {
            return Err(err);
        }
        let spec = self.job.spec.clone().unwrap_or_default();
        let job = create_or_attach(&self.address, &self.client, spec).await?;
        if job.job_id != self.job.job_id {
            return Err(LoaderError::JobLost {
                address: self.address.clone(),
                job_id: self.job.job_id,
                new_id: job.job_id,
            });
        }
        let start = self.progress.consumed();
        self.open_session(Some(start)).await?;
        tracing::warn!(
            job_id = job.job_id,
            start,
            "the coordinator had lost the job; re-created it and resumed at the yielded watermark"
        );
        Ok(())
    }

    /// Whether the job is a shared stream (`JobSpec.shared`).
    pub(crate) fn shared(&self) -> bool {
        self.job.spec.as_ref().is_some_and(|s| s.shared.is_some())
    }

    /// The consumer this session's batches are delivered under (its rank,
    /// or its subscriber on a shared stream).
    pub(crate) fn stream(&self) -> u32 {
        self.stream
    }

    /// Asks the heartbeat task to check the session now (the routes task
    /// heard it is unknown).
    /// The consumer waits on batch `seq` past its lateness threshold: tell
    /// the coordinator now, not at the next tick, so a backup starts.
    pub(crate) fn report_late(&self, seq: u64) {
        self.progress.set_late(Some(seq));
        self.beat_wanted.notify_one();
    }

    pub(crate) fn request_reopen(&self) {
        self.reopen_wanted.notify_one();
    }

    /// The job as the coordinator planned it.
    pub(crate) fn job(&self) -> &Job {
        &self.job
    }

    /// Lease length of the session.
    pub(crate) fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    /// Coordinator URL.
    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    /// A client for other calls (routes) on the same channel.
    pub(crate) fn client(&self) -> TrainerServiceClient<Channel> {
        self.client.clone()
    }

    /// The current session id, following reopens.
    pub(crate) fn id(&self) -> u64 {
        *self.id.borrow()
    }

    /// The current session id with its key, which every call about the
    /// session and every fetch presents (docs/security.md).
    pub(crate) fn credentials(&self) -> (u64, Arc<str>) {
        self.key.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The current session id as a watch, for those below the session (the
    /// ring's connections) that need the id and nothing else of it.
    pub(crate) fn id_watch(&self) -> watch::Receiver<u64> {
        self.id.subscribe()
    }

    /// Shared with the consumer.
    pub(crate) fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// One heartbeat. Reopens the session when the coordinator lost it.
    /// Returns the job's error, if it failed.
    /// Closes the session: the coordinator records the final watermark and
    /// forgets the session at once (so `loaderctl status` stops listing it),
    /// instead of when its lease expires. Heartbeats stop. Best effort: a
    /// close that fails leaves lease expiry to do the same.
    pub(crate) async fn close(&self) -> Result<(), LoaderError> {
        self.closed.store(true, Ordering::SeqCst);
        let (session_id, key) = self.credentials();
        let request = CloseSessionRequest {
            protocol_version: PROTOCOL_VERSION,
            session_id,
            consumed: self.progress.consumed(),
            session_key: key.to_string(),
        };
        let mut client = self.client.clone();
        attempt(&self.address, "CloseSession", client.close_session(request)).await?;
        Ok(())
    }

    pub(crate) async fn heartbeat(&self) -> Result<Option<String>, LoaderError> {
        let (session_id, key) = self.credentials();
        let request = SessionHeartbeatRequest {
            protocol_version: PROTOCOL_VERSION,
            session_id,
            consumed: self.progress.consumed(),
            stall_ms: self.progress.stall_us.load(Ordering::Relaxed) / 1000,
            session_key: key.to_string(),
            unreachable_workers: self.progress.unreachable(),
            late_seq: self.progress.late(),
        };
        let mut client = self.client.clone();
        let reply = attempt(&self.address, "Heartbeat", client.heartbeat(request)).await;
        let reopen = match reply {
            Ok(r) => {
                if !r.job_error.is_empty() {
                    return Ok(Some(r.job_error));
                }
                r.reopen
            }
            // A coordinator that forgot the session (restart, expiry) may
            // say so with NotFound instead of `reopen`.
            Err(e) if e.code() == Some(Code::NotFound) => true,
            Err(e) => return Err(e),
        };
        if reopen && !self.closed.load(Ordering::SeqCst) {
            tracing::info!(old = self.id(), "coordinator lost the session; reopening");
            self.reopen().await?;
        }
        Ok(None)
    }

    /// Heartbeats until `stop`; a failed job or a fatal error goes to the
    /// consumer and ends the loop. An unavailable coordinator is waited out
    /// (it may be restarting): every heartbeat tick tries again, with one
    /// warning per outage, until `lost_after` has passed since the last
    /// answer: then the session is lost, on time, even while an attempt
    /// hangs on a silent network.
    pub(crate) async fn run_heartbeats(self: Arc<Self>, events: EventTx, stop: CancellationToken) {
        // Asked at least twice within `lost_after`: a coordinator that has
        // not been asked cannot have failed to answer (a timeout shorter
        // than the lease's interval would otherwise expire between two
        // heartbeats of a healthy coordinator).
        let every = self.heartbeat_interval.min(self.lost_after / 2).max(MIN_TICK);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tick.tick().await;
        // When the current outage began, if the coordinator is unreachable.
        let mut outage: Option<Instant> = None;
        // When the coordinator last answered.
        let mut answered = Instant::now();
        let lost = |answered: Instant| {
            let _ = events.send(Event::Fatal(LoaderError::CoordinatorLost {
                address: self.address.clone(),
                after: answered.elapsed(),
            }));
        };
        loop {
            let deadline = answered + self.lost_after;
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
                () = self.reopen_wanted.notified() => {}
                () = self.beat_wanted.notified() => {}
                () = tokio::time::sleep_until(deadline), if outage.is_some() => {
                    lost(answered);
                    return;
                }
            }
            if self.closed.load(Ordering::SeqCst) {
                return;
            }
            let Ok(beat) = tokio::time::timeout_at(deadline, self.heartbeat()).await else {
                lost(answered);
                return;
            };
            match beat {
                Ok(None) => {
                    answered = Instant::now();
                    if let Some(since) = outage.take() {
                        tracing::info!(
                            address = %self.address,
                            session_id = self.id(),
                            "coordinator reachable again after {:.1}s; session renewed",
                            since.elapsed().as_secs_f64()
                        );
                    }
                }
                Ok(Some(error)) => {
                    let _ = events.send(Event::Fatal(LoaderError::JobFailed(error)));
                    return;
                }
                Err(e) if e.is_retryable() => {
                    if answered.elapsed() >= self.lost_after {
                        lost(answered);
                        return;
                    }
                    if outage.is_none() {
                        outage = Some(Instant::now());
                        tracing::warn!(
                            error = %e,
                            "coordinator unreachable; retrying every {:.1}s until it is back",
                            every.as_secs_f64()
                        );
                    } else {
                        tracing::debug!(error = %e, "session heartbeat failed; retrying");
                    }
                }
                Err(e) => {
                    let _ = events.send(Event::Fatal(e));
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
impl Session {
    /// A session whose coordinator is unreachable, for consumer tests: every
    /// call on it fails fast.
    pub(crate) fn unconnected(job: Job, consumer: u32) -> Self {
        let address = "http://127.0.0.1:1".to_owned();
        let channel = crate::connect::endpoint(&address, loader_process::security::Role::Trainer)
            .expect("static address")
            .connect_lazy();
        Session {
            address,
            client: TrainerServiceClient::new(channel),
            job,
            consumer,
            stream: consumer,
            node: String::new(),
            ring_socket: String::new(),
            lease_ttl: DEFAULT_LEASE_TTL,
            id: watch::Sender::new(1),
            key: std::sync::Mutex::new((1, "".into())),
            heartbeat_interval: heartbeat_interval(DEFAULT_LEASE_TTL),
            progress: Arc::default(),
            reopen_wanted: Notify::new(),
            beat_wanted: Notify::new(),
            closed: AtomicBool::new(false),
            lost_after: DEFAULT_COORDINATOR_TIMEOUT,
            blobs: JobSpec::default(),
        }
    }

    /// The watermark the next heartbeat would report.
    pub(crate) fn reported_consumed(&self) -> u64 {
        self.progress.consumed()
    }

    /// The stall time the next heartbeat would report, in microseconds.
    pub(crate) fn reported_stall_us(&self) -> u64 {
        self.progress.stall_us.load(Ordering::Relaxed)
    }
}

/// How long a job resumed on another world size waits for the trainers of
/// the run it continues to leave the coordinator, which refuses to replace
/// the job until then. A killed trainer's session ends at once (its
/// connection closed when it died); one the coordinator cannot prove gone
/// (behind a proxy that keeps its connection, or cut off) lasts until its
/// lease expires (seconds).
const RESUME_WAIT: Duration = Duration::from_secs(20);

/// True for the coordinator's refusal to replace a job whose old run still
/// has sessions (`CoordinatorError::ResumeConflict`).
fn old_run_still_attached(e: &LoaderError) -> bool {
    e.code() == Some(Code::FailedPrecondition) && e.to_string().contains("runs another plan")
}

/// CreateOrAttachJob for `spec`, retried within the connect budget (and, for
/// a resumed plan, while the old run's sessions expire).
async fn create_or_attach(
    address: &str,
    client: &TrainerServiceClient<Channel>,
    spec: JobSpec,
) -> Result<Job, LoaderError> {
    let resumed = spec.resume.is_some();
    let wait = if resumed { RESUME_WAIT } else { Duration::ZERO };
    let backoff = loader_process::retry::Backoff::new(Duration::from_millis(200), Duration::from_secs(1));
    let created = loader_process::retry::until(
        Instant::now() + wait,
        backoff,
        || {
            with_retries(|| {
                let mut client = client.clone();
                let request = CreateOrAttachJobRequest {
                    protocol_version: PROTOCOL_VERSION,
                    spec: Some(spec.clone()),
                };
                async move {
                    attempt(
                        address,
                        "CreateOrAttachJob",
                        client.create_or_attach_job(request),
                    )
                    .await
                }
            })
        },
        |e: &LoaderError| resumed && old_run_still_attached(e),
    )
    .await?;
    let job = created
        .job
        .ok_or_else(|| missing(address, "CreateOrAttachJob", "job"))?;
    tracing::debug!(
        job_id = job.job_id,
        attached = created.attached,
        "job ready"
    );
    Ok(job)
}

/// The reply lacked a field the protocol requires.
fn missing(address: &str, call: &'static str, field: &str) -> LoaderError {
    LoaderError::Rpc {
        address: address.to_owned(),
        call,
        code: Code::Internal,
        message: format!("reply has no {field}"),
    }
}
