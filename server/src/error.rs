//! The coordinator's errors and their one mapping to gRPC status codes, so a
//! client can tell what to retry from what to fix.

use loader_job::spec::SpecError;
use tonic::{Code, Status};

/// Why the coordinator refused a request.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The peer speaks another protocol version.
    #[error("protocol version {got} is not supported (coordinator speaks {want})")]
    ProtocolMismatch {
        /// Version the peer sent.
        got: u32,
        /// Version this coordinator speaks.
        want: u32,
    },
    /// The job spec is invalid.
    #[error(transparent)]
    InvalidSpec(#[from] SpecError),
    /// A request named a job the coordinator does not have.
    #[error("no job with id {0}")]
    UnknownJob(u64),
    /// A request named a worker the coordinator does not have.
    #[error("no worker with id {0}")]
    UnknownWorker(u64),
    /// A request named a session the coordinator does not have.
    #[error("no session with id {0}; open a new session")]
    UnknownSession(u64),
    /// A consumer index outside the job's world size.
    #[error("consumer {consumer} is out of range: the job has {consumers} consumers")]
    BadConsumer {
        /// The consumer asked for.
        consumer: u32,
        /// The job's number of consumers.
        consumers: u32,
    },
    /// A reopened session named a subscriber its job's shared stream does
    /// not have (or has for another rank).
    #[error("job {job_id} has no subscriber {subscriber} of rank {rank}; open the session without naming one")]
    BadSubscriber {
        /// The job.
        job_id: u64,
        /// The subscriber named.
        subscriber: u32,
        /// The rank it was named for.
        rank: u32,
    },
    /// A shared stream has as many subscribers as it may hold.
    #[error("job {0} has {1} subscribers, the most a shared stream holds")]
    TooManySubscribers(u64, u32),
    /// A resume point past the end of the job.
    #[error("cannot resume at batch {start_seq}: the consumer has only {total} batches")]
    BadResume {
        /// Requested resume point.
        start_seq: u64,
        /// Batches of the consumer over all epochs.
        total: u64,
    },
    /// A named job exists with a different spec.
    #[error("a job named {0:?} already exists with a different spec; pick another name or submit the same spec")]
    NameTaken(String),
    /// A resumed job's new plan was submitted under the name of a job that
    /// runs another plan and still has trainers.
    #[error(
        "a job named {0:?} runs another plan with trainers attached; a resumed job replaces it once they have left (their sessions end or expire): every new rank must resume from the same state (one rank's, or the merge of all ranks'), and the old run's trainers must have stopped"
    )]
    ResumeConflict(String),
    /// A session was asked for a job that a resumed plan of the same name
    /// replaced.
    #[error("job {0} was replaced by a resumed plan of the same name; resume from the saved state again")]
    Replaced(u64),
    /// A required message field is missing.
    #[error("request is missing {0}")]
    Missing(&'static str),
    /// The journal could not record a change; nothing was changed.
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    /// Scaling was asked of a coordinator that runs no worker pool.
    #[error("this coordinator runs no worker pool; start loader-server with --worker-pool local")]
    NoWorkerPool,
    /// Autoscaling bounds, a target or a pool size out of range.
    #[error("{0}")]
    BadScaling(String),
    /// The cluster refused to scale the worker Deployment (RBAC).
    #[error("{0}")]
    ScaleRefused(String),
    /// Scaling the worker Deployment failed otherwise.
    #[error("{0}")]
    ScaleFailed(String),
    /// The worker pool could not start a worker process.
    #[error("cannot start a worker: {0}")]
    WorkerStart(String),
    /// A call about a session without that session's key: only the
    /// trainer that opened a session may act for it.
    #[error("session {0}: missing or wrong session key (a trainer may act only for the sessions it opened)")]
    WrongSessionKey(u64),
    /// A `PutBlob` or `GetBlob` call that cannot be right (a bad hash, a
    /// chunk too large or past the blob's end, sizes that disagree).
    #[error("{0}")]
    BadBlobRequest(String),
    /// An upload's bytes do not hash to the name it was uploaded under.
    #[error("blob {sha256}: the uploaded bytes hash to {got}; upload the file again (did it change while it was read?)")]
    BlobMismatch {
        /// The name it was uploaded under.
        sha256: String,
        /// What the bytes hash to.
        got: String,
    },
    /// A blob larger than the whole blob budget.
    #[error("blob {sha256} of {size} is larger than this coordinator's blob budget of {budget}; start loader-server with a larger --blob-budget")]
    BlobTooLarge {
        /// The blob.
        sha256: String,
        /// Its size, for people.
        size: String,
        /// The budget, for people.
        budget: String,
    },
    /// A blob that does not fit next to the blobs running jobs need.
    #[error("blob {sha256} of {size} does not fit: {used} of this coordinator's {budget} blob budget hold blobs of unfinished jobs; wait for them to finish or raise loader-server --blob-budget")]
    BlobBudgetFull {
        /// The blob.
        sha256: String,
        /// Its size, for people.
        size: String,
        /// What is held or reserved, for people.
        used: String,
        /// The budget, for people.
        budget: String,
    },
    /// A read of a blob the coordinator does not hold.
    #[error("this coordinator holds no blob {0}; the trainer uploads it before it submits the job (a restarted coordinator gets it again when the trainer reopens its session)")]
    UnknownBlob(String),
    /// A job names a blob the coordinator does not hold.
    #[error("the job needs blob `{name}` ({sha256}, {size} bytes), which this coordinator does not hold; upload it first with PutBlob (the SDKs upload a spec's pickle_file themselves)")]
    MissingBlob {
        /// The blob's name in the spec.
        name: String,
        /// Its hash.
        sha256: String,
        /// Its size.
        size: u64,
    },
}

impl From<CoordinatorError> for Status {
    fn from(e: CoordinatorError) -> Self {
        let code = match &e {
            CoordinatorError::ProtocolMismatch { .. }
            | CoordinatorError::NoWorkerPool
            | CoordinatorError::MissingBlob { .. } => Code::FailedPrecondition,
            CoordinatorError::BlobTooLarge { .. }
            | CoordinatorError::BlobBudgetFull { .. }
            | CoordinatorError::TooManySubscribers(..) => Code::ResourceExhausted,
            CoordinatorError::WorkerStart(_) => Code::Internal,
            CoordinatorError::ScaleRefused(_) | CoordinatorError::WrongSessionKey(_) => Code::PermissionDenied,
            CoordinatorError::ScaleFailed(_) => Code::Unavailable,
            CoordinatorError::InvalidSpec(_)
            | CoordinatorError::BadConsumer { .. }
            | CoordinatorError::BadSubscriber { .. }
            | CoordinatorError::BadResume { .. }
            | CoordinatorError::Missing(_)
            | CoordinatorError::BadScaling(_)
            | CoordinatorError::BadBlobRequest(_)
            | CoordinatorError::BlobMismatch { .. } => Code::InvalidArgument,
            CoordinatorError::UnknownBlob(_)
            | CoordinatorError::UnknownJob(_)
            | CoordinatorError::UnknownWorker(_)
            | CoordinatorError::UnknownSession(_) => Code::NotFound,
            CoordinatorError::NameTaken(_) => Code::AlreadyExists,
            CoordinatorError::ResumeConflict(_) | CoordinatorError::Replaced(_) => Code::FailedPrecondition,
            CoordinatorError::Journal(_) => Code::Unavailable,
        };
        Status::new(code, e.to_string())
    }
}

/// Rejects a peer of another protocol version.
pub(crate) fn check_version(got: u32) -> Result<(), CoordinatorError> {
    let want = loader_proto::PROTOCOL_VERSION;
    if got == want { Ok(()) } else { Err(CoordinatorError::ProtocolMismatch { got, want }) }
}
