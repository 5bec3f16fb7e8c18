//! [`MadeBatch`]: a batch a dataset makes whole, for datasets whose batches
//! are not rows of per-sample tensors — a Python dataset with a
//! `collate_fn`, which may pad, stack or reshape as it likes, so the
//! batch's tensors and shapes are known only once it is made. The worker
//! lays such a batch out after making it (`collate::made_layout`) and picks
//! its destination (a ring slot that fits, else gRPC) then.

use loader_proto::pb::Dtype;

use super::Skipped;

/// One tensor of a made batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadeTensor {
    /// Name the trainer looks it up by.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Its whole shape (no batch dimension is implied).
    pub shape: Vec<u64>,
    /// Its bytes, C order; exactly `shape`'s elements of `dtype`.
    pub bytes: Vec<u8>,
}

/// A batch a dataset made whole.
#[derive(Debug, Default)]
pub struct MadeBatch {
    /// Its tensors.
    pub tensors: Vec<MadeTensor>,
    /// Dataset indices of the samples it holds, in order.
    pub kept: Vec<u64>,
    /// Samples left out under the `skip` policy.
    pub skipped: Vec<Skipped>,
}
