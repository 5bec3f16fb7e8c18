//! The trainer's session with the coordinator: creates or attaches to the
//! job, opens the consumer's session (its lease), and keeps the lease alive
//! with heartbeats that carry the consumed watermark and the stall time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use loader_proto::PROTOCOL_VERSION;
use loader_proto::pb::trainer_service_client::TrainerServiceClient;
use loader_proto::pb::{
    CreateOrAttachJobRequest, Job, JobSpec, OpenSessionRequest, OpenSessionResponse,
    SessionHeartbeatRequest,
};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;

use crate::connect::with_retries;
use crate::error::LoaderError;
use crate::event::{Event, EventTx};

/// Used when the coordinator does not say how often to heartbeat.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// Used when the coordinator does not say how long leases last.
const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);

/// What the consumer reports through heartbeats; written by the consumer,
/// read by the heartbeat task.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Every `seq` below this was yielded.
    consumed: AtomicU64,
    /// Microseconds spent blocked waiting for a batch.
    stall_us: AtomicU64,
}

impl Progress {
    /// Records the consumed watermark.
    pub(crate) fn set_consumed(&self, watermark: u64) {
        self.consumed.store(watermark, Ordering::Relaxed);
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
    /// From the coordinator's lease settings.
    heartbeat_interval: Duration,
    /// Watermark and stall time to report.
    progress: Arc<Progress>,
}

impl Session {
    /// Creates (or attaches to) the job of `spec` and opens `consumer`'s
    /// session on it, offering the shared-memory ring at `ring_socket`
    /// (empty for none). Retryable failures are retried within the connect
    /// budget; anything else is returned at once.
    pub(crate) async fn open(
        address: &str,
        channel: Channel,
        spec: JobSpec,
        consumer: u32,
        ring_socket: String,
    ) -> Result<Self, LoaderError> {
        let client = TrainerServiceClient::new(channel).max_decoding_message_size(usize::MAX);
        let created = with_retries(|| {
            let mut client = client.clone();
            let request = CreateOrAttachJobRequest {
                protocol_version: PROTOCOL_VERSION,
                spec: Some(spec.clone()),
            };
            async move {
                client
                    .create_or_attach_job(request)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|s| LoaderError::rpc(address, "CreateOrAttachJob", s))
            }
        })
        .await?;
        let job = created
            .job
            .ok_or_else(|| missing(address, "CreateOrAttachJob", "job"))?;
        tracing::debug!(
            job_id = job.job_id,
            attached = created.attached,
            "job ready"
        );
        let mut session = Session {
            address: address.to_owned(),
            client,
            job,
            consumer,
            node: loader_proto::node::local_node(),
            ring_socket,
            lease_ttl: DEFAULT_LEASE_TTL,
            id: watch::Sender::new(0),
            heartbeat_interval: DEFAULT_HEARTBEAT,
            progress: Arc::default(),
        };
        let opened = session.open_session().await?;
        if let Some(job) = opened.job {
            session.job = job;
        }
        if opened.heartbeat_interval_ms > 0 {
            session.heartbeat_interval = Duration::from_millis(opened.heartbeat_interval_ms);
        }
        if opened.lease_ttl_ms > 0 {
            session.lease_ttl = Duration::from_millis(opened.lease_ttl_ms);
        }
        Ok(session)
    }

    /// Opens (or reopens) the consumer's session and publishes its id.
    async fn open_session(&self) -> Result<OpenSessionResponse, LoaderError> {
        let address = self.address.as_str();
        let request = OpenSessionRequest {
            protocol_version: PROTOCOL_VERSION,
            job_id: self.job.job_id,
            consumer: self.consumer,
            node: self.node.clone(),
            ring_socket: self.ring_socket.clone(),
            // Set by resumption from a saved state (not wired yet).
            resume: false,
            start_seq: 0,
        };
        let opened = with_retries(|| {
            let mut client = self.client.clone();
            let request = request.clone();
            async move {
                client
                    .open_session(request)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|s| LoaderError::rpc(address, "OpenSession", s))
            }
        })
        .await?;
        tracing::debug!(
            session_id = opened.session_id,
            job_id = self.job.job_id,
            "session open"
        );
        self.id.send_replace(opened.session_id);
        Ok(opened)
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

    /// Shared with the consumer.
    pub(crate) fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// One heartbeat. Reopens the session when the coordinator lost it.
    /// Returns the job's error, if it failed.
    pub(crate) async fn heartbeat(&self) -> Result<Option<String>, LoaderError> {
        let request = SessionHeartbeatRequest {
            protocol_version: PROTOCOL_VERSION,
            session_id: self.id(),
            consumed: self.progress.consumed.load(Ordering::Relaxed),
            stall_ms: self.progress.stall_us.load(Ordering::Relaxed) / 1000,
        };
        let reply = self.client.clone().heartbeat(request).await;
        let reopen = match reply {
            Ok(r) => {
                let r = r.into_inner();
                if !r.job_error.is_empty() {
                    return Ok(Some(r.job_error));
                }
                r.reopen
            }
            // A coordinator that forgot the session (restart, expiry) may
            // say so with NotFound instead of `reopen`.
            Err(s) if s.code() == Code::NotFound => true,
            Err(s) => return Err(LoaderError::rpc(&self.address, "Heartbeat", s)),
        };
        if reopen {
            tracing::info!(old = self.id(), "coordinator lost the session; reopening");
            self.open_session().await?;
        }
        Ok(None)
    }

    /// Heartbeats until `stop`; a failed job or a fatal error goes to the
    /// consumer and ends the loop. An unavailable coordinator is waited out
    /// (it may be restarting), with a warning.
    pub(crate) async fn run_heartbeats(self: Arc<Self>, events: EventTx, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.heartbeat_interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            match self.heartbeat().await {
                Ok(None) => {}
                Ok(Some(error)) => {
                    let _ = events.send(Event::Fatal(LoaderError::JobFailed(error)));
                    return;
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e, "session heartbeat failed; retrying")
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
        let channel = tonic::transport::Endpoint::from_shared(address.clone())
            .expect("static address")
            .connect_lazy();
        Session {
            address,
            client: TrainerServiceClient::new(channel),
            job,
            consumer,
            node: String::new(),
            ring_socket: String::new(),
            lease_ttl: DEFAULT_LEASE_TTL,
            id: watch::Sender::new(1),
            heartbeat_interval: DEFAULT_HEARTBEAT,
            progress: Arc::default(),
        }
    }

    /// The watermark the next heartbeat would report.
    pub(crate) fn reported_consumed(&self) -> u64 {
        self.progress.consumed.load(Ordering::Relaxed)
    }
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
