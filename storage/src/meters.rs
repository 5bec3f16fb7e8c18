//! What reading from stores records: for Prometheus (a worker's
//! `/metrics`, docs/storage.md) requests by kind and outcome, their
//! latency, the attempts the store's client retried (`attempts`), the
//! bytes fetched, how many chunk reads found their chunk already here
//! (the local copy's hit ratio: chunk fetches against chunk reads) and
//! where an image folder's objects were read from. Without a
//! recorder installed (the trainer SDK, a test) each Prometheus call is a
//! no-op.
//!
//! The same counts are also kept as process-wide totals ([`totals`]),
//! whatever the recorder: a worker sends them in its heartbeats, so that
//! `loaderctl status` and `top` show them without a Prometheus server.
//! They are process-wide because the runtime requests run on and the local
//! copy are (`io`, `local_copy`): one job's share cannot be told apart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;


/// Entries of [`StorageTotals::latency`]: entry `i` counts requests that
/// took less than 2^`i` ms, so the last (2^22 ms, 70 min) is above the
/// longest retry budget a store may be given (an hour, `stores`).
pub const LATENCY_BUCKETS: usize = 23;

/// One request of kind `op` ("get", "head", "list") that took `took`.
pub(crate) fn request(op: &'static str, ok: bool, took: Duration, bytes: u64) {
    let outcome = if ok { "ok" } else { "error" };
    metrics::counter!("loader_storage_requests_total", "op" => op, "outcome" => outcome).increment(1);
    metrics::histogram!("loader_storage_request_seconds", "op" => op).record(took.as_secs_f64());
    if bytes > 0 {
        metrics::counter!("loader_storage_bytes_total").increment(bytes);
    }
    TALLY.request(ok, took, bytes);
}

/// Why the store's client retries an attempt: the label `reason` of
/// `loader_storage_retries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryReason {
    /// The store answered with a status the client retries (5xx, 429,
    /// 408): a store throttling (`503 Slow Down`) or restarting.
    Status,
    /// No answer: the connection failed, broke, or timed out.
    Transport,
}

impl RetryReason {
    /// The value of the metric's `reason` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            RetryReason::Status => "status",
            RetryReason::Transport => "transport",
        }
    }
}

/// An attempt at a request to a store that failed in a way the store's
/// client retries (`attempts`), for `reason`.
pub(crate) fn retry(reason: RetryReason) {
    metrics::counter!("loader_storage_retries_total", "reason" => reason.label()).increment(1);
    TALLY.retries.fetch_add(1, Ordering::Relaxed);
}

/// Chunk reads a thread counts before it adds them to the totals.
const READS_HELD: u64 = 64;

std::thread_local! {
    /// This thread's chunk reads not yet in the totals.
    static UNCOUNTED_READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A read out of one chunk of an object (from the local copy, or waiting
/// for its fetch). Once per sample read, right after its copy: counted in
/// the thread and added to the totals every [`READS_HELD`] reads and at the
/// end of each batch ([`flush_reads`]), since an atomic add per sample
/// waits for the copy's stores to drain (17% of a worker's CPU reading a
/// cached token file).
pub(crate) fn chunk_read() {
    let held = UNCOUNTED_READS.with(|c| {
        let n = c.get() + 1;
        c.set(n);
        n
    });
    if held >= READS_HELD {
        flush_reads();
    }
}

/// Adds this thread's uncounted chunk reads to the totals and the metric:
/// the worker calls it after each batch, so the counts are whole per batch.
pub fn flush_reads() {
    let n = UNCOUNTED_READS.with(|c| c.replace(0));
    if n == 0 {
        return;
    }
    // The handle is looked up once (a recorder is installed, if ever,
    // before the first dataset opens).
    static READS: std::sync::OnceLock<metrics::Counter> = std::sync::OnceLock::new();
    READS.get_or_init(|| metrics::counter!("loader_storage_chunk_reads_total")).increment(n);
    TALLY.chunk_reads.fetch_add(n, Ordering::Relaxed);
}

/// A chunk's fetch from the store started: 1 - fetches / reads is the
/// local copy's hit ratio.
pub(crate) fn chunk_fetch() {
    metrics::counter!("loader_storage_chunk_fetches_total").increment(1);
    TALLY.chunk_fetches.fetch_add(1, Ordering::Relaxed);
}

/// An image folder's object read: from the local copy (`kept`), or
/// fetched from the store. The share kept is the hit ratio of objects too
/// small to be read in chunks.
pub(crate) fn object_read(kept: bool) {
    let from = if kept { "local" } else { "store" };
    metrics::counter!("loader_storage_object_reads_total", "from" => from).increment(1);
    TALLY.object_read(kept);
}

/// This process's reads from stores since it started.
pub fn totals() -> StorageTotals {
    TALLY.totals()
}

/// Reads from stores, counted since a process started (or, summed with
/// [`StorageTotals::add`], over several processes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageTotals {
    /// Requests to stores (GET, HEAD, LIST), for the rate of requests; one
    /// the store's client retried counts once.
    pub requests: u64,
    /// Of those, the ones that failed after every retry.
    pub failed_requests: u64,
    /// Attempts at those that failed in a way the store's client retries
    /// (a 5xx, 429 or 408 answer; a failed, broken or timed-out
    /// connection), each one the client then retried, but for the last
    /// attempt of a request that failed for good when its retry time ran
    /// out, which counts too. Credential requests' count as well. How
    /// often a store throttles, restarts or is out of reach, which
    /// `failed_requests` shows only once the retries give up.
    pub retries: u64,
    /// Bytes fetched, for the rate of bytes.
    pub bytes: u64,
    /// Reads out of objects' chunks (a sample may span two).
    pub chunk_reads: u64,
    /// Chunks fetched from the store: against `chunk_reads`, the local
    /// copy's hit ratio for objects read in chunks.
    pub chunk_fetches: u64,
    /// An image folder's objects read from the local copy.
    pub object_reads_local: u64,
    /// An image folder's objects fetched from the store.
    pub object_reads_store: u64,
    /// Requests by how long they took, for percentiles: entry `i` counts
    /// those that took less than 2^`i` ms (and, but for entry 0, at least
    /// 2^(`i`-1) ms); the last entry also counts any longer. Coarse, so
    /// that a heartbeat carries it whole: a percentile is known to within
    /// a factor of two. [`LATENCY_BUCKETS`] long from [`totals`]; any
    /// length from another process's report.
    pub latency: Vec<u64>,
}

impl StorageTotals {
    /// True when nothing was read from a store, nor retried: a first
    /// request still retrying through an outage is not nothing.
    pub fn is_empty(&self) -> bool {
        self.requests == 0
            && self.retries == 0
            && self.chunk_reads == 0
            && self.object_reads_local == 0
            && self.object_reads_store == 0
    }

    /// Of the reads out of chunks, the share that fetched nothing (the
    /// chunk was here, or already on its way); None before any read.
    /// Chunks fetched ahead and never read count against it.
    pub fn chunk_hit_ratio(&self) -> Option<f64> {
        (self.chunk_reads > 0).then(|| (1.0 - self.chunk_fetches as f64 / self.chunk_reads as f64).clamp(0.0, 1.0))
    }

    /// Of an image folder's object reads, the share served by the local
    /// copy; None before any read.
    pub fn object_hit_ratio(&self) -> Option<f64> {
        let reads = self.object_reads_local.saturating_add(self.object_reads_store);
        (reads > 0).then(|| self.object_reads_local as f64 / reads as f64)
    }

    /// The latency below which a share `q` (0 to 1) of the requests
    /// finished: the upper bound of the bucket that holds the request of
    /// that rank (so at most twice the true value); None before any
    /// request.
    pub fn latency_quantile(&self, q: f64) -> Option<Duration> {
        let total: u64 = self.latency.iter().fold(0, |sum, n| sum.saturating_add(*n));
        if total == 0 {
            return None;
        }
        // The rank of the request asked for, from 1: p50 of 1 request is it.
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        let bucket = self.latency.iter().position(|n| {
            seen = seen.saturating_add(*n);
            seen >= rank
        })?;
        Some(bucket_bound(bucket))
    }

    /// Adds `other`'s counts to these (a sum over workers).
    pub fn add(&mut self, other: &StorageTotals) {
        self.requests = self.requests.saturating_add(other.requests);
        self.failed_requests = self.failed_requests.saturating_add(other.failed_requests);
        self.retries = self.retries.saturating_add(other.retries);
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.chunk_reads = self.chunk_reads.saturating_add(other.chunk_reads);
        self.chunk_fetches = self.chunk_fetches.saturating_add(other.chunk_fetches);
        self.object_reads_local = self.object_reads_local.saturating_add(other.object_reads_local);
        self.object_reads_store = self.object_reads_store.saturating_add(other.object_reads_store);
        if self.latency.len() < other.latency.len() {
            self.latency.resize(other.latency.len(), 0);
        }
        for (sum, n) in self.latency.iter_mut().zip(&other.latency) {
            *sum = sum.saturating_add(*n);
        }
    }
}

/// The upper bound of latency bucket `i`: 2^`i` ms.
fn bucket_bound(i: usize) -> Duration {
    Duration::from_millis(1u64 << i.min(63))
}

/// The latency bucket of a request that took `took`: the first whose
/// bound is above it.
fn bucket_of(took: Duration) -> usize {
    let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
    // 0 ms: bucket 0 (< 1 ms); else floor(log2(ms)) + 1.
    let bucket = (u64::BITS - ms.leading_zeros()) as usize;
    bucket.min(LATENCY_BUCKETS - 1)
}

/// The process's totals: relaxed atomics, since a heartbeat reads them
/// while reads go on (a ratio may be off by the reads in flight).
static TALLY: Tally = Tally::new();

/// The counts behind [`StorageTotals`], updated in place.
#[derive(Debug)]
struct Tally {
    requests: AtomicU64,
    failed_requests: AtomicU64,
    retries: AtomicU64,
    bytes: AtomicU64,
    chunk_reads: AtomicU64,
    chunk_fetches: AtomicU64,
    object_reads_local: AtomicU64,
    object_reads_store: AtomicU64,
    latency: [AtomicU64; LATENCY_BUCKETS],
}

impl Tally {
    const fn new() -> Self {
        Self {
            requests: AtomicU64::new(0),
            failed_requests: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            chunk_reads: AtomicU64::new(0),
            chunk_fetches: AtomicU64::new(0),
            object_reads_local: AtomicU64::new(0),
            object_reads_store: AtomicU64::new(0),
            latency: [const { AtomicU64::new(0) }; LATENCY_BUCKETS],
        }
    }

    fn request(&self, ok: bool, took: Duration, bytes: u64) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed_requests.fetch_add(1, Ordering::Relaxed);
        }
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.latency[bucket_of(took)].fetch_add(1, Ordering::Relaxed);
    }

    fn object_read(&self, kept: bool) {
        let count = if kept { &self.object_reads_local } else { &self.object_reads_store };
        count.fetch_add(1, Ordering::Relaxed);
    }

    fn totals(&self) -> StorageTotals {
        let read = |n: &AtomicU64| n.load(Ordering::Relaxed);
        StorageTotals {
            requests: read(&self.requests),
            failed_requests: read(&self.failed_requests),
            retries: read(&self.retries),
            bytes: read(&self.bytes),
            chunk_reads: read(&self.chunk_reads),
            chunk_fetches: read(&self.chunk_fetches),
            object_reads_local: read(&self.object_reads_local),
            object_reads_store: read(&self.object_reads_store),
            latency: self.latency.iter().map(read).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A request lands in the bucket whose bound is the next power of two
    /// above it; the last bucket takes any longer.
    #[test]
    fn latencies_fall_in_power_of_two_buckets() {
        assert_eq!(bucket_of(Duration::from_micros(900)), 0);
        assert_eq!(bucket_of(ms(1)), 1);
        assert_eq!(bucket_of(ms(3)), 2);
        assert_eq!(bucket_of(ms(4)), 3);
        assert_eq!(bucket_of(ms(100)), 7, "64..128 ms");
        assert_eq!(bucket_bound(7), ms(128));
        assert_eq!(bucket_of(Duration::from_secs(3600)), LATENCY_BUCKETS - 1, "the longest retry budget");
        assert_eq!(bucket_of(Duration::MAX), LATENCY_BUCKETS - 1);
        assert!(bucket_bound(LATENCY_BUCKETS - 1) > Duration::from_secs(3600));
    }

    /// What a tally counted comes back whole in its totals.
    #[test]
    fn a_tally_counts_requests_failures_bytes_and_reads() {
        let tally = Tally::new();
        assert!(tally.totals().is_empty());
        tally.request(true, ms(3), 1000);
        tally.request(false, ms(200), 0);
        tally.retries.fetch_add(3, Ordering::Relaxed);
        tally.chunk_reads.fetch_add(4, Ordering::Relaxed);
        tally.chunk_fetches.fetch_add(1, Ordering::Relaxed);
        tally.object_read(true);
        tally.object_read(false);
        tally.object_read(true);
        let totals = tally.totals();
        assert_eq!(
            (totals.requests, totals.failed_requests, totals.bytes, totals.chunk_reads, totals.chunk_fetches),
            (2, 1, 1000, 4, 1)
        );
        assert_eq!((totals.object_reads_local, totals.object_reads_store, totals.retries), (2, 1, 3));
        assert_eq!(totals.latency.len(), LATENCY_BUCKETS);
        assert_eq!((totals.latency[2], totals.latency[8], totals.latency.iter().sum::<u64>()), (1, 1, 2));
        assert!(!totals.is_empty());
    }

    /// The process's totals count through the same calls as /metrics.
    #[test]
    fn the_process_totals_count_what_is_recorded() {
        let before = totals();
        request("get", true, ms(5), 10);
        object_read(false);
        let after = totals();
        assert!(after.requests > before.requests && after.bytes >= before.bytes + 10, "{before:?} {after:?}");
        assert!(after.object_reads_store > before.object_reads_store);
    }

    /// Chunk reads reach the totals at the end of a batch, or every
    /// `READS_HELD` reads of a thread, whichever comes first.
    #[test]
    fn chunk_reads_are_counted_per_batch_or_every_few() {
        std::thread::spawn(|| {
            let before = totals().chunk_reads;
            for _ in 0..3 {
                chunk_read();
            }
            flush_reads();
            assert!(totals().chunk_reads >= before + 3);
            let before = totals().chunk_reads;
            for _ in 0..READS_HELD {
                chunk_read();
            }
            assert!(totals().chunk_reads >= before + READS_HELD, "added without a flush once READS_HELD are held");
            flush_reads();
        })
        .join()
        .expect("thread");
    }

    /// Hit ratios: reads that fetched nothing (never below 0, when chunks
    /// fetched ahead were never read) and objects served locally; none
    /// before a read.
    #[test]
    fn hit_ratios() {
        let mut t = StorageTotals::default();
        assert_eq!((t.chunk_hit_ratio(), t.object_hit_ratio()), (None, None));
        t.chunk_reads = 100;
        t.chunk_fetches = 13;
        t.object_reads_local = 3;
        t.object_reads_store = 1;
        assert_eq!(t.chunk_hit_ratio(), Some(0.87));
        assert_eq!(t.object_hit_ratio(), Some(0.75));
        t.chunk_fetches = 150;
        assert_eq!(t.chunk_hit_ratio(), Some(0.0));
    }

    /// A percentile is the bound of the bucket holding the request of its
    /// rank: within a factor of two of the true value.
    #[test]
    fn percentiles_from_buckets() {
        let mut t = StorageTotals::default();
        assert_eq!(t.latency_quantile(0.5), None, "no request");
        // 90 requests of 2..4 ms, 9 of 64..128 ms, 1 of 1..2 s.
        t.latency = vec![0; LATENCY_BUCKETS];
        t.latency[2] = 90;
        t.latency[7] = 9;
        t.latency[11] = 1;
        assert_eq!(t.latency_quantile(0.5), Some(ms(4)));
        assert_eq!(t.latency_quantile(0.9), Some(ms(4)), "the 90th of 100 is still under 4 ms");
        assert_eq!(t.latency_quantile(0.99), Some(ms(128)));
        assert_eq!(t.latency_quantile(1.0), Some(ms(2048)));
        assert_eq!(t.latency_quantile(0.0), Some(ms(4)), "the fastest");
        t.latency = vec![0, 1];
        assert_eq!(t.latency_quantile(0.5), Some(ms(2)), "one request, from a report of any length");
    }

    /// Sums over workers add every count, buckets of any length included.
    #[test]
    fn totals_add_up() {
        let mut sum = StorageTotals { requests: 1, bytes: 10, latency: vec![1, 0, 2], ..Default::default() };
        sum.add(&StorageTotals { requests: 2, failed_requests: 1, retries: 4, bytes: 5, chunk_reads: 3, object_reads_local: 1, latency: vec![0, 1, 0, 0, 4], ..Default::default() });
        assert_eq!(
            sum,
            StorageTotals { requests: 3, failed_requests: 1, retries: 4, bytes: 15, chunk_reads: 3, object_reads_local: 1, latency: vec![1, 1, 2, 0, 4], ..Default::default() }
        );
    }
}
