//! Worker settings, filled by the CLI or by an embedding program (the
//! client's embedded mode, tests) without touching the environment.

use std::time::Duration;

/// Bytes of shared streams' batches a worker keeps for trailing
/// subscribers unless told otherwise: about 100 batches of 64 images of
/// 3x224x224, a few seconds of a sweep's trainers started apart.
pub const DEFAULT_KEEP_SHARED: u64 = 1 << 30;

/// How a worker finds its coordinator and presents itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Coordinator URL, e.g. `http://127.0.0.1:5000`.
    pub coordinator: String,
    /// URL trainers use to reach this worker's `BatchService`; defaults to
    /// `http://<listener local addr>`, which only works when that address is
    /// reachable from the trainers (not `0.0.0.0`).
    pub advertise: Option<String>,
    /// Node identity for co-location; defaults to
    /// [`loader_process::node::local_node`] (hostname + boot id).
    pub node: Option<String>,
    /// Batches held undelivered per consumer: bounds the worker's memory and
    /// how far one slow trainer lets it run ahead.
    pub max_outstanding: u32,
    /// Memory the batches this worker holds may take; `None` detects it
    /// (half the cgroup limit or RAM, see [`crate::budget`]).
    pub memory_budget: Option<u64>,
    /// How long to retry the first registration before giving up, so a
    /// worker started next to its coordinator tolerates a slow start but a
    /// wrong address fails fast.
    pub connect_timeout: Duration,
    /// The host's blob directory, where the blobs of jobs (pickled
    /// datasets) are kept once per host; `None`: the one the environment
    /// names (`loader_process::blobs::default_path`).
    pub blob_dir: Option<std::path::PathBuf>,
    /// TLS and tokens: as a server to trainers, as a client of the
    /// coordinator (docs/security.md). Token values also come from the
    /// environment (`LOADER_WORKER_TOKEN`, `LOADER_TRAINER_TOKEN`).
    pub security: loader_process::security::SecurityArgs,
    /// Bytes of shared streams' batches kept after they were sent, for
    /// subscribers that trail the others (`crate::kept_batches`); 0 keeps
    /// none.
    pub keep_shared: u64,
    /// Bytes of decoded images this worker keeps for an image job's later
    /// epochs when its trainer gave it no cache (`--cache`): in memory, or
    /// in an unnamed file in `cache_dir`. None keeps none.
    pub cache: Option<u64>,
    /// Where the cache's file goes (its pages spill to that disk).
    pub cache_dir: Option<std::path::PathBuf>,
    /// Share each job's cache, a file in `cache_dir`, with the other
    /// workers of this node started so (`--cache-shared`,
    /// `sample_cache::on_node`).
    pub cache_shared: bool,
    /// Extra time every batch takes: a test knob that makes this worker a
    /// straggler (a slow disk, a noisy host). Zero in production.
    pub slow_batch: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            coordinator: "http://127.0.0.1:5000".into(),
            advertise: None,
            node: None,
            max_outstanding: 8,
            memory_budget: None,
            connect_timeout: Duration::from_secs(5),
            blob_dir: None,
            security: loader_process::security::SecurityArgs::default(),
            keep_shared: DEFAULT_KEEP_SHARED,
            cache: None,
            cache_dir: None,
            cache_shared: false,
            slow_batch: Duration::ZERO,
        }
    }
}

/// A duration as a person writes it: `5s`, `1.5s`, `250ms`.
pub(crate) fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms >= 1000 && ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else if ms >= 1000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human(Duration::from_secs(5)), "5s");
        assert_eq!(human(Duration::from_millis(1500)), "1.5s");
        assert_eq!(human(Duration::from_millis(250)), "250ms");
    }
}
