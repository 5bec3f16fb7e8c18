//! A load harness for the coordinator: simulated workers and trainers that
//! speak the real gRPC protocol to a real `loader-server`, without making
//! any data.
//!
//! - A simulated worker registers, takes the ranges each heartbeat's
//!   answer hands it, and reports them delivered in its next heartbeat,
//!   sent once it has "made" them at its batch rate (at most a heartbeat
//!   interval later); holding nothing, it waits for work inside the call (a
//!   long poll), as a real worker does. The coordinator's bookkeeping runs
//!   as for real workers, with no batch made or fetched. Latency is timed
//!   on the calls that do not wait.
//! - A simulated trainer opens a session for one rank of the job and
//!   heartbeats the watermark the deliveries allow (the contiguous prefix of
//!   its batches delivered), as a trainer reading in order would.
//! - Churn (optional): a tenth of the workers join late, a tenth leave
//!   (deregister) midway, a twentieth stop heartbeating (their leases
//!   expire and their ranges go to others), and a tenth are drained through
//!   the AdminService.
//!
//! Many workers share one HTTP/2 connection (`channels`), so thousands of
//! them run from one process. Everything is bounded by `limit`. The
//! harness keeps a ledger of every delivery the coordinator accepted, so a
//! run also checks its exactly-once bookkeeping: every batch of every rank
//! delivered, none missing, and every copy beyond the first one the
//! coordinator re-sent knowingly (a worker that left or died had delivered
//! it, unacknowledged: the trainer keeps one copy) and counted as such, rank
//! by rank, with its count of deliveries equal to the workers'.
//!
//! # Layout
//! - this module: the run, its simulated workers and trainers, the ledger.
//! - `report`: what a run found ([`Report`]); [`table`]: its row.
//! - `journal`: a journal filled for a restart, and the wait for its replay.
//! - [`proc`]: the coordinator's CPU and peak memory, from `/proc`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loader_client::{Dtype, spec};
use loader_proto::PROTOCOL_VERSION;
use loader_proto::pb::admin_service_client::AdminServiceClient;
use loader_proto::pb::trainer_service_client::TrainerServiceClient;
use loader_proto::pb::worker_service_client::WorkerServiceClient;
use loader_proto::pb::{
    CloseSessionRequest, CreateOrAttachJobRequest, DeregisterRequest, Delivered, DrainWorkerRequest, ListJobsRequest, OpenSessionRequest,
    RegisterWorkerRequest, SessionHeartbeatRequest, WorkerHeartbeatRequest,
};
use tonic::transport::{Channel, Endpoint};

mod journal;
pub mod proc;
mod report;
pub mod table;

pub use journal::{fill_journal, wait_for_jobs};
pub use report::Report;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Config {
    /// Simulated workers.
    pub workers: u32,
    /// Simulated trainer ranks of the one job.
    pub trainers: u32,
    /// Batches each rank reads.
    pub batches_per_trainer: u64,
    /// Batches a worker reports delivered per second, at most.
    pub batch_rate: f64,
    /// Batches a worker may hold per rank (its `max_outstanding`).
    pub window: u32,
    /// HTTP/2 connections the workers share.
    pub channels: u32,
    /// Heartbeat period of the workers; None: the coordinator's interval.
    pub beat: Option<Duration>,
    /// Join, leave, expire and drain workers during the run.
    pub churn: bool,
    /// The run stops by this time whatever it reached.
    pub limit: Duration,
}

/// Unexplained ranks a report names.
const UNEXPLAINED_SHOWN: usize = 6;

/// Every delivery the workers reported, per rank and sequence number.
#[derive(Debug)]
struct Ledger {
    /// Times each batch was reported delivered, per rank.
    counts: Vec<Mutex<Vec<u8>>>,
    /// Delivered batches in all.
    delivered: AtomicU64,
    assigned: AtomicU64,
}

impl Ledger {
    fn new(trainers: u32, batches: u64) -> Self {
        Self {
            counts: (0..trainers).map(|_| Mutex::new(vec![0; batches as usize])).collect(),
            delivered: AtomicU64::new(0),
            assigned: AtomicU64::new(0),
        }
    }

    fn deliver(&self, consumer: u32, seq: u64) {
        if let Some(rank) = self.counts.get(consumer as usize) {
            let mut counts = rank.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = counts.get_mut(seq as usize) {
                *c = c.saturating_add(1);
            }
        }
        self.delivered.fetch_add(1, Ordering::Relaxed);
    }

    /// The batches of `consumer` delivered in order from the first.
    fn prefix(&self, consumer: u32) -> u64 {
        let counts = self.counts[consumer as usize].lock().unwrap_or_else(|p| p.into_inner());
        counts.iter().take_while(|&&c| c > 0).count() as u64
    }

    /// Per rank: (reports, copies beyond the first, batches never
    /// reported).
    fn check(&self) -> Vec<(u64, u64, u64)> {
        self.counts
            .iter()
            .map(|rank| {
                let (mut reports, mut duplicates, mut missing) = (0, 0, 0);
                for &c in rank.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    reports += u64::from(c);
                    match c {
                        0 => missing += 1,
                        1 => {}
                        n => duplicates += u64::from(n - 1),
                    }
                }
                (reports, duplicates, missing)
            })
            .collect()
    }
}

/// Heartbeat latencies, in microseconds.
#[derive(Debug, Default)]
struct Latencies {
    micros: Mutex<Vec<u32>>,
    errors: AtomicU64,
}

impl Latencies {
    fn record(&self, took: Duration) {
        let us = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        self.micros.lock().unwrap_or_else(|p| p.into_inner()).push(us);
    }
}

/// How a simulated worker's run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Works to the end.
    Stays,
    /// Registers once the job is `JOIN_AT` delivered.
    JoinsLate,
    /// Reports what it holds, deregisters and exits at `LEAVE_AT`.
    Leaves,
    /// Stops heartbeating at `LEAVE_AT`, holding its ranges: its lease
    /// expires.
    Dies,
}

/// Churn: the late tenth joins once the job is this share delivered...
const JOIN_AT: f64 = 0.1;
/// ...a tenth leaves and a twentieth dies at this share...
const LEAVE_AT: f64 = 0.3;
/// ...and a tenth is drained at this one.
const DRAIN_AT: f64 = 0.4;

/// Shared by every simulated process of a run.
struct Run {
    config: Config,
    ledger: Ledger,
    latencies: Latencies,
    registered: AtomicU64,
    peak: AtomicU64,
    done: AtomicBool,
    started: Instant,
    /// Worker ids by index, once registered (for the drain).
    ids: Mutex<Vec<u64>>,
    /// Batches of the job.
    total: u64,
    /// Heartbeats answered, timed or not (workers' and trainers').
    calls: AtomicU64,
}

impl Run {
    fn over(&self) -> bool {
        self.done.load(Ordering::Relaxed) || self.started.elapsed() >= self.config.limit
    }

    /// The share of the job's batches reported delivered: churn happens at
    /// points of the job, whatever its speed.
    fn progress(&self) -> f64 {
        self.ledger.delivered.load(Ordering::Relaxed) as f64 / self.total.max(1) as f64
    }

    /// Waits (bounded by the limit) until the job is `share` delivered;
    /// false if the run ended first.
    async fn reach(&self, share: f64) -> bool {
        while self.progress() < share {
            if self.over() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }
}

/// Runs `config` against the coordinator at `url` (http://host:port).
pub async fn run(url: &str, config: Config) -> anyhow::Result<Report> {
    let channels: Vec<Channel> = {
        let mut out = Vec::new();
        for _ in 0..config.channels.max(1) {
            out.push(Endpoint::from_shared(url.to_owned())?.connect().await?);
        }
        out
    };
    let admin_channel = channels[0].clone();
    let admin_channel_end = channels[0].clone();
    let mut trainer_client = TrainerServiceClient::new(channels[0].clone());
    // The job: one batch per sample, so nothing depends on the sample count.
    let spec = spec::synthetic(config.batches_per_trainer * u64::from(config.trainers), &[1], Dtype::U8)
        .batch_size(1)
        .consumers(config.trainers)
        .name("scale-harness")
        .build()?;
    let job = trainer_client
        .create_or_attach_job(CreateOrAttachJobRequest { protocol_version: PROTOCOL_VERSION, spec: Some(spec) })
        .await?
        .into_inner()
        .job
        .ok_or_else(|| anyhow::anyhow!("no job in the answer"))?;
    let batches = job.batches_per_epoch;
    let run = Arc::new(Run {
        ledger: Ledger::new(config.trainers, batches),
        latencies: Latencies::default(),
        registered: AtomicU64::new(0),
        peak: AtomicU64::new(0),
        done: AtomicBool::new(false),
        started: Instant::now(),
        ids: Mutex::new(vec![0; config.workers as usize]),
        total: batches * u64::from(config.trainers),
        calls: AtomicU64::new(0),
        config: config.clone(),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for rank in 0..config.trainers {
        let channel = channels[rank as usize % channels.len()].clone();
        let run = Arc::clone(&run);
        tasks.spawn(trainer(run, channel, job.job_id, rank, batches));
    }
    for i in 0..config.workers {
        let channel = channels[i as usize % channels.len()].clone();
        let fate = fate(i, config.churn);
        let run = Arc::clone(&run);
        tasks.spawn(worker(run, channel, i, fate));
    }
    if config.churn {
        let run = Arc::clone(&run);
        tasks.spawn(drain_some(run, admin_channel));
    }
    // Trainers finish when their batches are consumed; the rest stop then.
    let mut trainers_left = config.trainers;
    while let Some(joined) = tasks.join_next().await {
        if let Ok(Role::Trainer) = joined {
            trainers_left -= 1;
            if trainers_left == 0 {
                break;
            }
        }
    }
    let elapsed = run.started.elapsed();
    let finished = trainers_left == 0 && elapsed < config.limit;
    run.done.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    let ranks = run.ledger.check();
    let progress = AdminServiceClient::new(admin_channel_end)
        .list_jobs(ListJobsRequest {})
        .await?
        .into_inner()
        .jobs
        .into_iter()
        .find(|j| j.job.as_ref().is_some_and(|jb| jb.job_id == job.job_id))
        .map(|j| j.consumers)
        .unwrap_or_default();
    let mut unexplained = 0;
    let mut unexplained_ranks = Vec::new();
    let mut resent = 0;
    for (rank, &(reports, copies, _)) in ranks.iter().enumerate() {
        let theirs = progress.iter().find(|c| c.consumer as usize == rank);
        let (delivered, sent_again) = theirs.map_or((0, 0), |c| (c.delivered, c.resent));
        resent += sent_again;
        if copies != sent_again || reports != delivered {
            unexplained += 1;
            if unexplained_ranks.len() < UNEXPLAINED_SHOWN {
                unexplained_ranks.push(format!("{rank}: ({reports}, {copies}) vs ({delivered}, {sent_again})"));
            }
        }
    }
    let duplicates = ranks.iter().map(|r| r.1).sum();
    let missing = ranks.iter().map(|r| r.2).sum();
    let mut micros = std::mem::take(&mut *run.latencies.micros.lock().unwrap_or_else(|p| p.into_inner()));
    micros.sort_unstable();
    let at = |q: f64| {
        let i = ((micros.len() as f64 - 1.0) * q).round() as usize;
        Duration::from_micros(u64::from(micros.get(i).copied().unwrap_or(0)))
    };
    Ok(Report {
        elapsed,
        registered: run.peak.load(Ordering::Relaxed),
        calls: run.calls.load(Ordering::Relaxed),
        heartbeats: micros.len() as u64,
        heartbeat_p50: at(0.5),
        heartbeat_p99: at(0.99),
        heartbeat_max: at(1.0),
        heartbeat_errors: run.latencies.errors.load(Ordering::Relaxed),
        assigned: run.ledger.assigned.load(Ordering::Relaxed),
        delivered: run.ledger.delivered.load(Ordering::Relaxed),
        total: batches * u64::from(config.trainers),
        duplicates,
        resent,
        unexplained,
        unexplained_ranks,
        missing,
        finished,
    })
}

/// Which simulated process a task was.
enum Role {
    Trainer,
    Worker,
    Admin,
}

/// Worker `i`'s fate: with churn, a tenth join late, a tenth leave, a
/// twentieth die (the drained tenth are picked by `drain_some`).
fn fate(i: u32, churn: bool) -> Fate {
    if !churn {
        return Fate::Stays;
    }
    match i % 20 {
        1 | 11 => Fate::JoinsLate,
        2 | 12 => Fate::Leaves,
        3 => Fate::Dies,
        _ => Fate::Stays,
    }
}

/// One trainer rank: a session that heartbeats the watermark the
/// deliveries allow until every batch is consumed.
async fn trainer(run: Arc<Run>, channel: Channel, job_id: u64, rank: u32, batches: u64) -> Role {
    let mut client = TrainerServiceClient::new(channel);
    let opened = client
        .open_session(OpenSessionRequest {
            protocol_version: PROTOCOL_VERSION,
            job_id,
            consumer: rank,
            node: "harness-trainers".into(),
            ..Default::default()
        })
        .await;
    let Ok(opened) = opened.map(tonic::Response::into_inner) else {
        return Role::Trainer;
    };
    let beat = Duration::from_millis(opened.heartbeat_interval_ms.max(1));
    let mut tick = tokio::time::interval(beat.min(Duration::from_millis(500)));
    while !run.over() {
        tick.tick().await;
        let consumed = run.ledger.prefix(rank);
        run.calls.fetch_add(1, Ordering::Relaxed);
        let _ = client
            .heartbeat(SessionHeartbeatRequest {
                protocol_version: PROTOCOL_VERSION,
                session_id: opened.session_id,
                consumed,
                ..Default::default()
            })
            .await;
        if consumed >= batches {
            let _ = client
                .close_session(CloseSessionRequest {
                    protocol_version: PROTOCOL_VERSION,
                    session_id: opened.session_id,
                    ..Default::default()
                })
                .await;
            break;
        }
    }
    Role::Trainer
}

/// One simulated worker (see the module docs).
async fn worker(run: Arc<Run>, channel: Channel, index: u32, fate: Fate) -> Role {
    let mut client = WorkerServiceClient::new(channel);
    if fate == Fate::JoinsLate && !run.reach(JOIN_AT).await {
        return Role::Worker;
    }
    // Spread the fleet's heartbeats over a period.
    let spread = Duration::from_millis(u64::from(index % 1000) * 2);
    tokio::time::sleep(spread).await;
    let Some((mut id, mut beat)) = register(&run, &mut client, index).await else {
        return Role::Worker;
    };
    // (job, consumer, seq) held, oldest first.
    let mut held: std::collections::VecDeque<(u64, u32, u64)> = Default::default();
    let mut credit = 0.0f64;
    let mut last = Instant::now();
    let mut draining = false;
    loop {
        if run.over() {
            break;
        }
        let gone = run.progress() >= LEAVE_AT;
        if fate == Fate::Dies && gone {
            // Gone without a word: its lease runs out, its ranges move.
            run.registered.fetch_sub(1, Ordering::Relaxed);
            return Role::Worker;
        }
        let leaving = fate == Fate::Leaves && gone;
        // Deliver at the batch rate what arrived in earlier answers.
        credit = (credit + last.elapsed().as_secs_f64() * run.config.batch_rate).min(1e6);
        last = Instant::now();
        let n = if leaving || draining { held.len() } else { (credit.floor() as usize).min(held.len()) };
        credit -= n as f64;
        let mut delivered: Vec<Delivered> = Vec::new();
        let reported: Vec<(u32, u64)> = held.iter().take(n).map(|&(_, consumer, seq)| (consumer, seq)).collect();
        for (job_id, consumer, seq) in held.drain(..n) {
            match delivered.iter_mut().find(|d| d.job_id == job_id && d.consumer == consumer) {
                Some(d) => d.seqs.push(seq),
                None => delivered.push(Delivered { job_id, consumer, seqs: vec![seq] }),
            }
        }
        // Nothing held: wait for work in the call (a long poll), as a real
        // worker does; such calls are not timed.
        let wait = if held.is_empty() && !leaving && !draining { beat } else { Duration::ZERO };
        let request = WorkerHeartbeatRequest {
            protocol_version: PROTOCOL_VERSION,
            worker_id: id,
            delivered,
            busy: 0.5,
            wait_ms: wait.as_millis() as u64,
            ..Default::default()
        };
        let began = Instant::now();
        let answer = client.heartbeat(request).await;
        match answer {
            Ok(answer) => {
                run.calls.fetch_add(1, Ordering::Relaxed);
                if wait.is_zero() {
                    run.latencies.record(began.elapsed());
                }
                let answer = answer.into_inner();
                // The coordinator took these deliveries, unless it no longer
                // knows this worker (its lease ran out: they were moved).
                if !answer.reregister {
                    for &(consumer, seq) in &reported {
                        run.ledger.deliver(consumer, seq);
                    }
                }
                if answer.reregister {
                    run.registered.fetch_sub(1, Ordering::Relaxed);
                    held.clear();
                    match register(&run, &mut client, index).await {
                        Some((i, b)) => (id, beat) = (i, b),
                        None => return Role::Worker,
                    }
                    continue;
                }
                for ended in &answer.ended {
                    held.retain(|&(job, consumer, _)| !(job == ended.job_id && consumer == ended.consumer));
                }
                for task in answer.tasks {
                    let job_id = task.job.as_ref().map_or(0, |j| j.job_id);
                    run.ledger.assigned.fetch_add(task.end_seq.saturating_sub(task.start_seq), Ordering::Relaxed);
                    held.extend((task.start_seq..task.end_seq).map(|seq| (job_id, task.consumer, seq)));
                }
                draining |= answer.drain;
            }
            Err(_) => {
                run.latencies.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        if (leaving || draining) && held.is_empty() {
            let _ = client.deregister(DeregisterRequest { protocol_version: PROTOCOL_VERSION, worker_id: id }).await;
            run.registered.fetch_sub(1, Ordering::Relaxed);
            return Role::Worker;
        }
        if !held.is_empty() {
            // Until what it holds is made, at most a heartbeat interval.
            let making = Duration::from_secs_f64(held.len() as f64 / run.config.batch_rate.max(1e-3));
            tokio::time::sleep(making.min(beat)).await;
        }
    }
    Role::Worker
}

/// Registers worker `index`; its id and heartbeat period.
async fn register(run: &Run, client: &mut WorkerServiceClient<Channel>, index: u32) -> Option<(u64, Duration)> {
    while !run.over() {
        let request = RegisterWorkerRequest {
            protocol_version: PROTOCOL_VERSION,
            address: format!("http://127.0.0.1:{}", 20000 + index % 40000),
            node: format!("harness-worker-{index}"),
            max_outstanding: run.config.window,
            ..Default::default()
        };
        match client.register_worker(request).await {
            Ok(answer) => {
                let answer = answer.into_inner();
                let now = run.registered.fetch_add(1, Ordering::Relaxed) + 1;
                run.peak.fetch_max(now, Ordering::Relaxed);
                if let Some(slot) = run.ids.lock().unwrap_or_else(|p| p.into_inner()).get_mut(index as usize) {
                    *slot = answer.worker_id;
                }
                let beat = run.config.beat.unwrap_or(Duration::from_millis(answer.heartbeat_interval_ms.max(1)));
                return Some((answer.worker_id, beat));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    None
}

/// Drains a tenth of the workers (those that otherwise stay) once the job
/// is [`DRAIN_AT`] delivered, through the AdminService as `loaderctl drain`
/// does.
async fn drain_some(run: Arc<Run>, channel: Channel) -> Role {
    let mut admin = AdminServiceClient::new(channel);
    if !run.reach(DRAIN_AT).await {
        return Role::Admin;
    }
    let ids: Vec<u64> = {
        let ids = run.ids.lock().unwrap_or_else(|p| p.into_inner());
        ids.iter().enumerate().filter(|&(i, _)| i % 20 == 5 || i % 20 == 15).filter(|&(_, &id)| id != 0).map(|(_, &id)| id).collect()
    };
    for worker_id in ids {
        let _ = admin.drain_worker(DrainWorkerRequest { worker_id }).await;
    }
    Role::Admin
}
