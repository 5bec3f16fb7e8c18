//! What a run measured and found, and when that is exactly once.

use std::time::Duration;

/// What a run measured and found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// From the first registration to the last batch consumed (or the limit).
    pub elapsed: Duration,
    /// Workers registered at the peak.
    pub registered: u64,
    /// Heartbeats answered (workers' and trainers', long polls included).
    pub calls: u64,
    /// Worker heartbeats timed (those that did not wait for work).
    pub heartbeats: u64,
    /// Median worker heartbeat latency.
    pub heartbeat_p50: Duration,
    /// 99th percentile.
    pub heartbeat_p99: Duration,
    /// Worst.
    pub heartbeat_max: Duration,
    /// Heartbeats that failed (an error status or a transport error).
    pub heartbeat_errors: u64,
    /// Batches handed out in tasks (a range reassigned counts again).
    pub assigned: u64,
    /// Batches reported delivered.
    pub delivered: u64,
    /// Batches of the job (ranks x batches each).
    pub total: u64,
    /// Batches reported delivered more than once (each copy beyond the
    /// first counts).
    pub duplicates: u64,
    /// Of those, copies the coordinator re-sent knowingly and counted
    /// (`resent`: the worker that delivered the first left or died before
    /// the trainer acknowledged it; the trainer keeps one copy).
    pub resent: u64,
    /// Ranks whose copies beyond the first differ from the coordinator's
    /// `resent`, or whose reports differ from its `delivered`: bookkeeping
    /// that lost or invented a delivery.
    pub unexplained: u64,
    /// The first few unexplained ranks, as `rank: (reports, copies) here
    /// vs (delivered, resent) at the coordinator`, to tell which count
    /// drifted.
    pub unexplained_ranks: Vec<String>,
    /// Batches never reported delivered.
    pub missing: u64,
    /// Every rank consumed all of its batches within the limit.
    pub finished: bool,
}

impl Report {
    /// Every batch of every rank was delivered, every copy beyond the first
    /// is one the coordinator re-sent knowingly (and counted), its count of
    /// deliveries is the workers' own, and the job ended within the limit.
    pub fn exactly_once(&self) -> bool {
        self.finished && self.missing == 0 && self.unexplained == 0 && self.duplicates == self.resent
    }
}
