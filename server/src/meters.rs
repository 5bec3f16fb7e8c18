//! What the coordinator records for Prometheus (served when `loader-server`
//! runs with `--metrics-listen`; see `loader_process::telemetry::metrics`
//! and docs/operations.md). Recorded on heartbeats and lease reaping, never
//! per batch, so label sets are built where they are used.

/// Leases that ran out: `kind` is `worker` or `session`.
pub(crate) fn lease_expired(kind: &'static str, n: usize) {
    if n > 0 {
        metrics::counter!("loader_coordinator_lease_expiries_total", "kind" => kind).increment(n as u64);
    }
}

/// Batches given back to their consumer's queue, to be produced again.
pub(crate) fn requeued(n: usize) {
    if n > 0 {
        metrics::counter!("loader_coordinator_requeued_batches_total").increment(n as u64);
    }
}

/// Backup batches for stragglers: `launched`, `won` (the copy was reported
/// delivered first) or `wasted` (the original was).
pub(crate) fn backup(outcome: &'static str, n: u64) {
    if n > 0 {
        metrics::counter!("loader_coordinator_backup_batches_total", "outcome" => outcome).increment(n);
    }
}

/// Batches workers reported delivered for the first time.
pub(crate) fn delivered(job_id: u64, n: u64) {
    if n > 0 {
        metrics::counter!("loader_coordinator_batches_delivered_total", "job_id" => job_id.to_string()).increment(n);
    }
}

/// The time a session's trainer spent waiting in `next()`, as its latest
/// heartbeat says (the trainer's own running total).
pub(crate) fn trainer_stall(job_id: u64, rank: u32, session_id: u64, stall_ms: u64) {
    metrics::gauge!(
        "loader_coordinator_trainer_stall_seconds_total",
        "job_id" => job_id.to_string(),
        "rank" => rank.to_string(),
        "session" => session_id.to_string()
    )
    .set(stall_ms as f64 / 1000.0);
}

/// Workers, sessions and jobs the coordinator holds now.
pub(crate) fn tables(workers: usize, sessions: usize, jobs: usize) {
    metrics::gauge!("loader_coordinator_workers").set(workers as f64);
    metrics::gauge!("loader_coordinator_sessions").set(sessions as f64);
    metrics::gauge!("loader_coordinator_jobs").set(jobs as f64);
}

/// Bytes of blobs the coordinator holds or has reserved for uploads in
/// progress (bounded by `--blob-budget`).
pub(crate) fn blob_bytes(bytes: u64) {
    metrics::gauge!("loader_coordinator_blob_bytes").set(bytes as f64);
}

/// Batches handed out to a shared stream's subscribers, counted once per
/// subscriber: `made` is `once` (a task for several of them), `alone`, or
/// `kept` (sent to the worker that made it for the others and keeps it).
pub(crate) fn shared_batches(job_id: u64, made: &'static str, n: u64) {
    if n > 0 {
        metrics::counter!("loader_coordinator_shared_batches_total", "job_id" => job_id.to_string(), "made" => made)
            .increment(n);
    }
}

/// A job's sample cache use that workers reported since their previous
/// heartbeats.
pub(crate) fn sample_cache(job_id: u64, moved: &loader_proto::pb::CacheUse) {
    let job = job_id.to_string();
    for (name, n) in [
        ("loader_coordinator_sample_cache_hits_total", moved.hits),
        ("loader_coordinator_sample_cache_misses_total", moved.misses),
        ("loader_coordinator_sample_cache_stored_bytes_total", moved.stored_bytes),
    ] {
        if n > 0 {
            metrics::counter!(name, "job_id" => job.clone()).increment(n);
        }
    }
}

/// Subscribers of a shared stream still there.
pub(crate) fn subscribers(job_id: u64, n: usize) {
    metrics::gauge!("loader_coordinator_subscribers", "job_id" => job_id.to_string()).set(n as f64);
}
