//! Registered workers and the batches each one holds undelivered.

use std::collections::{BTreeMap, BTreeSet};

use loader_proto::ConsumerKey;
use tokio::time::Instant;

/// A registered worker.
#[derive(Debug)]
pub(crate) struct WorkerState {
    /// URL of its BatchService.
    pub(crate) address: String,
    /// Node identity, for co-location with trainers.
    pub(crate) node: String,
    /// Its process id, as it registered (0: not said).
    pub(crate) pid: u32,
    /// Batches it may hold undelivered per consumer, for a job it has not
    /// sized a window for yet.
    pub(crate) max_outstanding: u64,
    /// Batches it holds undelivered per consumer of each job it sized a
    /// window for (by the job's batch bytes; see `loader_proto::window`).
    pub(crate) windows: BTreeMap<u64, u64>,
    /// Bytes the batches it holds may take, as it announced (0: not said).
    pub(crate) memory_budget: u64,
    /// Last time it heartbeated (or registered).
    pub(crate) last_seen: Instant,
    /// Sequence numbers assigned to it and not yet delivered, per consumer:
    /// every batch is tracked until a worker reports it delivered.
    pub(crate) outstanding: BTreeMap<ConsumerKey, BTreeSet<u64>>,
    /// Sequence numbers it delivered that the trainer has not acknowledged
    /// yet: if the worker dies they may still be in flight, so they are
    /// produced again (the trainer drops a copy it already has).
    pub(crate) unacked: BTreeMap<ConsumerKey, BTreeSet<u64>>,
    /// Batches it delivered since it registered.
    pub(crate) delivered: u64,
    /// Samples in those batches, for operators' samples per second.
    pub(crate) delivered_samples: u64,
    /// Fraction of wall time its producer was busy, from its latest
    /// heartbeat, for operators.
    pub(crate) busy: f64,
    /// Told to drain: it gets no new tasks and leaves when done.
    pub(crate) draining: bool,
    /// Consumers it held batches for that nobody will fetch any more (their
    /// last session ended), to tell it in
    /// its next heartbeat response so it frees what it holds for them.
    pub(crate) ended: BTreeSet<ConsumerKey>,
    /// Consumers whose trainer cannot reach this worker (it says so in its
    /// heartbeats): none of their batches are assigned here meanwhile.
    pub(crate) cut_off: BTreeSet<ConsumerKey>,
}

impl WorkerState {
    pub(crate) fn outstanding_for(&self, key: ConsumerKey) -> u64 {
        self.outstanding.get(&key).map_or(0, |s| s.len() as u64)
    }

    /// Batches of `job_id` it may hold undelivered per consumer.
    pub(crate) fn window_for(&self, job_id: u64) -> u64 {
        self.windows.get(&job_id).copied().unwrap_or(self.max_outstanding)
    }

    /// Records the windows a heartbeat announced. A window is never below
    /// the registered `max_outstanding` nor above what the protocol allows,
    /// whatever the worker says.
    pub(crate) fn set_windows(&mut self, windows: impl IntoIterator<Item = (u64, u32)>) {
        let cap = u64::from(loader_proto::window::MAX_WINDOW).max(self.max_outstanding);
        for (job_id, batches) in windows {
            self.windows.insert(job_id, u64::from(batches).clamp(self.max_outstanding, cap));
        }
    }

    pub(crate) fn outstanding_total(&self) -> u64 {
        self.outstanding.values().map(|s| s.len() as u64).sum()
    }
}

/// Every registered worker, by id.
#[derive(Debug, Default)]
pub(crate) struct WorkerTable {
    next_id: u64,
    pub(crate) workers: BTreeMap<u64, WorkerState>,
}

impl WorkerTable {
    /// A table whose ids start above `base`, so that ids handed out before a
    /// restart never name a different process after it.
    pub(crate) fn with_id_base(base: u64) -> Self {
        Self { next_id: base, ..Self::default() }
    }

    pub(crate) fn register(&mut self, address: String, node: String, max_outstanding: u64, memory_budget: u64) -> u64 {
        self.next_id += 1;
        let state = WorkerState {
            address,
            node,
            pid: 0,
            max_outstanding: max_outstanding.max(1),
            windows: BTreeMap::new(),
            memory_budget,
            last_seen: Instant::now(),
            outstanding: BTreeMap::new(),
            unacked: BTreeMap::new(),
            delivered: 0,
            delivered_samples: 0,
            busy: 0.0,
            draining: false,
            ended: BTreeSet::new(),
            cut_off: BTreeSet::new(),
        };
        self.workers.insert(self.next_id, state);
        self.next_id
    }
}
