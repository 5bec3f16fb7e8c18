//! Sample cache use per job, for `loaderctl status`/`top` and /metrics.
//!
//! A worker reports its own totals since it started, per job (co-located
//! workers share one cache file, so its header's counts cannot be told
//! apart by worker). The coordinator adds what moved since a worker's
//! previous report to the job's sums: a lost heartbeat loses nothing, and
//! the use of workers that left stays counted.

use loader_proto::pb;

use super::Tables;

/// Jobs of one report taken: a worker keeps 64 (`loader_worker`'s
/// `cache_use`); a longer list is not a worker's.
const JOBS_TAKEN: usize = 256;

/// Records worker `worker_id`'s report of its cache use.
pub(super) fn record(t: &mut Tables, worker_id: u64, reported: Vec<pb::JobCacheUse>) {
    let Some(w) = t.workers.workers.get_mut(&worker_id) else { return };
    if reported.is_empty() && w.cache_use.is_empty() {
        return;
    }
    let mut now = std::collections::BTreeMap::new();
    for pb::JobCacheUse { job_id, r#use } in reported.into_iter().take(JOBS_TAKEN) {
        let Some(used) = r#use else { continue };
        let before = w.cache_use.get(&job_id).cloned().unwrap_or_default();
        if let Some(job) = t.jobs.get_mut(job_id) {
            let sum = job.cache.get_or_insert_with(pb::CacheUse::default);
            let moved = since(&used, &before);
            add(sum, &moved);
            if sum.off.is_empty() && !used.off.is_empty() {
                sum.off = used.off.clone();
            }
            crate::meters::sample_cache(job_id, &moved);
        }
        now.insert(job_id, used);
    }
    // Jobs it no longer lists it stopped counting: a later report of one
    // counts from zero again.
    w.cache_use = now;
}

/// What moved from `before` to `now` (a count that went down moved by 0).
fn since(now: &pb::CacheUse, before: &pb::CacheUse) -> pb::CacheUse {
    pb::CacheUse {
        hits: now.hits.saturating_sub(before.hits),
        misses: now.misses.saturating_sub(before.misses),
        stored_bytes: now.stored_bytes.saturating_sub(before.stored_bytes),
        refused: now.refused.saturating_sub(before.refused),
        off: String::new(),
    }
}

fn add(sum: &mut pb::CacheUse, more: &pb::CacheUse) {
    sum.hits = sum.hits.saturating_add(more.hits);
    sum.misses = sum.misses.saturating_add(more.misses);
    sum.stored_bytes = sum.stored_bytes.saturating_add(more.stored_bytes);
    sum.refused = sum.refused.saturating_add(more.refused);
}
