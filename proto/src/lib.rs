//! Loader's protocol, defined once.
//!
//! # Layout
//! - [`pb`]: the generated gRPC services and messages of `loader/v1/*.proto`.
//! - [`batch`]: the batch wire format — the same bytes in a shared-memory slot
//!   and in a gRPC frame — with a writer that collates in place and a parser
//!   that validates every offset before anything is read.
//! - [`sampler`]: the seeded per-epoch permutation and the `DistributedSampler`
//!   split of batches between data-parallel consumers.
//!
//! The shared-memory ring's messages are in `pb` (`loader/v1/ring.proto`);
//! their framing, the slot geometry and both halves of the ring live in the
//! `loader-ring` crate.
//! - [`spec`]: validation of job specs, one error message per bad field.
//! - [`spec_error`]: [`SpecError`](spec_error::SpecError), the error of
//!   every spec check, below both `spec` and `transforms`.
//! - [`transforms`]: validation of an image pipeline and the tensor it
//!   produces, as typed steps the worker runs.
//! - [`footprint`]: the bytes of a job's batch, told from its spec.
//! - [`window`]: how many batches of a job may be in flight per consumer,
//!   sized by bytes so that small batches travel in large windows.
//! - [`lease`]: lease length, heartbeat and reaping intervals, one rule for
//!   the coordinator and the processes holding leases.
//! - [`dtype`]: sizes and names of element types.
//! - [`blob`]: files a job needs beside its spec (a pickled dataset), named
//!   by their SHA-256: the chunk size and the checks of a spec's blob list.

pub mod batch;
pub mod blob;
pub mod elastic;
pub mod dtype;
pub mod footprint;
pub mod lease;
pub mod mixture;
pub mod sampler;
pub mod spec;
pub mod spec_error;
pub mod transforms;
pub mod window;

/// Generated protobuf and gRPC code for `loader.v1`.
#[allow(missing_docs, unreachable_pub, clippy::all, missing_debug_implementations)]
pub mod pb {
    tonic::include_proto!("loader.v1");

    /// Encoded file descriptor set, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/loader_descriptor.bin"));
}

/// Generated code for KEDA's external-scaler interface (`externalscaler`),
/// which the coordinator serves so KEDA can scale workers on the stall.
#[allow(missing_docs, unreachable_pub, clippy::all, missing_debug_implementations)]
pub mod keda {
    tonic::include_proto!("externalscaler");
}

/// One consumer of one job: (job id, consumer index), the consumer index
/// being the trainer's data-parallel rank. The coordinator keys the batches
/// it handed out by it, the worker its outboxes and ring leases.
pub type ConsumerKey = (u64, u32);

/// Version of the coordinator/worker/trainer protocol. A peer speaking another
/// version is rejected with `FailedPrecondition`. 2: job specs carry
/// `resume` (a worker that ignored it would produce another plan's batches).
pub const PROTOCOL_VERSION: u32 = 2;
