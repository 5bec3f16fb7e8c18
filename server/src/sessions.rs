//! Trainer sessions: which consumer of which job a trainer is.

use std::collections::{BTreeSet, HashMap};
use tokio::time::Instant;

/// An open trainer session.
#[derive(Debug)]
pub(crate) struct SessionState {
    /// Job it consumes.
    pub(crate) job_id: u64,
    /// Its rank among the job's consumers.
    pub(crate) consumer: u32,
    /// Node identity, for routing to co-located workers.
    pub(crate) node: String,
    /// Unix socket of the trainer's shared-memory ring; empty for none.
    pub(crate) ring_socket: String,
    /// Last time it heartbeated (or opened).
    pub(crate) last_seen: Instant,
    /// Time it reported blocked waiting for batches: the autoscaling signal.
    pub(crate) stall_ms: u64,
    /// The connection its last call came on, when the server accepted it
    /// (`coordinator::departed`).
    pub(crate) connection: Option<loader_process::grpc::Connection>,
}

/// Every open session, by id, and the sessions of each consumer.
#[derive(Debug, Default)]
pub(crate) struct SessionTable {
    next_id: u64,
    /// Read freely; changed only through `open`, `remove` and `retain`, which
    /// keep `by_consumer` in step.
    pub(crate) sessions: HashMap<u64, SessionState>,
    /// The open sessions of each `(job, consumer)`, oldest first: every
    /// worker heartbeat asks, for every consumer of every job, whether it
    /// has a trainer (a scan of every session per consumer made a
    /// heartbeat cost O(consumers x sessions): 1,000 ranks, a million steps).
    by_consumer: HashMap<(u64, u32), BTreeSet<u64>>,
}

impl SessionTable {
    /// A table whose ids start above `base`, so that ids handed out before a
    /// restart never name a different process after it.
    pub(crate) fn with_id_base(base: u64) -> Self {
        Self { next_id: base, ..Self::default() }
    }

    pub(crate) fn open(&mut self, job_id: u64, consumer: u32, node: String, ring_socket: String) -> u64 {
        self.next_id += 1;
        self.sessions.insert(
            self.next_id,
            SessionState { job_id, consumer, node, ring_socket, last_seen: Instant::now(), stall_ms: 0, connection: None },
        );
        self.by_consumer.entry((job_id, consumer)).or_default().insert(self.next_id);
        self.next_id
    }

    /// Removes session `id`.
    pub(crate) fn remove(&mut self, id: u64) -> Option<SessionState> {
        let s = self.sessions.remove(&id)?;
        self.forget(id, &s);
        Some(s)
    }

    /// Keeps the sessions `keep` says to keep.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u64, &SessionState) -> bool) {
        let gone: Vec<u64> = self.sessions.iter().filter(|(id, s)| !keep(**id, s)).map(|(id, _)| *id).collect();
        for id in gone {
            self.remove(id);
        }
    }

    fn forget(&mut self, id: u64, s: &SessionState) {
        let key = (s.job_id, s.consumer);
        if let Some(ids) = self.by_consumer.get_mut(&key) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_consumer.remove(&key);
            }
        }
    }

    /// Whether some open session consumes `(job_id, consumer)`.
    pub(crate) fn has_consumer(&self, job_id: u64, consumer: u32) -> bool {
        self.by_consumer.contains_key(&(job_id, consumer))
    }

    /// Whether some open session consumes any rank of `job_id`.
    pub(crate) fn has_job(&self, job_id: u64) -> bool {
        self.by_consumer.keys().any(|&(job, _)| job == job_id)
    }

    /// The ring socket through which a worker on `node` delivers batches of
    /// `(job_id, consumer)`: that of the newest session of the consumer when
    /// it runs on the same node and offers a ring, else none.
    pub(crate) fn ring_for(&self, job_id: u64, consumer: u32, node: &str) -> Option<&str> {
        let newest = self.by_consumer.get(&(job_id, consumer))?.last()?;
        self.sessions
            .get(newest)
            .filter(|s| s.node == node && !s.ring_socket.is_empty())
            .map(|s| s.ring_socket.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_consumer_index_follows_opens_and_removals() {
        let mut t = SessionTable::default();
        let a = t.open(1, 0, "n1".into(), "ring-a".into());
        let b = t.open(1, 0, "n2".into(), String::new());
        let c = t.open(1, 1, "n1".into(), "ring-c".into());
        assert!(t.has_consumer(1, 0) && t.has_consumer(1, 1) && !t.has_consumer(1, 2) && !t.has_consumer(2, 0));
        assert!(t.has_job(1) && !t.has_job(2));
        // The newest session of the consumer says where batches go.
        assert_eq!(t.ring_for(1, 0, "n1"), None);
        assert_eq!(t.ring_for(1, 1, "n1"), Some("ring-c"));
        assert!(t.remove(b).is_some());
        assert_eq!(t.ring_for(1, 0, "n1"), Some("ring-a"));
        t.retain(|id, _| id != a);
        assert!(!t.has_consumer(1, 0) && t.has_consumer(1, 1));
        assert!(t.remove(a).is_none());
        t.remove(c);
        assert!(!t.has_job(1));
        assert!(t.sessions.is_empty() && t.by_consumer.is_empty());
    }
}
