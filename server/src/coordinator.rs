//! The coordinator's state and the operations the gRPC services call.
//!
//! One mutex guards all tables: every operation is a few map updates, far
//! cheaper than the RPC around it, and one lock keeps the bookkeeping of a
//! batch (queue -> worker -> delivered) consistent without ordering rules.
//!
//! This module holds the tables and the trainers' side; `assign` hands a
//! worker its tasks, `report` applies its heartbeat's report, `expiry`
//! ends what outlived its lease, `listing` is what operators are shown;
//! `requeue`, `backup`, `share`, `departed`, `cache_use` and `storage_use`
//! are the rules those share.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use loader_proto::{ConsumerKey, pb};
use tokio::sync::Notify;

use crate::blobs::{BlobStore, Chunk, PutOutcome};
use crate::config::ServerConfig;
use crate::error::CoordinatorError;
use crate::jobs::JobTable;
use crate::journal::{Journal, JournalError};
use crate::sessions::SessionTable;
use crate::traces::BatchTraces;
use crate::workers::WorkerTable;

mod assign;
mod backup;
mod cache_use;
mod departed;
mod expiry;
mod listing;
mod report;
mod requeue;
mod share;
mod storage_use;
use requeue::{end_consumer, retire};
pub(crate) use report::WorkerReport;

#[derive(Debug, Default)]
struct Tables {
    jobs: JobTable,
    workers: WorkerTable,
    sessions: SessionTable,
    /// Root spans of the batches sampled for tracing, while in flight.
    traces: BatchTraces,
}

/// Ends the sessions `gone` picks, logging `why` for each; when one was
/// the last session of its consumer, the consumer ends: what workers hold
/// for it goes back to its queue and they are told to drop it. Returns the
/// number of sessions ended and of workers to tell.
fn end_sessions(
    t: &mut Tables,
    why: &str,
    mut gone: impl FnMut(u64, &crate::sessions::SessionState) -> bool,
) -> (usize, usize) {
    let before = t.sessions.sessions.len();
    let mut orphans = Vec::new();
    t.sessions.retain(|id, s| {
        let ended = gone(id, s);
        if ended {
            tracing::warn!(session_id = id, job_id = s.job_id, consumer = s.consumer, "{why}");
            orphans.push((s.job_id, s.consumer));
        }
        !ended
    });
    let sessions = before - t.sessions.sessions.len();
    orphans.sort_unstable();
    orphans.dedup();
    let mut told = 0;
    for (job_id, consumer) in orphans {
        if t.sessions.has_consumer(job_id, consumer) {
            continue;
        }
        let ended = end_consumer(t, (job_id, consumer));
        told += ended.workers;
        tracing::info!(
            job_id,
            consumer,
            workers = ended.workers,
            requeued = ended.requeued,
            "consumer has no session; batches held for it taken back"
        );
    }
    (sessions, told)
}

/// Shared coordinator state; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Coordinator {
    tables: Arc<Mutex<Tables>>,
    /// Wakes long-polling worker heartbeats when work may have appeared.
    work_available: Arc<Notify>,
    /// Where jobs and watermarks survive a restart; None without `state_dir`.
    journal: Option<Arc<Journal>>,
    /// The blobs jobs reference, in memory (not journaled: trainers upload
    /// them again when they reopen after a restart).
    blobs: Arc<BlobStore>,
    /// The connections the server has open: a session whose last call came
    /// on one that closed has no trainer any more (`departed`).
    pub(crate) connections: loader_process::grpc::Connections,
    pub(crate) config: Arc<ServerConfig>,
}

/// Outcome of a worker heartbeat.
#[derive(Debug)]
pub(crate) enum HeartbeatOutcome {
    /// The worker is unknown: it must register again.
    Reregister,
    /// Tasks for it (possibly none), whether it must drain, and the
    /// consumers whose batches it must drop.
    Tasks {
        /// New tasks.
        tasks: Vec<pb::Task>,
        /// The worker is draining: finish, deregister, exit.
        drain: bool,
        /// Consumers nobody will fetch from any more; what the worker held
        /// for them has been taken back. Applied before `tasks`.
        ended: Vec<ConsumerKey>,
    },
}

impl HeartbeatOutcome {
    /// True for an answer that carries nothing: a long poll keeps waiting.
    fn is_empty(&self) -> bool {
        match self {
            HeartbeatOutcome::Reregister => false,
            HeartbeatOutcome::Tasks { tasks, drain, ended } => tasks.is_empty() && !drain && ended.is_empty(),
        }
    }
}

impl Coordinator {
    /// A coordinator with no journal: everything lives in memory.
    #[cfg(test)]
    pub(crate) fn new(config: ServerConfig) -> Self {
        Self::open(config).expect("no journal to fail")
    }

    /// Opens the coordinator, reloading the journal in `config.state_dir`.
    pub(crate) fn open(config: ServerConfig) -> Result<Self, JournalError> {
        let mut tables = Tables::default();
        let journal = match &config.state_dir {
            None => {
                // No boot counter without a journal: the start time keeps
                // ids of a previous run from being reused.
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() & 0x7fff_ffff);
                tables.workers = WorkerTable::with_id_base(secs << 32);
                tables.sessions = SessionTable::with_id_base(secs << 32);
                None
            }
            Some(dir) => {
                let journal = Journal::open(dir)?;
                // Ids of workers and sessions carry the boot number, so a
                // process that registered before a restart is told to
                // register again instead of being mistaken for a new one.
                let base = journal.next_boot()? << 32;
                tables.workers = WorkerTable::with_id_base(base);
                tables.sessions = SessionTable::with_id_base(base);
                for job in journal.load()? {
                    let id = job.job.job_id;
                    if let Err(e) = tables.jobs.restore(job) {
                        tracing::warn!(job_id = id, error = %e, "journaled job skipped");
                    }
                }
                Some(Arc::new(journal))
            }
        };
        Ok(Self {
            tables: Arc::new(Mutex::new(tables)),
            work_available: Arc::new(Notify::new()),
            journal,
            blobs: Arc::new(BlobStore::new(config.blob_budget)),
            connections: loader_process::grpc::Connections::default(),
            config: Arc::new(config),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Tables> {
        // A panic while holding the lock would be a bug in this module; the
        // tables stay usable, so recover rather than poison every request.
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn create_or_attach(&self, mut spec: pb::JobSpec) -> Result<(pb::Job, bool), CoordinatorError> {
        // Where the trainer read its blobs is its own business (and would
        // make the specs of ranks on different hosts differ).
        for blob in &mut spec.blobs {
            blob.source.clear();
        }
        if let Some(missing) = spec.blobs.iter().find(|b| !self.blobs.holds(&b.sha256, b.size)) {
            // A malformed or unhashed ref gets the spec's own message.
            loader_job::spec::plan(&spec)?;
            return Err(CoordinatorError::MissingBlob {
                name: missing.name.clone(),
                sha256: missing.sha256.clone(),
                size: missing.size,
            });
        }
        let journal = self.journal.clone();
        let persist = |job: &pb::Job| journal.as_ref().map_or(Ok(()), |j| j.put_job(job));
        let mut guard = self.lock();
        let t = &mut *guard;
        crate::admission::admit(&t.workers, &spec)?;
        // A resumed run replaces the job of its name (one with another spec)
        // only once no trainer is on it; those whose processes are provably
        // gone are not waited for.
        let mut told = 0;
        if spec.resume.is_some()
            && let Some(id) = t.jobs.id_of(&spec.name)
            && t.jobs.get(id).is_ok_and(|j| j.job.spec.as_ref() != Some(&spec))
        {
            told = departed::end_departed(t, &self.connections, id).1;
        }
        let sessions = &t.sessions;
        let out = t.jobs.create_or_attach(spec, |id| sessions.has_job(id), persist);
        drop(guard);
        if told > 0 {
            self.work_available.notify_waiters();
        }
        let out = out?;
        if !out.1 {
            tracing::info!(job_id = out.0.job_id, "job created");
            self.work_available.notify_waiters();
        }
        Ok(out)
    }

    /// Stores one chunk of a blob upload (see `crate::blobs`).
    pub(crate) fn put_blob(&self, chunk: Chunk) -> Result<PutOutcome, CoordinatorError> {
        // The blobs unfinished jobs need, which making room keeps; taken
        // before the blob store's lock, never inside it.
        let in_use = self
            .lock()
            .jobs
            .iter()
            .filter(|j| !j.finished())
            .flat_map(|j| j.job.spec.iter().flat_map(|s| s.blobs.iter().map(|b| b.sha256.clone())))
            .collect();
        self.blobs.put(chunk, &in_use, std::time::Instant::now())
    }

    /// Reads part of a blob: up to `max_bytes` from `offset`, and its size.
    pub(crate) fn get_blob(&self, sha256: &str, offset: u64, max_bytes: u32) -> Result<(prost::bytes::Bytes, u64), CoordinatorError> {
        self.blobs.get(sha256, offset, max_bytes, std::time::Instant::now())
    }

    /// Opens a session; `resume_at` restarts the consumer's queue there.
    /// On a shared stream the session subscribes to rank `consumer` as a
    /// consumer of its own (a new one, or `subscriber`, the one a reopening
    /// session had). Returns the session, the job and the consumer its
    /// batches are delivered under.
    pub(crate) fn open_session(
        &self,
        job_id: u64,
        consumer: u32,
        subscriber: Option<u32>,
        node: String,
        ring_socket: String,
        resume_at: Option<u64>,
    ) -> Result<(u64, pb::Job, u32), CoordinatorError> {
        let mut guard = self.lock();
        let t = &mut *guard;
        let job = t.jobs.get(job_id)?;
        if job.replaced {
            return Err(CoordinatorError::Replaced(job_id));
        }
        let consumers = job.plan.consumers;
        if consumer >= consumers {
            return Err(CoordinatorError::BadConsumer { consumer, consumers });
        }
        let shared = job.shared_max_lag().is_some();
        let job = job.job.clone();
        let stream = if shared {
            let state = t.jobs.get_mut(job_id).ok_or(CoordinatorError::UnknownJob(job_id))?;
            let stream = state.subscribe(consumer, subscriber, resume_at)?;
            crate::meters::subscribers(job_id, state.live_subscribers());
            tracing::info!(job_id, rank = consumer, subscriber = stream, "trainer subscribed to the shared stream");
            stream
        } else {
            if let Some(start_seq) = resume_at {
                t.jobs.reposition(job_id, consumer, start_seq)?;
                tracing::info!(job_id, consumer, start_seq, "consumer resumed");
            }
            consumer
        };
        if resume_at.is_some() {
            // What workers hold for this consumer is for the old position;
            // the trainer drops anything below its start.
            for w in t.workers.workers.values_mut() {
                w.unacked.remove(&(job_id, stream));
            }
        }
        let id = t.sessions.open(job_id, stream, node, ring_socket);
        drop(guard);
        if let (Some(start_seq), Some(journal)) = (resume_at, &self.journal)
            && !shared
            && let Err(e) = journal.put_watermark(job_id, consumer, start_seq)
        {
            tracing::warn!(error = %e, "resume point not journaled");
        }
        // The consumer may have had no session: its batches can go out now.
        self.work_available.notify_waiters();
        Ok((id, job, stream))
    }

    /// Renews a session and records its watermark; returns the job's error
    /// if it failed, or None when the session is unknown.
    pub(crate) fn session_heartbeat(&self, session_id: u64, consumed: u64, stall_ms: u64) -> Option<String> {
        let mut t = self.lock();
        let s = t.sessions.sessions.get_mut(&session_id)?;
        s.last_seen = Instant::now();
        // A trainer's stall only grows; the 0 of `close_session` is no report.
        if stall_ms >= s.stall_ms {
            crate::meters::trainer_stall(s.job_id, s.consumer, session_id, stall_ms);
        }
        s.stall_ms = stall_ms;
        let (job_id, consumer) = (s.job_id, s.consumer);
        let job = t.jobs.get_mut(job_id)?;
        let mut watermark = consumed;
        let mut advanced = false;
        if let Some(c) = job.consumers.get_mut(consumer as usize) {
            advanced = consumed > c.consumed;
            c.consumed = c.consumed.max(consumed);
            watermark = c.consumed;
        }
        if advanced {
            job.end_life_if_consumed();
        }
        let error = job.error.clone().unwrap_or_default();
        // A subscriber's place is its trainer's to keep (it reopens at its
        // watermark): the journal restores ranks.
        let rank = consumer < job.plan.consumers;
        // Acknowledged batches need no copy anywhere any more.
        t.workers.acknowledge((job_id, consumer), watermark);
        drop(t);
        if advanced && rank && let Some(journal) = &self.journal {
            // A lost write costs only re-production of a few batches after a
            // restart (the trainer drops copies it has), so it is not fatal.
            if let Err(e) = journal.put_watermark(job_id, consumer, watermark) {
                tracing::warn!(error = %e, "watermark not journaled");
            }
        }
        Some(error)
    }

    /// Records which workers the trainer of `session_id` cannot reach (the
    /// full list, from its heartbeat): newly listed ones are cut off from
    /// its consumer, their batches moved to other workers; ones no longer
    /// listed get its batches again. One warning line per cut names the
    /// worker and what moved.
    pub(crate) fn unreachable(&self, session_id: u64, workers: &[u64]) {
        let mut guard = self.lock();
        let t = &mut *guard;
        let Some(s) = t.sessions.sessions.get(&session_id) else { return };
        let key = (s.job_id, s.consumer);
        let mut moved = false;
        for &worker_id in workers {
            if let Some(requeued) = requeue::cut_off(t, worker_id, key) {
                let address = t.workers.workers.get(&worker_id).map(|w| w.address.clone()).unwrap_or_default();
                tracing::warn!(
                    worker_id,
                    %address,
                    session_id,
                    job_id = key.0,
                    consumer = key.1,
                    requeued,
                    "a trainer cannot reach this worker; its batches for that trainer go to other workers"
                );
                moved = true;
            }
        }
        let cut: Vec<u64> = t.workers.cut_from(key).filter(|id| !workers.contains(id)).collect();
        for worker_id in cut {
            if requeue::reconnect(t, worker_id, key) {
                tracing::info!(worker_id, session_id, "the trainer reaches this worker again");
                moved = true;
            }
        }
        drop(guard);
        if moved {
            self.work_available.notify_waiters();
        }
    }

    /// The trainer of `session_id` has waited on batch `seq` past its
    /// lateness threshold: a backup task may copy it (see `backup`).
    pub(crate) fn late(&self, session_id: u64, seq: u64) {
        let mut guard = self.lock();
        let t = &mut *guard;
        let Some(s) = t.sessions.sessions.get(&session_id) else { return };
        let key = (s.job_id, s.consumer);
        // Not on a shared stream (docs/sharing.md): its subscribers wait on
        // the same batches, made once, and a copy made for the one that
        // asked would cost as much as sharing saves. Measured: subscribers
        // that start a second apart see their first waits as late, and
        // their backups, each made for one, took more worker time than the
        // batches themselves.
        if t.jobs.get(key.0).is_ok_and(|j| share::is_subscriber(j, key.1 as usize)) {
            tracing::debug!(session_id, seq, "a late batch of a shared stream: no backup");
            return;
        }
        let Some((original, n)) = backup::launch(t, key, seq) else { return };
        drop(guard);
        tracing::info!(session_id, job_id = key.0, consumer = key.1, seq, worker_id = original, batches = n, "the trainer waits on a late batch; launching a backup task");
        self.work_available.notify_waiters();
    }

    /// The key of a session this coordinator opened (empty when tokens are
    /// off): what the trainer presents for it from then on.
    pub(crate) fn session_key(&self, session_id: u64, job_id: u64, consumer: u32) -> String {
        self.config.security.session_keys.as_ref().map(|k| k.key(job_id, consumer, session_id)).unwrap_or_default()
    }

    /// Refuses a call about `session_id` whose `key` is not the session's,
    /// when tokens are on. An unknown session passes: the call itself says
    /// it is unknown, which tells nothing about other sessions.
    pub(crate) fn check_session_key(&self, session_id: u64, key: &str) -> Result<(), CoordinatorError> {
        let Some(keys) = &self.config.security.session_keys else { return Ok(()) };
        let owner = self.lock().sessions.sessions.get(&session_id).map(|s| (s.job_id, s.consumer));
        match owner {
            Some((job, consumer)) if !keys.verify(job, consumer, session_id, key) => {
                Err(CoordinatorError::WrongSessionKey(session_id))
            }
            _ => Ok(()),
        }
    }

    /// Workers that can serve a session, and the job's error if it failed.
    pub(crate) fn routes(&self, session_id: u64) -> Result<(Vec<pb::Route>, String), CoordinatorError> {
        let t = self.lock();
        let s = t.sessions.sessions.get(&session_id).ok_or(CoordinatorError::UnknownSession(session_id))?;
        let error = t.jobs.get(s.job_id)?.error.clone().unwrap_or_default();
        let routes = t
            .workers
            .workers
            .iter()
            .map(|(&id, w)| pb::Route { worker_id: id, address: w.address.clone(), colocated: w.node == s.node })
            .collect();
        Ok((routes, error))
    }

    pub(crate) fn register_worker(&self, address: String, node: String, max_outstanding: u32, memory_budget: u64) -> u64 {
        let id = self.lock().workers.register(address.clone(), node, u64::from(max_outstanding), memory_budget);
        tracing::info!(worker_id = id, %address, "worker registered");
        id
    }

    /// Records the process id worker `worker_id` registered with.
    pub(crate) fn note_pid(&self, worker_id: u64, pid: u32) {
        if let Some(w) = self.lock().workers.workers.get_mut(&worker_id) {
            w.pid = pid;
        }
    }

    /// Applies a worker's report, then hands it tasks; waits up to `wait`
    /// for work when there is none to give.
    pub(crate) async fn worker_heartbeat(
        &self,
        worker_id: u64,
        report: WorkerReport,
        wait: Duration,
    ) -> HeartbeatOutcome {
        let Some(own) = self.apply_report(worker_id, report) else {
            return HeartbeatOutcome::Reregister;
        };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Register interest before looking, so a job created between the
            // look and the wait still wakes us. A wake meant for this worker
            // alone is a stored permit: it is never lost either.
            let notified = self.work_available.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.assign(worker_id) {
                None => return HeartbeatOutcome::Reregister,
                Some(outcome) if !outcome.is_empty() => return outcome,
                Some(_) => {}
            }
            let woken = async {
                tokio::select! {
                    () = &mut notified => {}
                    () = own.notified() => {}
                }
            };
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return HeartbeatOutcome::Tasks { tasks: Vec::new(), drain: false, ended: Vec::new() };
            }
        }
    }

    /// Ends a session at once, after recording its watermark: the trainer
    /// finished or stopped. When it was its consumer's last session, what
    /// workers hold for the consumer is taken back, as when a lease expires.
    /// An unknown session (closed already, expired) is no error.
    pub(crate) fn close_session(&self, session_id: u64, consumed: u64) {
        if self.session_heartbeat(session_id, consumed, 0).is_none() {
            return;
        }
        let mut guard = self.lock();
        let t = &mut *guard;
        let Some(s) = t.sessions.remove(session_id) else { return };
        tracing::info!(session_id, job_id = s.job_id, consumer = s.consumer, "session closed");
        let mut told = 0;
        if !t.sessions.has_consumer(s.job_id, s.consumer) {
            told = end_consumer(t, (s.job_id, s.consumer)).workers;
        }
        drop(guard);
        if told > 0 {
            self.work_available.notify_waiters();
        }
    }

    /// Marks a worker draining: no new tasks; it leaves when done.
    pub(crate) fn drain_worker(&self, worker_id: u64) -> Result<(), CoordinatorError> {
        let mut t = self.lock();
        let w = t.workers.workers.get_mut(&worker_id).ok_or(CoordinatorError::UnknownWorker(worker_id))?;
        w.draining = true;
        // It takes no more ranges: subscribers that trail go elsewhere.
        for job in t.jobs.iter_mut() {
            job.kept.forget_worker(worker_id);
        }
        drop(t);
        tracing::info!(worker_id, "worker draining");
        // Wake its long poll so it hears the order now.
        self.work_available.notify_waiters();
        Ok(())
    }

    /// A worker leaves; whatever it still holds goes back to the queues.
    pub(crate) fn deregister(&self, worker_id: u64) -> Result<(), CoordinatorError> {
        let mut guard = self.lock();
        let (address, requeued) = retire(&mut guard, worker_id).ok_or(CoordinatorError::UnknownWorker(worker_id))?;
        drop(guard);
        tracing::info!(worker_id, %address, requeued, "worker deregistered");
        if requeued > 0 {
            self.work_available.notify_waiters();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
