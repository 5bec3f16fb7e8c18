//! The SDK's one error type, and the one place where a gRPC [`Status`] becomes
//! a [`LoaderError`], so retryable and fatal failures are told apart the same
//! way everywhere.

use loader_job::spec::SpecError;
use tonic::{Code, Status};

/// Everything that can go wrong between a trainer and its batches. Each
/// message is one line that says what was wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoaderError {
    /// An address that is not a valid URL.
    #[error("invalid address {address:?}: {cause}")]
    InvalidAddress {
        /// The address as given.
        address: String,
        /// Why it does not parse.
        cause: String,
    },
    /// The coordinator did not answer within the connect budget.
    #[error("cannot reach coordinator {address}: {cause}")]
    CoordinatorUnreachable {
        /// Coordinator URL.
        address: String,
        /// The last connection error, innermost cause.
        cause: String,
    },
    /// The coordinator stopped answering while the trainer was running, for
    /// longer than the loader's `coordinator_timeout`: the same error on
    /// every transport, instead of a stall with no end.
    #[error(
        "lost the coordinator {address}: no answer for {}s; stopping (LoaderBuilder::coordinator_timeout waits longer)",
        after.as_secs()
    )]
    CoordinatorLost {
        /// Coordinator URL.
        address: String,
        /// How long it had not answered.
        after: std::time::Duration,
    },
    /// A gRPC call failed; [`LoaderError::is_retryable`] tells whether trying
    /// again may help.
    #[error("{call} on {address} failed: {message} ({code:?})")]
    Rpc {
        /// Peer URL.
        address: String,
        /// The RPC, e.g. `OpenSession`.
        call: &'static str,
        /// gRPC status code.
        code: Code,
        /// The peer's message.
        message: String,
    },
    /// The job spec is invalid (same message on every process).
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A TLS or token setting (flag or `LOADER_*` variable) cannot be used.
    #[error(transparent)]
    Security(#[from] loader_process::security::SecurityError),
    /// A spec could not be written down: a token file, a blob's file (or
    /// one that changed since the spec was built), or a spec file (YAML or
    /// JSON) that cannot be used. The job model's own error, with its words
    /// (`loader_job::Error`); a bad field and a dataset's listing keep their
    /// variants ([`LoaderError::Spec`], [`LoaderError::Listing`]).
    #[error(transparent)]
    Job(loader_job::Error),
    /// A dataset's files cannot be listed (missing folder, a file that is
    /// no tar shard or npy array, arrays of different lengths).
    #[error(transparent)]
    Listing(#[from] loader_listing::ListingError),
    /// A worker sent a frame that is not a valid batch of this session.
    #[error("worker {address}: {problem}")]
    BadBatch {
        /// Worker URL.
        address: String,
        /// What was wrong with the frame.
        problem: String,
    },
    /// A co-located worker left the shared-memory ring while batches of this
    /// consumer were still to come, and no other worker delivered them.
    #[error(
        "worker {address} (pid {pid}) disconnected from the shared-memory ring with batches outstanding; \
         none arrived from another worker within {:.0}s", waited.as_secs_f64()
    )]
    WorkerDisconnected {
        /// Worker URL, from its ring hello.
        address: String,
        /// Its process id.
        pid: i32,
        /// How long the stream waited on the gap after it left.
        waited: std::time::Duration,
    },
    /// The coordinator marked the job failed (bad sample, missing file...).
    #[error("job failed: {0}")]
    JobFailed(String),
    /// The coordinator restarted without its journal and gave the job a new
    /// id; this loader's batches belong to the old one.
    #[error(
        "coordinator {address} lost job {job_id} (restarted without its --state-dir journal) \
         and re-created it as job {new_id}; resume a new loader from the last Loader::state()"
    )]
    JobLost {
        /// Coordinator URL.
        address: String,
        /// The job this loader consumed.
        job_id: u64,
        /// The id the coordinator gave the re-created job.
        new_id: u64,
    },
    /// A tensor was read as an element type of another size.
    #[error(
        "tensor {tensor:?} holds {dtype} ({size} bytes per element); cannot read it as {requested}"
    )]
    DtypeMismatch {
        /// Tensor name.
        tensor: String,
        /// The tensor's dtype name.
        dtype: &'static str,
        /// Bytes per element of that dtype.
        size: usize,
        /// The Rust type asked for.
        requested: &'static str,
    },
    /// A builder setting that cannot work (rank outside the world size...).
    #[error("{0}")]
    InvalidArgument(String),
    /// A saved [`LoaderState`](crate::LoaderState) cannot be read, written
    /// or used (corrupt, another format, inconsistent).
    #[error("{0}")]
    State(String),
    /// Embedded mode could not start or lost a process it started.
    #[error("{0}")]
    Embedded(String),
    /// The loader's device cannot be used (no driver library, no such GPU,
    /// a driver call that failed) or its buffers are all held.
    #[error("{0}")]
    Device(String),
    /// The SDK's own tokio runtime could not be built.
    #[error("cannot start the loader runtime: {0}")]
    Runtime(String),
}

/// The one place a spec authoring error ([`loader_job::Error`]) becomes a
/// [`LoaderError`], with the same message: a bad field and a listing keep
/// the variants every other path gives them, the rest is wrapped whole.
impl From<loader_job::Error> for LoaderError {
    fn from(e: loader_job::Error) -> Self {
        match e {
            loader_job::Error::Spec(e) => LoaderError::Spec(e),
            loader_job::Error::Listing(e) => LoaderError::Listing(e),
            e => LoaderError::Job(e),
        }
    }
}

impl LoaderError {
    /// Maps a gRPC status from `call` on `address`. This is the only place a
    /// [`Status`] turns into a [`LoaderError`].
    pub(crate) fn rpc(address: &str, call: &'static str, status: Status) -> Self {
        // A status tonic made up from a transport failure (the connection
        // died mid-call, the stream was reset) carries that failure as its
        // source; a status the peer sent never does. Whatever code tonic
        // guessed for it (Cancelled, Unknown, Internal), the call did not get
        // through, which is what Unavailable means: retry.
        let cut_off =
            std::error::Error::source(&status).is_some() && status.code() != Code::DeadlineExceeded;
        LoaderError::Rpc {
            address: address.to_owned(),
            call,
            code: if cut_off {
                Code::Unavailable
            } else {
                status.code()
            },
            message: if cut_off {
                // The transport's own words ("connection closed before
                // message completed", "invalid peer certificate"), with a
                // hint when they are how a TLS mismatch shows.
                loader_process::grpc::channel::explain(address, &loader_process::grpc::root_cause(&status))
            } else {
                one_line(status.message())
            },
        }
    }

    /// True when the same call may succeed later: the peer was unavailable or
    /// too slow. Invalid arguments, failed preconditions, missing sessions and
    /// everything else are fatal.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LoaderError::Rpc {
                code: Code::Unavailable | Code::DeadlineExceeded,
                ..
            }
        )
    }

    /// The gRPC status code, when the error came from a call.
    pub fn code(&self) -> Option<Code> {
        match self {
            LoaderError::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<loader_ring::trainer::BadReport> for LoaderError {
    /// A worker that broke the ring's protocol is reported like one that
    /// sent a bad gRPC frame.
    fn from(e: loader_ring::trainer::BadReport) -> Self {
        LoaderError::BadBatch { address: e.address, problem: e.problem }
    }
}

impl From<loader_ring::trainer::GeometryError> for LoaderError {
    /// Ring settings that cannot work are a bad argument, like any option.
    fn from(e: loader_ring::trainer::GeometryError) -> Self {
        LoaderError::InvalidArgument(e.0)
    }
}

/// Keeps messages to one line whatever the peer sent.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_cut_off_by_the_transport_is_retryable() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        let status = Status::from_error(Box::new(reset));
        assert_ne!(status.code(), Code::Unavailable, "tonic's guess");
        let e = LoaderError::rpc("http://c:1", "Heartbeat", status);
        assert_eq!(e.code(), Some(Code::Unavailable));
        assert!(e.is_retryable());
        assert!(e.to_string().contains("connection reset"), "{e}");
    }

    #[test]
    fn retryable_codes_are_unavailable_and_deadline() {
        for (code, retry) in [
            (Code::Unavailable, true),
            (Code::DeadlineExceeded, true),
            (Code::InvalidArgument, false),
            (Code::FailedPrecondition, false),
            (Code::NotFound, false),
            (Code::Internal, false),
        ] {
            let e = LoaderError::rpc(
                "http://w:1",
                "Routes",
                Status::new(code, "boom\nsecond line"),
            );
            assert_eq!(e.is_retryable(), retry, "{code:?}");
            assert_eq!(e.code(), Some(code));
            assert!(!e.to_string().contains('\n'));
        }
    }
}
