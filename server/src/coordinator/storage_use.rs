//! Each worker's reads from object stores, for `loaderctl status`/`top`.
//!
//! A worker reports its totals since it started, worker-wide (its reads
//! from stores serve every job of the process, so no job's share is
//! known). The coordinator keeps the latest report as it is: nothing is
//! summed here, so a lost heartbeat loses nothing, and a worker that left
//! takes its counts with it (status shows the workers that are there).

use loader_proto::pb;

use crate::workers::WorkerState;

/// Latency buckets kept of a report: a worker sends 23
/// (`loader_storage::LATENCY_BUCKETS`); a longer list is not a worker's,
/// and every poll of ListWorkers would carry it.
const BUCKETS_TAKEN: usize = 64;

/// Records worker `w`'s report of its reads from stores; a heartbeat
/// without one (it has read nothing from a store) keeps what it said
/// before.
pub(super) fn record(w: &mut WorkerState, reported: Option<pb::StorageUse>) {
    let Some(mut used) = reported else { return };
    used.latency_buckets.truncate(BUCKETS_TAKEN);
    w.storage_use = Some(used);
}
