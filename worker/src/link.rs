//! The link to the coordinator: registration, then the heartbeat loop that
//! renews the lease, reports deliveries and failures, and pulls tasks.
//!
//! At most one call is in flight. The worker heartbeats at least every
//! `heartbeat_interval_ms`; at once after a failure, or when its producer
//! runs out of tasks; and after deliveries once one consumer's add up to
//! half the batches it may hold for that consumer (its job's window, sized
//! by batch bytes: see `crate::window`, which every heartbeat announces). Why not after each
//! delivery: at a thousand batches a second that is a thousand calls, each
//! costing the coordinator tens of microseconds of CPU (HTTP/2, TCP,
//! wake-ups), on the cores the batches are made on. Half the window still
//! comes back while the other half is being produced, so the producer does
//! not wait for tasks. It long polls (`wait_ms > 0`) only when it has
//! nothing to make and either holds nothing or delivered nothing since the
//! last heartbeat, so a new job, or a backup task for a trainer stuck on a
//! straggler, starts without waiting for a tick. If no heartbeat
//! succeeds for a whole lease, the coordinator has given this worker's
//! batches to others: the worker fences itself and the loop returns
//! [`WorkerError::LeaseLost`].
//!
//! A heartbeat response may name consumers nobody will fetch from any more
//! (their last session ended): the worker drops what it holds for them
//! before it queues the response's tasks. A drain order is carried out as
//! [`crate::drain`] describes.

use std::ops::ControlFlow;
use std::sync::Mutex;
use std::time::Duration;

use loader_process::retry::{self, Backoff};
use loader_proto::PROTOCOL_VERSION;
use loader_proto::pb::worker_service_client::WorkerServiceClient;
use loader_proto::pb::{
    ConsumerId, Delivered, DeregisterRequest, Failed, RegisterWorkerRequest, WorkerHeartbeatRequest,
    WorkerHeartbeatResponse,
};
use loader_ring::worker::Rings;
use tokio::time::{Instant, sleep_until, timeout_at};
use loader_process::grpc::Channel;
use loader_process::security::ClientSecurity;
use tonic::{Code, Status};

use crate::drain::{Drain, DrainStep};
use crate::error::WorkerError;
use crate::outbox::Outboxes;
use crate::producer::Producer;
use crate::window::Windows;

/// Pauses between failed registration attempts.
const REGISTER_BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
/// One connection attempt to the coordinator (TCP and TLS handshakes).
/// Short, so that a worker started while its coordinator is unreachable
/// (a partition: its connection attempts go unanswered) retries often and
/// registers within seconds of the heal, not once its pending attempt runs
/// out; long enough for a TLS handshake with a coordinator that many
/// workers reconnect to at once.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Floor on the heartbeat interval, so a misconfigured coordinator cannot
/// make the worker spin.
const MIN_INTERVAL_MS: u64 = 10;
/// Least time from one long poll's start to the next: bounds the call rate
/// should a coordinator answer a long poll at once with nothing to say.
const POLL_GAP: Duration = Duration::from_millis(50);

/// What registration granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Registration {
    /// This worker's id at the coordinator.
    pub worker_id: u64,
    /// Lease length: without a successful heartbeat for this long the
    /// worker fences itself.
    pub lease_ttl: Duration,
    /// Longest gap between heartbeats.
    pub heartbeat_interval: Duration,
    /// When the successful call was sent: the coordinator started the lease
    /// no earlier, so counting from here never overestimates it.
    pub granted: Instant,
}

/// The worker's side of `WorkerService`.
#[derive(Debug)]
pub(crate) struct Link {
    /// Coordinator URL, for messages.
    addr: String,
    client: WorkerServiceClient<Channel>,
    /// What this worker announces at each registration.
    register: RegisterWorkerRequest,
    producer: Producer,
    outboxes: std::sync::Arc<Outboxes>,
    /// Told this worker's id, which ring hellos carry.
    rings: std::sync::Arc<Rings>,
    /// Each job's window, announced in every heartbeat; deliveries are
    /// worth a heartbeat of their own once half a consumer's window is
    /// delivered.
    windows: std::sync::Arc<Windows>,
    /// Fewer queued batches than this, with the producer idle, is
    /// starving: half the configured `max_outstanding`, at least one.
    low_water: usize,
}

/// What waits to be reported between heartbeats.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    /// Failed tasks are recorded.
    failures: bool,
    /// Deliveries recorded since the last heartbeat.
    unreported: usize,
    /// One consumer's deliveries add up to half its window.
    half_window: bool,
    /// The producer is out of tasks and little is left in the outboxes.
    starving: bool,
}

impl Waiting {
    /// Whether this is worth a heartbeat before the next tick.
    fn worth_a_call(self) -> bool {
        self.failures || self.half_window || (self.unreported > 0 && self.starving)
    }
}

/// Where the heartbeat loop stands between calls.
#[derive(Debug)]
struct Beat {
    /// What the last registration granted.
    reg: Registration,
    /// When the lease was last renewed, at the latest: when the last
    /// successful call was sent.
    renewed: Instant,
    /// When the next heartbeat is due, if no report is due before.
    next: Instant,
    /// The last heartbeat failed: the next one waits for `next` whatever
    /// is delivered meanwhile.
    retrying: bool,
    /// The drain under way, once the coordinator ordered one.
    drain: Option<Drain>,
}

impl Beat {
    /// When the lease runs out without another successful heartbeat.
    fn lease_end(&self) -> Instant {
        self.renewed + self.reg.lease_ttl
    }
}

/// What one heartbeat reported, kept until its answer tells whether the
/// coordinator got it (else it is reported again).
#[derive(Debug)]
struct Sent {
    /// The deliveries it reported.
    delivered: Vec<Delivered>,
    /// The failed tasks it reported.
    failed: Vec<Failed>,
    /// How long it asked the coordinator to wait for work.
    wait: Duration,
    /// When it was sent.
    started: Instant,
}

/// How one registration attempt failed.
#[derive(Debug)]
enum Attempt {
    /// The coordinator answered with an error.
    Refused(Status),
    /// The deadline passed during the call.
    NoAnswer,
}

impl std::fmt::Display for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Attempt::Refused(status) => f.write_str(&describe(status)),
            Attempt::NoAnswer => f.write_str("no answer"),
        }
    }
}

/// A status a retry cannot fix: the coordinator refuses this worker, or the
/// address is not a Loader coordinator.
fn is_fatal(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::FailedPrecondition
            | Code::InvalidArgument
            | Code::Unimplemented
            | Code::PermissionDenied
            | Code::Unauthenticated
    )
}

/// A status on one line: its message (or what its code means) and the
/// causes a user can act on ("Connection refused"). tonic's `Display` of a
/// status is a debugging dump, and its transport errors nest the same words
/// several times.
fn describe(status: &Status) -> String {
    let mut parts = vec![if status.message().is_empty() {
        status.code().description().to_owned()
    } else {
        status.message().to_owned()
    }];
    let mut source = std::error::Error::source(status);
    while let Some(s) = source {
        let text = s.to_string();
        if text != "transport error" && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ").replace('\n', " ")
}

/// The coordinator at `addr` (as given) as a URL and a channel to it; no
/// connection is made yet. The link and the blob fetches share it.
pub(crate) fn channel(addr: &str, security: &ClientSecurity) -> Result<(String, Channel), WorkerError> {
    let url = loader_process::grpc::normalize(addr, security.tls.is_some());
    let target = loader_process::grpc::endpoint(&url, security)
        .map_err(|e| WorkerError::CoordinatorAddress { addr: addr.to_owned(), reason: e.cause })?;
    // Longer than a trainer's (1 s): registration retries within its own
    // deadline, and many workers may reconnect to one coordinator at once.
    let target = target.map_endpoint(|e| e.connect_timeout(CONNECT_TIMEOUT)).keepalive();
    Ok((url, target.connect_lazy()))
}

impl Link {
    /// A link to the coordinator at `addr` (a URL) over `channel` (see
    /// [`channel`]). `register` is what this worker announces (its protocol
    /// version is set here; `max_outstanding` comes from `windows`).
    pub(crate) fn new(
        addr: String,
        channel: Channel,
        register: RegisterWorkerRequest,
        windows: std::sync::Arc<Windows>,
        producer: Producer,
        outboxes: std::sync::Arc<Outboxes>,
        rings: std::sync::Arc<Rings>,
    ) -> Self {
        Self {
            addr,
            client: WorkerServiceClient::new(channel),
            register: RegisterWorkerRequest {
                protocol_version: PROTOCOL_VERSION,
                max_outstanding: windows.at_least(),
                ..register
            },
            producer,
            outboxes,
            rings,
            low_water: (windows.at_least() as usize / 2).max(1),
            windows,
        }
    }

    /// Resolves when a heartbeat has something worth a call: a failure;
    /// half a consumer's window delivered; or any delivery while the
    /// producer is out of tasks and fewer than `low_water` batches wait
    /// in the outboxes (it needs tasks, or the job is done). The producer
    /// wakes this when it runs out, in case that happens after the last
    /// delivery was looked at.
    async fn report_due(&self) {
        loop {
            tokio::select! {
                () = self.outboxes.delivered() => {}
                () = self.producer.report_wanted() => {}
            }
            let unreported = self.outboxes.unreported(|job| self.windows.of(job));
            let waiting = Waiting {
                failures: self.producer.has_failures(),
                unreported: unreported.total,
                half_window: unreported.half_window,
                starving: self.producer.is_idle() && self.outboxes.len() < self.low_water,
            };
            if waiting.worth_a_call() {
                return;
            }
        }
    }

    /// Registers, retrying with backoff until `deadline`; `patience` is how
    /// long that was, for the message.
    pub(crate) async fn register(&mut self, deadline: Instant, patience: Duration) -> Result<Registration, WorkerError> {
        // Why the last answered attempt failed: an attempt that the deadline
        // cuts off reports that instead of "no answer".
        let cause = Mutex::new(None::<String>);
        let attempt = || {
            let mut client = self.client.clone();
            let request = self.register.clone();
            let (addr, cause) = (&self.addr, &cause);
            async move {
                let sent = Instant::now();
                match timeout_at(deadline, client.register_worker(request)).await {
                    Ok(Ok(resp)) => Ok((sent, resp.into_inner())),
                    Ok(Err(status)) => {
                        let text = describe(&status);
                        tracing::debug!(coordinator = %addr, "registration failed: {text}");
                        *cause.lock().unwrap_or_else(|p| p.into_inner()) = Some(text);
                        Err(Attempt::Refused(status))
                    }
                    Err(_) => Err(Attempt::NoAnswer),
                }
            }
        };
        let retryable = |a: &Attempt| !matches!(a, Attempt::Refused(s) if is_fatal(s));
        match retry::until(deadline, REGISTER_BACKOFF, attempt, retryable).await {
            Ok((sent, r)) => {
                let reg = Registration {
                    worker_id: r.worker_id,
                    lease_ttl: Duration::from_millis(r.lease_ttl_ms.max(1)),
                    heartbeat_interval: Duration::from_millis(r.heartbeat_interval_ms.max(MIN_INTERVAL_MS)),
                    granted: sent,
                };
                tracing::info!(worker_id = reg.worker_id, coordinator = %self.addr, "registered");
                self.rings.set_worker_id(reg.worker_id);
                Ok(reg)
            }
            Err(Attempt::Refused(status)) if is_fatal(&status) => Err(self.refused(&status)),
            Err(_) => Err(WorkerError::Unreachable {
                addr: self.addr.clone(),
                after: patience,
                cause: cause.into_inner().unwrap_or_else(|p| p.into_inner()).unwrap_or_else(|| "no answer".to_owned()),
            }),
        }
    }

    fn refused(&self, status: &Status) -> WorkerError {
        let cause = if status.code() == Code::Unimplemented {
            format!("it does not serve loader.v1.WorkerService ({})", describe(status))
        } else {
            describe(status)
        };
        WorkerError::Refused { addr: self.addr.clone(), cause }
    }

    /// Heartbeats until the lease is lost or the coordinator refuses this
    /// worker (an error), or until a drain order has been carried out: every
    /// held task produced and delivered, the last deliveries reported, and
    /// the worker deregistered (Ok).
    pub(crate) async fn run(mut self, reg: Registration) -> Result<(), WorkerError> {
        let mut beat = Beat { renewed: reg.granted, next: Instant::now(), retrying: false, drain: None, reg };
        loop {
            let lease_end = beat.lease_end();
            self.until_due(beat.next.min(lease_end), beat.retrying).await;
            if Instant::now() >= lease_end {
                return Err(self.fence(beat.reg.lease_ttl));
            }
            let delivered = self.outboxes.take_delivered();
            let wait = self.poll_wait(&beat, &delivered);
            let failed = self.producer.take_failed();
            let request = self.heartbeat_request(beat.reg.worker_id, &delivered, &failed, wait);
            let sent = Sent { delivered, failed, wait, started: Instant::now() };
            match timeout_at(lease_end, self.client.heartbeat(request)).await {
                Ok(Ok(resp)) => {
                    if self.answered(&mut beat, resp.into_inner(), sent).await?.is_break() {
                        return Ok(());
                    }
                }
                Ok(Err(status)) if is_fatal(&status) => return Err(self.refused(&status)),
                Ok(Err(status)) => self.heartbeat_failed(&mut beat, &status, sent),
                Err(_) => return Err(self.fence(beat.reg.lease_ttl)),
            }
        }
    }

    /// Waits until `due`, or until a report is due before it (see
    /// [`Self::report_due`]) unless the last heartbeat failed: deliveries
    /// must not hammer a coordinator that is down.
    async fn until_due(&self, due: Instant, retrying: bool) {
        if retrying {
            sleep_until(due).await;
        } else {
            tokio::select! {
                () = sleep_until(due) => {}
                () = self.report_due() => {}
            }
        }
    }

    /// How long the next heartbeat may wait at the coordinator for work.
    fn poll_wait(&self, beat: &Beat, delivered: &[Delivered]) -> Duration {
        // Idle: nothing to make, and nothing held or nobody taking what
        // is held (its trainer waits on a gap elsewhere, or paused). It
        // then waits at the coordinator, which answers as soon as there
        // is work for it: a backup task for a trainer waiting on a
        // straggler starts at once instead of at the next tick.
        let idle = self.producer.is_idle() && (self.outboxes.is_empty() || delivered.is_empty());
        // As long as a heartbeat interval: the coordinator answers at once
        // when work, a drain order or an ended consumer comes up, so a
        // longer wait costs no latency, and an idle fleet calls once per
        // interval, not several times (docs/benchmarks.md, "The
        // coordinator at scale").
        if idle && beat.drain.is_none() { beat.reg.heartbeat_interval } else { Duration::ZERO }
    }

    /// The heartbeat reporting `delivered` and `failed`, and the meters
    /// sampled as it leaves.
    fn heartbeat_request(
        &self,
        worker_id: u64,
        delivered: &[Delivered],
        failed: &[Failed],
        wait: Duration,
    ) -> WorkerHeartbeatRequest {
        let request = WorkerHeartbeatRequest {
            protocol_version: PROTOCOL_VERSION,
            worker_id,
            delivered: delivered.to_vec(),
            failed: failed.to_vec(),
            wait_ms: wait.as_millis() as u64,
            windows: self.windows.announce(),
            busy: self.producer.take_busy(std::time::Instant::now()),
            cache_use: self.producer.cache_use(),
            storage_use: crate::storage_use::report(),
        };
        crate::meters::busy(request.busy);
        crate::meters::kept_bytes(self.producer.let_go_kept());
        self.outboxes.sample_meters();
        request
    }

    /// Acts on a heartbeat's answer: registers again when asked to, drops
    /// ended consumers, takes a drain's next step, queues the tasks and
    /// sets the next heartbeat. Break once a drain has been carried out.
    async fn answered(
        &mut self,
        beat: &mut Beat,
        resp: WorkerHeartbeatResponse,
        sent: Sent,
    ) -> Result<ControlFlow<()>, WorkerError> {
        // The coordinator renewed the lease when the call arrived, which
        // was after `started`.
        beat.renewed = sent.started;
        beat.retrying = false;
        if resp.reregister {
            self.register_again(beat, sent).await?;
            return Ok(ControlFlow::Continue(()));
        }
        // Before the tasks: a task in this response may be for a
        // consumer that came back after it ended.
        for ended in resp.ended {
            self.drop_ended(ended);
        }
        let reported_nothing = sent.delivered.is_empty() && sent.failed.is_empty();
        if self.drain_step(beat, resp.drain, reported_nothing).await?.is_break() {
            return Ok(ControlFlow::Break(()));
        }
        for task in resp.tasks {
            tracing::debug!(
                job = task.job.as_ref().map_or(0, |j| j.job_id),
                consumer = task.consumer,
                seqs = ?(task.start_seq..task.end_seq),
                "task"
            );
            self.producer.submit(task);
        }
        // A long poll is its own pace: the coordinator answers
        // early only with something to say (tasks, a drain
        // order, ended consumers), and the next poll must be
        // waiting again at once, or work that comes up between
        // two polls (a new job's first tasks) waits out a whole
        // interval unheard.
        let pace = if sent.wait.is_zero() { beat.reg.heartbeat_interval } else { POLL_GAP };
        beat.next = sent.started + pace;
        Ok(ControlFlow::Continue(()))
    }

    /// Registers again, as the coordinator asked, within what is left of
    /// the lease; a coordinator that cannot be reached then fences this
    /// worker.
    async fn register_again(&mut self, beat: &mut Beat, sent: Sent) -> Result<(), WorkerError> {
        let ttl = beat.reg.lease_ttl;
        tracing::warn!(worker_id = beat.reg.worker_id, "coordinator asked this worker to register again");
        // The coordinator no longer counts our tasks as ours, and ignored
        // the reports: send them again under the new id.
        self.producer.clear();
        self.outboxes.restore_delivered(sent.delivered);
        self.producer.restore_failed(sent.failed);
        beat.reg = self.register(beat.renewed + ttl, ttl).await.map_err(|e| match e {
            WorkerError::Unreachable { .. } => self.fence(ttl),
            other => other,
        })?;
        beat.renewed = beat.reg.granted;
        beat.next = Instant::now();
        Ok(())
    }

    /// Starts draining when the coordinator `ordered` it, and takes the
    /// drain's next step once a heartbeat had nothing left to report
    /// (`reported_nothing`). Break once this worker has deregistered.
    async fn drain_step(
        &mut self,
        beat: &mut Beat,
        ordered: bool,
        reported_nothing: bool,
    ) -> Result<ControlFlow<()>, WorkerError> {
        let worker_id = beat.reg.worker_id;
        if ordered && beat.drain.is_none() {
            tracing::info!(worker_id, "draining: finishing held tasks, taking no new ones");
            beat.drain = Some(Drain::new(beat.reg.lease_ttl, self.outboxes.progress(), Instant::now()));
        }
        let Some(d) = &mut beat.drain else { return Ok(ControlFlow::Continue(())) };
        if !reported_nothing {
            return Ok(ControlFlow::Continue(()));
        }
        let held_nothing = self.producer.is_idle() && self.outboxes.is_empty();
        match d.step(held_nothing, self.outboxes.progress(), Instant::now()) {
            DrainStep::Continue => return Ok(ControlFlow::Continue(())),
            DrainStep::Done => {}
            DrainStep::HandBack => {
                tracing::info!(
                    worker_id,
                    held = self.outboxes.len(),
                    "draining: nothing produced or fetched for {:?}; handing the batches still held back to the coordinator",
                    d.patience()
                );
            }
        }
        self.deregister(worker_id).await?;
        Ok(ControlFlow::Break(()))
    }

    /// A heartbeat that failed but may be retried: its reports are kept for
    /// the next one, which comes soon but not at once.
    fn heartbeat_failed(&self, beat: &mut Beat, status: &Status, sent: Sent) {
        // One warning per outage, not one per retry.
        if beat.retrying {
            tracing::debug!(coordinator = %self.addr, "heartbeat failed: {}", describe(status));
        } else {
            tracing::warn!(coordinator = %self.addr, "heartbeat failed, retrying: {}", describe(status));
        }
        self.outboxes.restore_delivered(sent.delivered);
        self.producer.restore_failed(sent.failed);
        beat.retrying = true;
        beat.next = Instant::now() + (beat.reg.heartbeat_interval / 2).min(Duration::from_millis(200));
    }

    /// Drops what this worker holds for a consumer the coordinator ended
    /// (and took back), with one line saying how much.
    fn drop_ended(&self, ended: ConsumerId) {
        let dropped = self.producer.drop_consumer((ended.job_id, ended.consumer));
        if dropped.batches == 0 && dropped.tasks == 0 {
            // What it held went out before the notice arrived.
            tracing::debug!(job = ended.job_id, consumer = ended.consumer, "consumer ended; nothing held for it");
            return;
        }
        tracing::info!(
            job = ended.job_id,
            consumer = ended.consumer,
            batches = dropped.batches,
            tasks = dropped.tasks,
            "dropped {} held batches and {} tasks of a consumer nobody fetches from any more",
            dropped.batches,
            dropped.tasks
        );
    }

    /// Leaves the coordinator after a drain. Whatever is still held (after
    /// a hand-back) is dropped first, so that no batch goes out after the
    /// coordinator took it back.
    async fn deregister(&mut self, worker_id: u64) -> Result<(), WorkerError> {
        let request = DeregisterRequest { protocol_version: PROTOCOL_VERSION, worker_id };
        self.producer.stop();
        self.outboxes.close();
        self.rings.close();
        match self.client.deregister(request).await {
            Ok(_) => {
                tracing::info!(worker_id, "drained and deregistered");
                Ok(())
            }
            // The coordinator expires our lease anyway and requeues
            // whatever was still held then; nothing is lost.
            Err(status) => {
                tracing::warn!(worker_id, "deregistration failed ({}); the lease will expire", describe(&status));
                Ok(())
            }
        }
    }

    /// Stops producing, drops every batch and every ring mapping: after a
    /// lost lease the batches belong to other workers.
    fn fence(&self, ttl: Duration) -> WorkerError {
        self.producer.stop();
        self.outboxes.close();
        self.rings.close();
        WorkerError::LeaseLost { addr: self.addr.clone(), ttl }
    }
}

#[cfg(test)]
mod tests {
    use super::Waiting;

    #[test]
    fn deliveries_wait_for_half_the_window_unless_the_producer_starves() {
        let at = |unreported, half_window, starving| Waiting { failures: false, unreported, half_window, starving }.worth_a_call();
        assert!(!at(0, false, false) && !at(0, false, true), "nothing to say");
        assert!(!at(1, false, false) && !at(3, false, false), "work left: wait for more deliveries");
        assert!(at(4, true, false) && at(5, true, false), "half the window delivered");
        assert!(at(1, false, true), "out of tasks: report what there is");
        let failed = Waiting { failures: true, unreported: 0, half_window: false, starving: false };
        assert!(failed.worth_a_call(), "failures at once");
    }
}
