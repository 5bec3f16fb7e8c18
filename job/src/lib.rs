//! What a Loader job is and which batches it has, owned in one place: the
//! spec model and its checks, authoring (builders and spec files), the
//! sampler, mixtures, elastic re-planning, windows, footprints and leases.
//!
//! The coordinator, the workers, the trainer SDKs and `loaderctl` all read a
//! job through this crate, so a spec is checked, planned and sized by one
//! code path wherever it is. It links the protocol's messages
//! (`loader-proto` without its gRPC services) and the dataset listings, not
//! the network stack: reading a spec needs no tonic, axum or OpenTelemetry.
//!
//! # Layout
//! - [`authoring`]: specs as a user writes them — one builder per dataset
//!   kind, spec files (YAML/JSON), the counts read from the dataset's files.
//! - [`spec`]: validation of a job spec, one error message per bad field,
//!   and its [`Plan`](sampler::Plan).
//! - [`blob_refs`](mod@blob_refs): the checks of a spec's blob list.
//! - [`transforms`]: validation of an image pipeline and the tensor it
//!   produces, as typed steps the worker runs.
//! - [`sampler`]: the seeded per-epoch permutation and the
//!   `DistributedSampler` split of batches between data-parallel consumers.
//! - [`mixture`]: weighted mixtures of datasets, drawn by position.
//! - [`elastic`]: re-planning a job for a new world size at an exact
//!   position.
//! - [`footprint`]: the bytes of a job's batch, told from its spec.
//! - [`window`]: how many batches of a job may be in flight per consumer,
//!   sized by bytes so that small batches travel in large windows.
//! - [`lease`]: lease length, heartbeat and reaping intervals, one rule for
//!   the coordinator and the processes holding leases.
//! - [`error`](Error): [`Error`] and the field-level [`SpecError`].
//!
//! The byte layout of a batch, the generated messages and blob names stay in
//! `loader-proto`, which this crate builds on.

pub mod authoring;
mod blob_refs;
pub mod elastic;
mod error;
pub mod footprint;
pub mod lease;
pub mod mixture;
pub mod sampler;
pub mod spec;
pub mod transforms;
pub mod window;

pub use error::{Error, SpecError};
