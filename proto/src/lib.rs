//! Loader's protocol, defined once: the messages and services, the batch
//! wire format and blob names. What a job is (its spec's checks, the
//! sampler, mixtures, windows, footprints, leases) is `loader-job`'s, which
//! builds on this crate without its gRPC services (the `grpc` feature).
//!
//! # Layout
//! - [`pb`]: the generated messages of `loader/v1/*.proto`, and with the
//!   `grpc` feature (on by default) their gRPC clients and servers.
//! - [`batch`]: the batch wire format — the same bytes in a shared-memory slot
//!   and in a gRPC frame — with a writer that collates in place and a parser
//!   that validates every offset before anything is read.
//! - [`dtype`]: sizes and names of element types.
//! - [`blob`]: files a job needs beside its spec (a pickled dataset), named
//!   by their SHA-256: the hash, the chunk size and the limits.
//!
//! The shared-memory ring's messages are in `pb` (`loader/v1/ring.proto`);
//! their framing, the slot geometry and both halves of the ring live in the
//! `loader-ring` crate.

pub mod batch;
pub mod blob;
pub mod dtype;

/// Generated protobuf code for `loader.v1`, and its gRPC clients and
/// servers with the `grpc` feature.
#[allow(missing_docs, unreachable_pub, clippy::all, missing_debug_implementations)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/loader.v1.rs"));

    /// Encoded file descriptor set, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/loader_descriptor.bin"));
}

/// Generated code for KEDA's external-scaler interface (`externalscaler`),
/// which the coordinator serves so KEDA can scale workers on the stall.
#[allow(missing_docs, unreachable_pub, clippy::all, missing_debug_implementations)]
pub mod keda {
    include!(concat!(env!("OUT_DIR"), "/externalscaler.rs"));
}

/// One consumer of one job: (job id, consumer index), the consumer index
/// being the trainer's data-parallel rank. The coordinator keys the batches
/// it handed out by it, the worker its outboxes and ring leases.
pub type ConsumerKey = (u64, u32);

/// Largest request message a server decodes: requests are small (the
/// largest are a job spec and a blob chunk, at most 1 MiB:
/// [`blob::MAX_CHUNK`]); batches only flow from workers to trainers.
/// Here, not with the servers' limits, because a spec file is refused by the
/// same bound before anything is sent (`loader_job::authoring::file`).
pub const MAX_REQUEST_MESSAGE: u32 = 4 << 20;

/// Version of the coordinator/worker/trainer protocol. A peer speaking another
/// version is rejected with `FailedPrecondition`. 2: job specs carry
/// `resume` (a worker that ignored it would produce another plan's batches).
pub const PROTOCOL_VERSION: u32 = 2;
