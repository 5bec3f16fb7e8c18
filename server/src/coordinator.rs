//! The coordinator's state and the operations the gRPC services call.
//!
//! One mutex guards all tables: every operation is a few map updates, far
//! cheaper than the RPC around it, and one lock keeps the bookkeeping of a
//! batch (queue -> worker -> delivered) consistent without ordering rules.

use std::collections::BTreeSet;
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

mod backup;
mod cache_use;
mod departed;
mod requeue;
mod share;
mod storage_use;
use requeue::{end_consumer, retire};

use crate::kept_ranges::Route;

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

/// Workers that may die holding batches of a job none of whose batches was
/// ever delivered, before the job is failed.
const POISON_DEATHS: u32 = 3;

/// Counts one more worker that died holding batches of `job_id`; fails the
/// job once `POISON_DEATHS` died before any batch of it was delivered. A
/// job that delivered once is never failed this way: workers killed while
/// it runs (an in-order trainer may legitimately stop all deliveries while
/// it waits for a dead worker's batch) are not its fault.
fn poisoned(t: &mut Tables, job_id: u64, address: &str) {
    let Some(job) = t.jobs.get_mut(job_id) else { return };
    if job.delivered_any {
        return;
    }
    job.deaths_before_delivery += 1;
    if job.deaths_before_delivery >= POISON_DEATHS && job.error.is_none() {
        let error = format!(
            "{} workers died while producing batches of job {job_id} and none was ever delivered (the last was {address}); \
             the job is failed so that it takes down no more: check its batch size, sample shape and dataset",
            job.deaths_before_delivery
        );
        tracing::warn!(job_id, "job failed: {error}");
        job.error = Some(error);
        job.end_life();
        t.traces.forget(job_id, None);
    }
}

/// What a worker's heartbeat reports.
#[derive(Debug, Default)]
pub(crate) struct WorkerReport {
    /// Batches handed to their consumers since the last report.
    pub(crate) delivered: Vec<pb::Delivered>,
    /// Tasks it could not complete.
    pub(crate) failed: Vec<pb::Failed>,
    /// Its window per job (see `loader_job::window`).
    pub(crate) windows: Vec<pb::JobWindow>,
    /// Fraction of wall time its producer was busy since its previous
    /// heartbeat (shown to operators only).
    pub(crate) busy: f64,
    /// Its sample cache use per job since it started (see `cache_use`).
    pub(crate) cache_use: Vec<pb::JobCacheUse>,
    /// Its reads from object stores since it started, if any (see
    /// `storage_use`).
    pub(crate) storage_use: Option<pb::StorageUse>,
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

    /// Records delivered and failed batches and the worker's windows; the
    /// worker's own wake-up (see `WorkerState::wake`), None when the worker
    /// is unknown.
    fn apply_report(&self, worker_id: u64, report: WorkerReport) -> Option<Arc<Notify>> {
        let WorkerReport { delivered, failed, windows, busy, cache_use, storage_use } = report;
        let mut guard = self.lock();
        let t = &mut *guard;
        let w = t.workers.workers.get_mut(&worker_id)?;
        let own = Arc::clone(&w.wake);
        w.last_seen = Instant::now();
        if busy.is_finite() {
            w.busy = busy.clamp(0.0, 1.0);
        }
        w.set_windows(windows.into_iter().map(|jw| (jw.job_id, jw.batches)));
        storage_use::record(w, storage_use);
        let mut credited = Vec::new();
        for d in delivered {
            let key = (d.job_id, d.consumer);
            let Some(held) = w.outstanding.get_mut(&key) else { continue };
            // Only batches this worker was holding count: a report can
            // never deliver a batch twice.
            let moved: Vec<u64> = d.seqs.iter().copied().filter(|s| held.remove(s)).collect();
            t.traces.delivered(key, &moved);
            credited.push((key, moved.clone()));
            let n = moved.len() as u64;
            w.delivered += n;
            crate::meters::delivered(d.job_id, n);
            if n > 0
                && let Some(job) = t.jobs.get_mut(d.job_id)
            {
                job.delivered_any = true;
                w.delivered_samples += moved.iter().map(|&seq| job.plan.batch_len(seq)).sum::<u64>();
            }
            if let Some(c) = t.jobs.get_mut(d.job_id).and_then(|j| j.consumers.get_mut(d.consumer as usize)) {
                c.delivered += n;
                // Second copies of batches taken back after delivery: re-sent
                // (counted once here; a backup's own re-send of one is not
                // counted again).
                for s in &moved {
                    if c.redeliver.remove(s) {
                        c.resent += 1;
                        if let Some(b) = c.backup.as_mut() {
                            b.resend.remove(s);
                        }
                    }
                }
                let consumed = c.consumed;
                let unacked: Vec<u64> = moved.into_iter().filter(|&s| s >= consumed).collect();
                if !unacked.is_empty() {
                    w.unacked.entry(key).or_default().extend(unacked);
                    t.workers.unacked_by.entry(key).or_default().insert(worker_id);
                }
            }
        }
        for (key, seqs) in credited {
            backup::delivered(t, key, worker_id, &seqs);
        }
        cache_use::record(t, worker_id, cache_use);
        let Some(w) = t.workers.workers.get_mut(&worker_id) else {
            return Some(own);
        };
        for f in failed {
            if let Some(held) = w.outstanding.get_mut(&(f.job_id, f.consumer)) {
                held.retain(|s| !(f.start_seq..f.end_seq).contains(s));
            }
            if let Some(job) = t.jobs.get_mut(f.job_id)
                && job.error.is_none()
            {
                tracing::warn!(job_id = f.job_id, error = %f.error, "job failed");
                job.error = Some(f.error);
                job.end_life();
                t.traces.forget(f.job_id, None);
            }
        }
        Some(own)
    }

    /// Hands the worker ranges of every consumer it has room for, lowest
    /// sequence numbers first, one range per consumer per round so that all
    /// consumers progress together, with the consumers it must drop (taken
    /// in the same critical section as the tasks, so a task for a consumer
    /// that came back is never older than the notice that it ended). None
    /// when the worker is unknown; a draining worker gets no tasks.
    fn assign(&self, worker_id: u64) -> Option<HeartbeatOutcome> {
        let mut guard = self.lock();
        let t = &mut *guard;
        let w = t.workers.workers.get_mut(&worker_id)?;
        let ended: Vec<ConsumerKey> = std::mem::take(&mut w.ended).into_iter().collect();
        if w.draining {
            return Some(HeartbeatOutcome::Tasks { tasks: Vec::new(), drain: true, ended });
        }
        let mut tasks = Vec::new();
        let now = Instant::now();
        // Workers keeping a range that is due (a trailing subscriber's next
        // one): woken below, or their long polls would end only at their
        // deadline (a heartbeat interval, 1.6 s by default: a subscriber
        // that trailed a finished one waited that long for each range).
        let mut wake: BTreeSet<u64> = BTreeSet::new();
        loop {
            let mut progressed = false;
            for job in t.jobs.iter_mut().filter(|j| j.error.is_none()) {
                let job_id = job.job.job_id;
                // Windows and ranges sized by the job's batch bytes, as the
                // worker measured them: small batches go out in long ranges.
                let window = w.window_for(job_id);
                let range_len = loader_job::window::range_len(window, self.config.range_len);
                for c in 0..job.consumers.len() {
                    let consumer = &mut job.consumers[c];
                    // Most consumers of a large job have nothing to hand out
                    // at any moment: skip them before any lookup.
                    if consumer.queue.is_empty() && consumer.backup.is_none() {
                        continue;
                    }
                    let key = (job_id, c as u32);
                    // Only for a trainer that is there: its session says
                    // where batches go (its ring or gRPC), and nothing is
                    // produced for a consumer whose trainer died.
                    if !t.sessions.has_consumer(job_id, c as u32) || w.cut_off.contains(&key) {
                        continue;
                    }
                    // A subscriber that trails the others: its next range
                    // goes to the worker that made it for them and keeps
                    // it, so it is not made again (see `kept_ranges`).
                    let kept = match (consumer.subscribes_to, job.lanes.is_none(), consumer.queue.peek(1)) {
                        (Some(rank), true, Some(next)) => match job.kept.route(rank, next.start, worker_id, now) {
                            Route::Elsewhere { worker_id: owner } => {
                                wake.insert(owner);
                                continue;
                            }
                            Route::Here { until } => Some(until - next.start),
                            Route::Anywhere => None,
                        },
                        _ => None,
                    };
                    let consumer = &mut job.consumers[c];
                    // A backup of batches the trainer waits on goes first.
                    let ranges = backup::take(consumer, worker_id).unwrap_or_default();
                    let backed_up: u64 = ranges.iter().map(|r| r.end - r.start).sum();
                    if backed_up > 0 {
                        tracing::info!(worker_id, job_id, consumer = c, batches = backed_up, "backup task for late batches");
                    }
                    let held = w.outstanding_for(key) + backed_up;
                    let room = window.saturating_sub(held);
                    // Batches taken back from a dead worker are the ones the
                    // trainer waits for, while this worker's held batches
                    // may be blocked behind them for want of the trainer's
                    // credits: they may exceed the limit, by at most the
                    // limit again, so memory stays bounded.
                    let extra = (2 * window).saturating_sub(held);
                    // A shared stream's subscriber holds the copies of the
                    // others' ranges too: its own (the part it missed, or
                    // a range the others are past) may go up to twice the
                    // window, as given-back batches may, so that it is
                    // never starved by them (see `share`).
                    let subscriber = share::is_subscriber(job, c);
                    let room = if subscriber { extra } else { room };
                    // And its range lines up with the others' (lanes keep
                    // to their own runs).
                    let max = match subscriber && job.lanes.is_none() {
                        true => share::aligned_len(job, c, extra.min(range_len).min(kept.unwrap_or(u64::MAX)), window, |k| {
                            let key = (job_id, k);
                            t.sessions.has_consumer(job_id, k)
                                && !w.cut_off.contains(&key)
                                && w.outstanding_for(key) < 4 * window
                        }),
                        false => range_len,
                    };
                    let consumer = &mut job.consumers[c];
                    let queue = &mut consumer.queue;
                    let taken = queue.take_returned(extra.min(max)).or_else(|| match job.lanes.as_mut() {
                        Some(lanes) => lanes.take(&job.plan, queue, worker_id, room.min(range_len)),
                        None => queue.take(room.min(max)),
                    });
                    if ranges.is_empty() && taken.is_none() {
                        continue;
                    }
                    // On a shared stream, other subscribers take the range
                    // too: made once, delivered to each, up to four windows
                    // held. A copy that waits a little for a ring slot, or
                    // goes to the gRPC outbox, costs far less than making
                    // the range again for one alone, and a subscriber left
                    // out falls out of step with the others (with delivery
                    // reports lagging, two windows left them out all the
                    // time: docs/benchmarks.md, "Shared streams").
                    let sessions = &t.sessions;
                    let worker = &*w;
                    let copies = taken.as_ref().map_or_else(Vec::new, |range| {
                        share::copies(job, c, range, window, |k| {
                            let key = (job_id, k);
                            sessions.has_consumer(job_id, k)
                                && !worker.cut_off.contains(&key)
                                && worker.outstanding_for(key) + (range.end - range.start) <= 4 * window
                        })
                    });
                    let rank = job.consumers[c].subscribes_to;
                    // A subscriber too far behind to take the range now
                    // reads it later: the worker keeps it, and the trailing
                    // one is sent there.
                    let keep = taken.as_ref().is_some_and(|range| share::needed_later(job, c, range, &copies));
                    if let (Some(rank), Some(range)) = (rank, &taken) {
                        let len = range.end - range.start;
                        if keep && kept.is_none() {
                            job.kept.made(rank, range, worker_id, now);
                        }
                        if kept.is_some() {
                            // Sent to the worker that keeps it: served from
                            // its memory unless it let the range go.
                            crate::meters::shared_batches(job_id, "kept", len * (1 + copies.len() as u64));
                        } else if copies.is_empty() && !keep {
                            job.consumers[c].assigned_alone += len;
                            crate::meters::shared_batches(job_id, "alone", len);
                        } else {
                            crate::meters::shared_batches(job_id, "once", len * (1 + copies.len() as u64));
                        }
                    }
                    let ring_socket = t.sessions.ring_for(job_id, c as u32, &w.node).unwrap_or_default().to_owned();
                    let copies: Vec<pb::Copy> = copies
                        .into_iter()
                        .map(|k| pb::Copy {
                            consumer: k,
                            ring_socket: t.sessions.ring_for(job_id, k, &w.node).unwrap_or_default().to_owned(),
                        })
                        .collect();
                    // A backup copies batches of this consumer only (a
                    // shared stream launches none).
                    let backups = ranges.into_iter().map(|r| (r, Vec::new(), false));
                    for (range, copies, keep) in backups.chain(taken.map(|r| (r, copies, keep))) {
                        w.outstanding.entry(key).or_default().extend(range.clone());
                        for copy in &copies {
                            let key = (job_id, copy.consumer);
                            w.outstanding.entry(key).or_default().extend(range.clone());
                            // Their spans are the primary's.
                            t.traces.assign(key, range.clone(), worker_id);
                        }
                        let traceparents = t.traces.assign(key, range.clone(), worker_id);
                        tasks.push(pb::Task {
                            job: Some(job.job.clone()),
                            consumer: c as u32,
                            start_seq: range.start,
                            end_seq: range.end,
                            ring_socket: ring_socket.clone(),
                            traceparents,
                            rank,
                            copies,
                            keep,
                        });
                    }
                    progressed = true;
                }
            }
            if !progressed {
                wake.remove(&worker_id);
                for owner in wake {
                    if let Some(o) = t.workers.workers.get(&owner) {
                        o.wake.notify_one();
                    }
                }
                return Some(HeartbeatOutcome::Tasks { tasks, drain: false, ended });
            }
        }
    }

    /// Expires every worker and session whose lease ran out by `now`. A dead
    /// worker's undelivered and unacknowledged batches go back to their
    /// consumers' queues, to be produced by another worker; a dead session
    /// is forgotten, so its ring is no longer routed to, and when it was the
    /// last session of its consumer, the consumer ends: what workers hold
    /// for it goes back to its queue and they are told to drop it. Returns
    /// the number of workers and sessions expired.
    pub(crate) fn expire(&self, now: Instant) -> (usize, usize) {
        let ttl = self.config.lease_ttl;
        let mut guard = self.lock();
        let t = &mut *guard;
        let dead: Vec<u64> = t
            .workers
            .workers
            .iter()
            .filter(|(_, w)| now.saturating_duration_since(w.last_seen) > ttl)
            .map(|(&id, _)| id)
            .collect();
        for &id in &dead {
            // Jobs it was making batches of: a job whose workers keep dying
            // before any of its batches is delivered is failed, so that it
            // takes down no more of them.
            let held: std::collections::BTreeSet<u64> = t.workers.workers.get(&id).map_or_else(Default::default, |w| {
                w.outstanding.iter().filter(|(_, s)| !s.is_empty()).map(|(&(job_id, _), _)| job_id).collect()
            });
            if let Some((address, requeued)) = retire(t, id) {
                tracing::warn!(worker_id = id, %address, requeued, "worker lease expired");
                for job_id in held {
                    poisoned(t, job_id, &address);
                }
            }
        }
        let (sessions, told) = end_sessions(t, "session lease expired", |_, s| now.saturating_duration_since(s.last_seen) > ttl);
        crate::meters::lease_expired("worker", dead.len());
        crate::meters::lease_expired("session", sessions);
        crate::meters::tables(t.workers.workers.len(), t.sessions.sessions.len(), t.jobs.iter().count());
        drop(guard);
        // Wake long polls: requeued batches, and workers to tell.
        if !dead.is_empty() || told > 0 {
            self.work_available.notify_waiters();
        }
        (dead.len(), sessions)
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

    /// Expires leases every `reap_interval` (a quarter TTL) until `stop` is
    /// cancelled.
    pub(crate) async fn reap_leases(self, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(loader_job::lease::reap_interval(self.config.lease_ttl));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => { self.expire(Instant::now()); }
            }
        }
    }

    pub(crate) fn list_workers(&self) -> Vec<pb::WorkerInfo> {
        let t = self.lock();
        let now = Instant::now();
        t.workers
            .workers
            .iter()
            .map(|(&id, w)| pb::WorkerInfo {
                worker_id: id,
                address: w.address.clone(),
                node: w.node.clone(),
                outstanding: w.outstanding_total(),
                delivered: w.delivered,
                last_seen_ms: now.duration_since(w.last_seen).as_millis() as u64,
                draining: w.draining,
                busy: w.busy,
                delivered_samples: w.delivered_samples,
                pid: w.pid,
                storage: w.storage_use.clone(),
            })
            .collect()
    }

    pub(crate) fn list_sessions(&self) -> Vec<pb::SessionInfo> {
        let t = self.lock();
        let now = Instant::now();
        let mut out: Vec<pb::SessionInfo> = t
            .sessions
            .sessions
            .iter()
            .map(|(&id, s)| pb::SessionInfo {
                session_id: id,
                job_id: s.job_id,
                consumer: s.consumer,
                node: s.node.clone(),
                ring: !s.ring_socket.is_empty(),
                last_seen_ms: now.duration_since(s.last_seen).as_millis() as u64,
                stall_ms: s.stall_ms,
            })
            .collect();
        out.sort_by_key(|s| s.session_id);
        out
    }

    pub(crate) fn list_jobs(&self) -> Vec<pb::JobInfo> {
        let t = self.lock();
        t.jobs
            .iter()
            .map(|j| pb::JobInfo {
                job: Some(j.job.clone()),
                consumers: j
                    .consumers
                    .iter()
                    .enumerate()
                    .map(|(i, c)| pb::ConsumerProgress {
                        consumer: i as u32,
                        assigned: c.queue.handed_out(),
                        delivered: c.delivered,
                        resent: c.resent,
                        consumed: c.consumed,
                        total: j.plan.total_batches(),
                        backup_launched: c.backups.launched,
                        backup_won: c.backups.won,
                        backup_wasted: c.backups.wasted,
                        subscribes_to: c.subscribes_to,
                        left: c.left,
                        assigned_alone: c.assigned_alone,
                    })
                    .collect(),
                error: j.error.clone().unwrap_or_default(),
                cache: j.cache.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
