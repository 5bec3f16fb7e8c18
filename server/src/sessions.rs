//! Trainer sessions: which consumer of which job a trainer is.

use std::collections::HashMap;
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
}

/// Every open session, by id.
#[derive(Debug, Default)]
pub(crate) struct SessionTable {
    next_id: u64,
    pub(crate) sessions: HashMap<u64, SessionState>,
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
            SessionState { job_id, consumer, node, ring_socket, last_seen: Instant::now(), stall_ms: 0 },
        );
        self.next_id
    }

    /// Whether some open session consumes `(job_id, consumer)`.
    pub(crate) fn has_consumer(&self, job_id: u64, consumer: u32) -> bool {
        self.sessions.values().any(|s| s.job_id == job_id && s.consumer == consumer)
    }

    /// Whether some open session consumes any rank of `job_id`.
    pub(crate) fn has_job(&self, job_id: u64) -> bool {
        self.sessions.values().any(|s| s.job_id == job_id)
    }

    /// The ring socket through which a worker on `node` delivers batches of
    /// `(job_id, consumer)`: that of the newest session of the consumer when
    /// it runs on the same node and offers a ring, else none.
    pub(crate) fn ring_for(&self, job_id: u64, consumer: u32, node: &str) -> Option<&str> {
        self.sessions
            .iter()
            .filter(|(_, s)| s.job_id == job_id && s.consumer == consumer)
            .max_by_key(|(id, _)| **id)
            .map(|(_, s)| s)
            .filter(|s| s.node == node && !s.ring_socket.is_empty())
            .map(|s| s.ring_socket.as_str())
    }
}
