//! Trainer sessions: which consumer of which job a trainer is.

use std::collections::HashMap;
use std::time::Instant;

/// An open trainer session.
#[derive(Debug)]
pub(crate) struct SessionState {
    /// Job it consumes.
    pub(crate) job_id: u64,
    /// Its rank among the job's consumers.
    pub(crate) consumer: u32,
    /// Node identity, for routing to co-located workers.
    pub(crate) node: String,
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
    pub(crate) fn open(&mut self, job_id: u64, consumer: u32, node: String) -> u64 {
        self.next_id += 1;
        self.sessions.insert(
            self.next_id,
            SessionState { job_id, consumer, node, last_seen: Instant::now(), stall_ms: 0 },
        );
        self.next_id
    }
}
