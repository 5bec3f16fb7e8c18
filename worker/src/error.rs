//! The worker's errors: what ends the process ([`WorkerError`]), why a
//! trainer's `Fetch` call is refused (`FetchError`), and the one place where
//! errors become gRPC statuses. The services use these types; this module
//! uses none of theirs.

use std::time::Duration;

use tonic::Status;

use crate::config::human;

/// Why the worker stopped. Every message is one line that names the address
/// or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// `--listen` could not be bound or read.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address as given.
        addr: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The coordinator URL does not parse.
    #[error("invalid coordinator address {addr:?}: {reason}")]
    CoordinatorAddress {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The first registration did not succeed in time.
    #[error("cannot reach coordinator {addr} after {}: {cause}", human(*.after))]
    Unreachable {
        /// Coordinator URL.
        addr: String,
        /// How long registration was retried.
        after: Duration,
        /// The last failure.
        cause: String,
    },
    /// The coordinator refused this worker for good (protocol mismatch, bad
    /// request).
    #[error("coordinator {addr} refused this worker: {cause}")]
    Refused {
        /// Coordinator URL.
        addr: String,
        /// The coordinator's reason.
        cause: String,
    },
    /// No heartbeat succeeded within the lease: the coordinator has given
    /// this worker's batches to others, so it fenced itself.
    #[error("lost coordinator {addr} for {}; exiting", human(*.ttl))]
    LeaseLost {
        /// Coordinator URL.
        addr: String,
        /// The lease length that passed without a renewal.
        ttl: Duration,
    },
    /// The producer thread could not be started.
    #[error("cannot start the producer thread: {0}")]
    Thread(std::io::Error),
    /// The gRPC server failed.
    #[error("batch server failed: {0}")]
    Serve(String),
    /// `--metrics-listen` could not be served.
    #[error("--metrics-listen: {0}")]
    Metrics(#[from] loader_process::telemetry::metrics::MetricsError),
    /// A TLS or token setting cannot be used.
    #[error(transparent)]
    Security(#[from] loader_process::security::SecurityError),
    /// The host's blob directory cannot be used.
    #[error(transparent)]
    BlobDir(#[from] loader_process::blobs::BlobDirError),
}

/// Why a `Fetch` call was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    /// The stream ended before naming its job and consumer.
    #[error("Fetch stream closed before its opening request")]
    NoOpening,
    /// The worker is shutting down.
    #[error("worker is shutting down")]
    Closed,
    /// A fetch without its session's key (tokens are on): a trainer
    /// fetches only its own session's batches.
    #[error("session {session}: missing or wrong session key for job {job} consumer {consumer} (a trainer fetches only its own session's batches)")]
    WrongSessionKey {
        /// The job named.
        job: u64,
        /// The consumer named.
        consumer: u32,
        /// The session named.
        session: u64,
    },
}

impl From<FetchError> for Status {
    fn from(e: FetchError) -> Self {
        match e {
            FetchError::NoOpening => Status::invalid_argument(e.to_string()),
            FetchError::Closed => Status::unavailable(e.to_string()),
            FetchError::WrongSessionKey { .. } => Status::permission_denied(e.to_string()),
        }
    }
}

/// A status or transport error with its causes, on one line: tonic's own
/// messages ("transport error") hide the part a user can act on.
pub(crate) fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out.replace('\n', " ")
}
