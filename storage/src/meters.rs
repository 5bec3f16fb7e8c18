//! What reading from stores records for Prometheus (a worker's
//! `/metrics`, docs/storage.md): requests by kind and outcome, their
//! latency, the bytes fetched, and how many chunk reads found their chunk
//! already here (the local copy's hit ratio: chunk fetches against chunk reads). Without a recorder installed
//! (the trainer SDK, a test) each call is a no-op.

use std::time::Duration;

/// One request of kind `op` ("get", "head", "list") that took `took`.
pub(crate) fn request(op: &'static str, ok: bool, took: Duration, bytes: u64) {
    let outcome = if ok { "ok" } else { "error" };
    metrics::counter!("loader_storage_requests_total", "op" => op, "outcome" => outcome).increment(1);
    metrics::histogram!("loader_storage_request_seconds", "op" => op).record(took.as_secs_f64());
    if bytes > 0 {
        metrics::counter!("loader_storage_bytes_total").increment(bytes);
    }
}

/// A read out of one chunk of an object (from the local copy, or waiting
/// for its fetch).
pub(crate) fn chunk_read() {
    // Once per sample read: the handle is looked up once (a recorder is
    // installed, if ever, before the first dataset opens).
    static READS: std::sync::OnceLock<metrics::Counter> = std::sync::OnceLock::new();
    READS.get_or_init(|| metrics::counter!("loader_storage_chunk_reads_total")).increment(1);
}

/// A chunk's fetch from the store started: 1 - fetches / reads is the
/// local copy's hit ratio.
pub(crate) fn chunk_fetch() {
    metrics::counter!("loader_storage_chunk_fetches_total").increment(1);
}
