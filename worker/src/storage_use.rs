//! This worker process's reads from object stores since it started
//! (`loader_storage::totals`), for its heartbeats: the coordinator keeps
//! the latest per worker for `loaderctl status` and `top`. Worker-wide,
//! not per job as `cache_use` is: the runtime the requests run on and the
//! local copy serve every job of the process at once.

use loader_proto::pb;
use loader_storage::StorageTotals;

/// What the next heartbeat reports: None until the process reads from a
/// store, so that a worker reading local files sends what it always did.
pub(crate) fn report() -> Option<pb::StorageUse> {
    storage_use(loader_storage::totals())
}

fn storage_use(totals: StorageTotals) -> Option<pb::StorageUse> {
    if totals.is_empty() {
        return None;
    }
    let StorageTotals {
        requests,
        failed_requests,
        retries,
        bytes,
        chunk_reads,
        chunk_fetches,
        object_reads_local,
        object_reads_store,
        latency,
    } = totals;
    Some(pb::StorageUse {
        requests,
        failed_requests,
        retries,
        bytes,
        chunk_reads,
        chunk_fetches,
        object_reads_local,
        object_reads_store,
        latency_buckets: latency,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing read from a store, nothing reported; else every count,
    /// retries of a first request not yet done included.
    #[test]
    fn reads_from_stores_are_reported_once_there_are_any() {
        assert_eq!(storage_use(StorageTotals::default()), None);
        let retrying = storage_use(StorageTotals { retries: 2, ..Default::default() });
        assert_eq!(retrying, Some(pb::StorageUse { retries: 2, ..Default::default() }), "a first request still retrying");
        let totals = StorageTotals { requests: 3, failed_requests: 1, retries: 7, bytes: 4096, chunk_reads: 9, chunk_fetches: 2, object_reads_local: 5, object_reads_store: 6, latency: vec![0, 2, 1] };
        let reported = storage_use(totals).expect("reported");
        assert_eq!(
            reported,
            pb::StorageUse { requests: 3, failed_requests: 1, retries: 7, bytes: 4096, chunk_reads: 9, chunk_fetches: 2, object_reads_local: 5, object_reads_store: 6, latency_buckets: vec![0, 2, 1] }
        );
    }
}
