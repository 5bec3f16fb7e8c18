//! Why a task failed.

use loader_job::spec::SpecError;
use loader_proto::batch::BatchError;

use crate::blobs::BlobError;
use crate::collate::CollateError;
use crate::dataset::DatasetError;

/// Why a task failed. Each message is one line, for the coordinator and
/// the trainers (it travels as `Failed.error`).
#[derive(Debug, thiserror::Error)]
pub(super) enum TaskError {
    /// The task names no job.
    #[error("task carries no job")]
    NoJob,
    /// The task's job has no spec.
    #[error("job carries no spec")]
    NoSpec,
    /// The spec cannot be planned.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The task names a consumer the job does not have.
    #[error("consumer {consumer} is out of range for {consumers} consumers")]
    ConsumerOutOfRange {
        /// The consumer named.
        consumer: u32,
        /// Consumers of the job.
        consumers: u32,
    },
    /// The task names seqs the job does not have.
    #[error("seqs {start}..{end} are out of range for batches {first}..{total}")]
    SeqsOutOfRange {
        /// First seq of the task.
        start: u64,
        /// End of the task's seqs (exclusive).
        end: u64,
        /// The job's first batch (past 0 for a resumed job).
        first: u64,
        /// Batches of the job.
        total: u64,
    },
    /// The dataset could not be opened.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// A blob of the job could not be made local.
    #[error(transparent)]
    Blob(#[from] BlobError),
    /// The job has blobs and this producer cannot fetch any.
    #[error("the job references blobs and this worker has no coordinator to fetch them from")]
    NoBlobFetcher,
    /// The dataset is not the one the job was planned for.
    #[error("dataset holds {held} samples, the job was planned for {planned}")]
    SampleCount {
        /// Samples in the dataset.
        held: u64,
        /// Samples the plan counts.
        planned: u64,
    },
    /// A full batch of the job cannot be laid out.
    #[error("job {job_id}: {source}")]
    Layout {
        /// The job.
        job_id: u64,
        /// Why the layout failed.
        source: BatchError,
    },
    /// The job's batches do not fit this worker's memory budget; the
    /// message is `crate::budget::refuse`'s.
    #[error("{0}")]
    OverBudget(String),
    /// One batch could not be built.
    #[error("job {job_id} batch {seq}: {source}")]
    Batch {
        /// The job.
        job_id: u64,
        /// The batch.
        seq: u64,
        /// Why it could not be built.
        source: CollateError,
    },
    /// Producing the task panicked.
    #[error("the worker panicked while producing this task")]
    Panicked,
}
