//! Entry points for the fuzz targets (`fuzz/`), not an API: the trainer's
//! checks of what a worker sends — a batch frame over gRPC, and a filled
//! ring slot (the parse the consumer hands the ring's inbox; the ring
//! itself is fuzzed through `loader_ring::fuzzing`) — reachable without a
//! coordinator.

use bytes::Bytes;
use loader_proto::batch::TableCache;
use loader_ring::trainer::{BadReport, Filled};

use crate::batch::{Batch, Expected};
use crate::error::LoaderError;

/// What a session expects of its batches: its job, its consumer, and the
/// sequence numbers `0..total` in epochs of `batches_per_epoch`.
#[derive(Debug, Clone, Copy)]
pub struct Session {
    /// The session's job.
    pub job_id: u64,
    /// The session's consumer.
    pub consumer: u32,
    /// Batches per epoch.
    pub batches_per_epoch: u64,
    /// Batches of the consumer over all epochs.
    pub total: u64,
}

impl Session {
    fn expected(&self) -> Expected {
        Expected {
            job_id: self.job_id,
            consumer: self.consumer,
            stream: self.consumer,
            batches_per_epoch: self.batches_per_epoch,
            total: self.total,
        }
    }
}

/// Checks `bytes` as a `Fetch` stream checks a frame from a worker, then
/// reads every tensor as a user would; returns the payload bytes read.
pub fn check_frame(bytes: Bytes, session: &Session, tables: &mut TableCache) -> Result<usize, String> {
    let batch = Batch::from_frame(bytes, &session.expected(), "fuzz", tables).map_err(|e| e.to_string())?;
    Ok(read_batch(&batch))
}

/// Parses a filled ring slot as the consumer does, then reads every tensor
/// as a user would; the error is the worker's, as the inbox takes it.
pub fn parse_slot(filled: Filled<'_>, session: &Session) -> Result<Batch, BadReport> {
    let address = filled.worker.address.clone();
    let batch = Batch::from_filled(filled, &session.expected()).map_err(|e| match e {
        LoaderError::BadBatch { address, problem } => BadReport { address, problem },
        other => BadReport { address, problem: other.to_string() },
    })?;
    read_batch(&batch);
    Ok(batch)
}

fn read_batch(batch: &Batch) -> usize {
    let _ = (batch.epoch(), batch.seq(), batch.index_in_epoch(), batch.indices().len());
    let mut n = 0;
    for t in batch.tensors() {
        n += t.bytes.len();
        let _ = t.numel();
        let _ = t.as_slice::<u32>();
        let _ = batch.tensor(t.name).map(|t| t.bytes.first().copied());
    }
    n
}
