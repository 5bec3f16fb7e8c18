//! Registered workers and the batches each one holds undelivered.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use loader_proto::{ConsumerKey, pb};
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
    /// window for (by the job's batch bytes; see `loader_job::window`).
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
    /// Its sample cache use per job, as it last reported it (totals since
    /// it started; see `coordinator::cache_use`).
    pub(crate) cache_use: BTreeMap<u64, pb::CacheUse>,
    /// Its reads from object stores, as it last reported them (totals
    /// since it started; see `coordinator::storage_use`); None until it
    /// reads from a store.
    pub(crate) storage_use: Option<pb::StorageUse>,
    /// Wakes this worker's long poll alone: a range only it may take (it
    /// keeps that range's batches for a subscriber that trails) became due
    /// while another worker was asking.
    pub(crate) wake: std::sync::Arc<tokio::sync::Notify>,
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
        let cap = u64::from(loader_job::window::MAX_WINDOW).max(self.max_outstanding);
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
    /// Workers that may hold unacknowledged batches of each consumer: a
    /// superset, pruned as trainers acknowledge, so that a trainer's
    /// heartbeat visits the few workers that made its batches, not every
    /// worker (10,000 workers x 600 trainer heartbeats a second).
    pub(crate) unacked_by: HashMap<ConsumerKey, BTreeSet<u64>>,
    /// Workers cut off from each consumer (exactly [`WorkerState::cut_off`]
    /// turned around), for the same reason.
    cut_by: HashMap<ConsumerKey, BTreeSet<u64>>,
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
            cache_use: BTreeMap::new(),
            storage_use: None,
            wake: std::sync::Arc::new(tokio::sync::Notify::new()),
        };
        self.workers.insert(self.next_id, state);
        self.next_id
    }

    /// Removes a worker, and its entries in the indexes that must be exact.
    pub(crate) fn remove(&mut self, worker_id: u64) -> Option<WorkerState> {
        let w = self.workers.remove(&worker_id)?;
        for key in &w.cut_off {
            self.uncut_index(worker_id, *key);
        }
        Some(w)
    }

    /// The trainer of `key` has consumed everything below `watermark`:
    /// no worker needs to keep those batches for a re-send any more.
    pub(crate) fn acknowledge(&mut self, key: ConsumerKey, watermark: u64) {
        let Self { workers, unacked_by, .. } = self;
        let Some(ids) = unacked_by.get_mut(&key) else { return };
        ids.retain(|id| {
            let Some(w) = workers.get_mut(id) else { return false };
            let Some(unacked) = w.unacked.get_mut(&key) else { return false };
            *unacked = unacked.split_off(&watermark);
            if unacked.is_empty() {
                w.unacked.remove(&key);
                return false;
            }
            true
        });
        if ids.is_empty() {
            unacked_by.remove(&key);
        }
    }

    /// Marks `worker_id` cut off from `key`; false when it was already (or
    /// is unknown).
    pub(crate) fn cut(&mut self, worker_id: u64, key: ConsumerKey) -> bool {
        let Some(w) = self.workers.get_mut(&worker_id) else { return false };
        if !w.cut_off.insert(key) {
            return false;
        }
        self.cut_by.entry(key).or_default().insert(worker_id);
        true
    }

    /// Lifts `worker_id`'s cut from `key`; true when it had been cut off.
    pub(crate) fn uncut(&mut self, worker_id: u64, key: ConsumerKey) -> bool {
        let lifted = self.workers.get_mut(&worker_id).is_some_and(|w| w.cut_off.remove(&key));
        if lifted {
            self.uncut_index(worker_id, key);
        }
        lifted
    }

    /// Lifts every cut from `key` (its trainers are gone).
    pub(crate) fn uncut_all(&mut self, key: ConsumerKey) {
        for id in self.cut_by.remove(&key).unwrap_or_default() {
            if let Some(w) = self.workers.get_mut(&id) {
                w.cut_off.remove(&key);
            }
        }
    }

    /// The workers cut off from `key`.
    pub(crate) fn cut_from(&self, key: ConsumerKey) -> impl Iterator<Item = u64> + '_ {
        self.cut_by.get(&key).into_iter().flatten().copied()
    }

    fn uncut_index(&mut self, worker_id: u64, key: ConsumerKey) {
        if let Some(ids) = self.cut_by.get_mut(&key) {
            ids.remove(&worker_id);
            if ids.is_empty() {
                self.cut_by.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(n: usize) -> (WorkerTable, Vec<u64>) {
        let mut t = WorkerTable::default();
        let ids = (0..n).map(|i| t.register(format!("http://w{i}"), "node".into(), 4, 0)).collect();
        (t, ids)
    }

    #[test]
    fn acknowledging_trims_and_forgets_the_workers_left_with_nothing() {
        let (mut t, ids) = table(3);
        let key = (1, 0);
        for (&id, seqs) in ids.iter().zip([vec![1, 2], vec![3, 7], vec![]]) {
            if !seqs.is_empty() {
                t.workers.get_mut(&id).expect("registered").unacked.insert(key, seqs.into_iter().collect());
                t.unacked_by.entry(key).or_default().insert(id);
            }
        }
        t.acknowledge(key, 4);
        assert!(!t.workers[&ids[0]].unacked.contains_key(&key), "all of it acknowledged");
        assert_eq!(t.workers[&ids[1]].unacked[&key], BTreeSet::from([7]));
        assert_eq!(t.unacked_by[&key], BTreeSet::from([ids[1]]));
        // A worker gone meanwhile leaves the index at the next acknowledgement.
        t.remove(ids[1]);
        t.acknowledge(key, 5);
        assert!(!t.unacked_by.contains_key(&key));
        // Another consumer's batches are not touched.
        t.acknowledge((2, 0), u64::MAX);
    }

    #[test]
    fn the_cut_index_follows_every_change_of_a_cut() {
        let (mut t, ids) = table(3);
        let (key, other) = ((1, 0), (1, 1));
        assert!(t.cut(ids[0], key) && t.cut(ids[1], key) && t.cut(ids[2], other));
        assert!(!t.cut(ids[0], key), "already cut");
        assert!(!t.cut(99, key), "unknown worker");
        assert_eq!(t.cut_from(key).collect::<Vec<_>>(), vec![ids[0], ids[1]]);
        assert!(t.uncut(ids[0], key) && !t.uncut(ids[0], key));
        t.remove(ids[1]);
        assert_eq!(t.cut_from(key).count(), 0);
        t.uncut_all(other);
        assert_eq!(t.cut_from(other).count(), 0);
        assert!(t.workers[&ids[2]].cut_off.is_empty());
    }
}
