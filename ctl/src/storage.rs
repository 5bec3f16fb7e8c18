//! The workers' reads from object stores (datasets named by URL,
//! docs/storage.md), as `loaderctl status` and `top` show them: a STORAGE
//! table of the workers that read from a store, their sum first when there
//! are several, and no table at all when none did, so that a deployment
//! reading local files looks as it always did.
//!
//! A worker reports its totals since it started, for the whole process
//! (not per job). `status` shows them as they are; `top` adds requests and
//! MB per second, measured between heartbeats as its other rates are. Hit
//! ratios and latency percentiles are `loader_storage::StorageTotals`'s
//! arithmetic, from the counts and the coarse latency buckets a heartbeat
//! carries (a percentile is a power-of-two bound: `<16ms`).

use std::time::Duration;

use loader_proto::pb::{StorageUse, WorkerInfo};
use loader_storage::StorageTotals;
use serde_json::json;

use super::table::render;

/// The columns every STORAGE table ends with: totals since the workers
/// started. RETRIES, next to the requests that FAILED after theirs, are
/// the attempts the store's client retried: a store throttling or out of
/// reach shows there before (or without) any request failing.
pub(crate) const TOTALS_HEADERS: [&str; 6] = ["FAILED", "RETRIES", "CHUNK HITS", "OBJECT HITS", "P50", "P99"];

/// The label of the row that sums every worker's reads.
const ALL: &str = "all";

/// A worker's totals as its heartbeat reported them.
fn totals(used: &StorageUse) -> StorageTotals {
    StorageTotals {
        requests: used.requests,
        failed_requests: used.failed_requests,
        retries: used.retries,
        bytes: used.bytes,
        chunk_reads: used.chunk_reads,
        chunk_fetches: used.chunk_fetches,
        object_reads_local: used.object_reads_local,
        object_reads_store: used.object_reads_store,
        latency: used.latency_buckets.clone(),
    }
}

/// The workers that read from a store, with their totals, in the order
/// listed.
pub(crate) fn readers(workers: &[WorkerInfo]) -> Vec<(&WorkerInfo, StorageTotals)> {
    workers
        .iter()
        .filter_map(|w| Some((w, totals(w.storage.as_ref()?))))
        .filter(|(_, t)| !t.is_empty())
        .collect()
}

/// Every reader's totals added up: the first row, when there are several.
pub(crate) fn sum(readers: &[(&WorkerInfo, StorageTotals)]) -> Option<StorageTotals> {
    (readers.len() > 1).then(|| {
        readers.iter().fold(StorageTotals::default(), |mut sum, (_, t)| {
            sum.add(t);
            sum
        })
    })
}

/// The first cell of a row: the worker's id, or [`ALL`].
pub(crate) fn label(worker_id: Option<u64>) -> String {
    worker_id.map_or_else(|| ALL.to_owned(), |id| id.to_string())
}

/// The title over a STORAGE table.
pub(crate) fn title(readers: usize) -> String {
    let workers = if readers == 1 { "worker" } else { "workers" };
    format!("STORAGE ({readers} {workers} read from stores; totals since they started)")
}

/// The cells under [`TOTALS_HEADERS`].
pub(crate) fn totals_cells(t: &StorageTotals) -> Vec<String> {
    vec![
        t.failed_requests.to_string(),
        t.retries.to_string(),
        ratio(t.chunk_hit_ratio()),
        ratio(t.object_hit_ratio()),
        latency(t.latency_quantile(0.5)),
        latency(t.latency_quantile(0.99)),
    ]
}

/// A hit ratio in a cell: `87%`, or `-` before any read of that kind.
fn ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{:.0}%", 100.0 * r))
}

/// A percentile's bound in a cell: `<16ms`, `<4.1s`, `<66s`; `-` before
/// any request.
fn latency(bound: Option<Duration>) -> String {
    match bound {
        None => "-".into(),
        Some(d) if d < Duration::from_secs(1) => format!("<{}ms", d.as_millis()),
        Some(d) if d < Duration::from_secs(10) => format!("<{:.1}s", d.as_secs_f64()),
        Some(d) => format!("<{:.0}s", d.as_secs_f64()),
    }
}

/// Bytes in a cell, in MB: `48.5`, `1650`.
fn megabytes(bytes: u64) -> String {
    match bytes as f64 / 1e6 {
        mb if mb >= 100.0 => format!("{mb:.0}"),
        mb => format!("{mb:.1}"),
    }
}

/// `status`'s STORAGE table, after the workers': their sum, then at most
/// `shown` workers (those with failed requests first, then those with
/// retries, then the busiest); empty when no worker read from a store.
pub(crate) fn status_table(workers: &[WorkerInfo], shown: usize) -> String {
    let mut readers = readers(workers);
    if readers.is_empty() {
        return String::new();
    }
    let all = sum(&readers);
    let count = readers.len();
    if count > shown {
        readers.sort_by_key(|(w, t)| {
            (std::cmp::Reverse(t.failed_requests), std::cmp::Reverse(t.retries), std::cmp::Reverse(t.requests), w.worker_id)
        });
        readers.truncate(shown);
    }
    let row = |id: Option<u64>, t: &StorageTotals| {
        let mut cells = vec![label(id), t.requests.to_string(), megabytes(t.bytes)];
        cells.extend(totals_cells(t));
        cells
    };
    let rows: Vec<Vec<String>> =
        all.iter().map(|t| row(None, t)).chain(readers.iter().map(|(w, t)| row(Some(w.worker_id), t))).collect();
    let headers: Vec<&str> = ["WORKER", "REQUESTS", "MB"].into_iter().chain(TOTALS_HEADERS).collect();
    format!("{}\n{}", title(count), render(&headers, &rows))
}

/// A worker's `storage` in `status --json`: null unless it read from a
/// store. Percentiles are bucket bounds in ms.
pub(crate) fn json(used: Option<&StorageUse>) -> serde_json::Value {
    let Some(t) = used.map(totals).filter(|t| !t.is_empty()) else {
        return serde_json::Value::Null;
    };
    let ms = |q: f64| t.latency_quantile(q).map(|d| d.as_millis() as u64);
    json!({
        "requests": t.requests,
        "failed_requests": t.failed_requests,
        "retries": t.retries,
        "bytes": t.bytes,
        "chunk_reads": t.chunk_reads,
        "chunk_fetches": t.chunk_fetches,
        "chunk_hit_ratio": t.chunk_hit_ratio(),
        "object_reads_local": t.object_reads_local,
        "object_reads_store": t.object_reads_store,
        "object_hit_ratio": t.object_hit_ratio(),
        "latency_p50_ms": ms(0.5),
        "latency_p99_ms": ms(0.99),
        "latency_buckets": t.latency,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(id: u64, storage: Option<StorageUse>) -> WorkerInfo {
        WorkerInfo { worker_id: id, storage, ..Default::default() }
    }

    /// 100 requests, 90 of them under 4 ms and 9 under 128 ms; 2 failed,
    /// after 5 attempts retried.
    fn used() -> StorageUse {
        let mut latency_buckets = vec![0; 23];
        latency_buckets[2] = 90;
        latency_buckets[7] = 9;
        latency_buckets[11] = 1;
        StorageUse {
            requests: 100,
            failed_requests: 2,
            retries: 5,
            bytes: 48_500_000,
            chunk_reads: 1000,
            chunk_fetches: 130,
            object_reads_local: 0,
            object_reads_store: 0,
            latency_buckets,
        }
    }

    /// No worker read from a store: no table, and null in JSON.
    #[test]
    fn nothing_is_shown_without_reads_from_stores() {
        let workers = [worker(1, None), worker(2, Some(StorageUse::default()))];
        assert_eq!(status_table(&workers, 40), "");
        assert!(readers(&workers).is_empty());
        assert_eq!(json(None), serde_json::Value::Null);
        assert_eq!(json(Some(&StorageUse::default())), serde_json::Value::Null);
    }

    /// One row per worker that read from a store, their sum first when
    /// there are several; hit ratios and percentiles from its totals.
    #[test]
    fn the_table_sums_the_workers_that_read_from_stores() {
        let images = StorageUse { requests: 6, bytes: 1_500_000, object_reads_local: 12, object_reads_store: 6, latency_buckets: vec![0, 0, 0, 6], ..Default::default() };
        let workers = [worker(1, Some(used())), worker(2, None), worker(3, Some(images))];
        let out = status_table(&workers, 40);
        let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(out.lines().next(), Some("STORAGE (2 workers read from stores; totals since they started)"), "{out}");
        assert_eq!(lines[1], ["WORKER", "REQUESTS", "MB", "FAILED", "RETRIES", "CHUNK", "HITS", "OBJECT", "HITS", "P50", "P99"], "{out}");
        assert_eq!(lines[2], ["all", "106", "50.0", "2", "5", "87%", "67%", "<4ms", "<128ms"], "{out}");
        assert_eq!(lines[3], ["1", "100", "48.5", "2", "5", "87%", "-", "<4ms", "<128ms"], "{out}");
        assert_eq!(lines[4], ["3", "6", "1.5", "0", "0", "-", "67%", "<8ms", "<8ms"], "{out}");
        let alone = status_table(&workers[..2], 40);
        assert!(alone.starts_with("STORAGE (1 worker read") && !alone.contains("all "), "{alone}");
    }

    /// Past `shown` rows, workers with failed requests come first, then
    /// those with retries, then the busiest; the sum still counts all.
    #[test]
    fn a_long_table_lists_failures_first() {
        let workers = |retried: u64| -> Vec<WorkerInfo> {
            (1..=5u64)
                .map(|id| {
                    let failed_requests = u64::from(id == 2);
                    let retries = if id == retried { 4 } else { 0 };
                    worker(id, Some(StorageUse { requests: id * 10, failed_requests, retries, latency_buckets: vec![id * 10], ..Default::default() }))
                })
                .collect()
        };
        let firsts = |out: &str| -> Vec<String> { out.lines().skip(2).filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect() };
        let out = status_table(&workers(0), 2);
        assert_eq!(firsts(&out), ["all", "2", "5"], "{out}");
        assert!(out.contains("all     150"), "{out}");
        let out = status_table(&workers(3), 2);
        assert_eq!(firsts(&out), ["all", "2", "3"], "{out}");
    }

    /// JSON: every count, both hit ratios (null before a read of their
    /// kind), percentiles as bounds in ms.
    #[test]
    fn json_names_every_count() {
        let v = json(Some(&used()));
        let mut keys: Vec<&String> = v.as_object().expect("object").keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "bytes", "chunk_fetches", "chunk_hit_ratio", "chunk_reads", "failed_requests", "latency_buckets",
                "latency_p50_ms", "latency_p99_ms", "object_hit_ratio", "object_reads_local", "object_reads_store",
                "requests", "retries"
            ]
        );
        assert_eq!((v["failed_requests"].clone(), v["retries"].clone()), (2.into(), 5.into()));
        assert_eq!((v["requests"].clone(), v["chunk_hit_ratio"].clone(), v["object_hit_ratio"].clone()), (100.into(), 0.87.into(), serde_json::Value::Null));
        assert_eq!((v["latency_p50_ms"].clone(), v["latency_p99_ms"].clone()), (4.into(), 128.into()));
    }

    /// Percentiles read as the bounds they are; MB to a tenth while small.
    #[test]
    fn cells_read_as_bounds_and_megabytes() {
        assert_eq!((megabytes(48_540_000), megabytes(1_650_400_000)), ("48.5".to_owned(), "1650".to_owned()));
        assert_eq!(latency(None), "-");
        assert_eq!(latency(Some(Duration::from_millis(1))), "<1ms");
        assert_eq!(latency(Some(Duration::from_millis(512))), "<512ms");
        assert_eq!(latency(Some(Duration::from_millis(4096))), "<4.1s");
        assert_eq!(latency(Some(Duration::from_millis(65536))), "<66s");
    }
}
