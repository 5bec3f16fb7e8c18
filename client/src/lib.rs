//! Loader's trainer SDK: every batch of a data-parallel rank, exactly once,
//! from a fleet of workers.
//!
//! ```no_run
//! use loader_client::{Dtype, Loader, spec};
//!
//! # fn main() -> Result<(), loader_client::LoaderError> {
//! let job = spec::synthetic(10_000, &[3, 224, 224], Dtype::U8).batch_size(64).shuffle(0).build()?;
//! let loader = Loader::builder("http://coordinator:7000").job(job).rank(0).world_size(1).build()?;
//! for batch in loader {
//!     let batch = batch?;
//!     let labels: Vec<i64> = batch.tensor("label").expect("label").to_vec()?;
//!     # let _ = labels;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//! - [`options`](LoaderOptions): [`LoaderOptions`], how a loader delivers
//!   (prefetch, order, the ring, the coordinator timeout) as plain data,
//!   with the defaults; what the Python SDK passes whole.
//! - [`builder`](LoaderBuilder): [`LoaderBuilder`], what to read, from
//!   which coordinator (a URL, or embedded mode's), with which options;
//!   checks them all, then opens the loader.
//! - [`loader`](Loader): the public [`Loader`]; opens a session on a
//!   coordinator's address, owns the runtime and the background tasks.
//! - `blobs`: the files a job needs beside its spec (a pickled dataset),
//!   hashed when the spec is built (`loader_job::authoring`), uploaded here to the
//!   coordinator before the job is submitted.
//! - `session`: CreateOrAttachJob, OpenSession and the heartbeat that renews
//!   the session's lease with the consumed watermark and stall time; reopens
//!   the session when a restarted coordinator forgot it.
//! - `routes`: polls `Routes` and keeps one fetch stream per listed worker.
//! - `fetch`: one `BatchService.Fetch` stream: credits out, validated batches in.
//! - the shared-memory ring co-located workers write batches into (memfd,
//!   socket, peer credentials, slot grants, zero-copy views) and the wait
//!   set a blocked consumer sleeps in are the `loader-ring` crate's; the
//!   SDK lends it a [`RingConfig`](loader_ring::trainer::RingConfig) built
//!   from its options and parses each filled slot as it parses a frame.
//! - `gap`: what the consumer does when the in-order stream is stuck on a
//!   gap while ring slots are in use, or after a worker left the ring.
//! - `event`: what background tasks tell the consumer, and the per-batch credit.
//! - `consumer`: `next()`: reorder, de-duplicate, return credits, end of job.
//! - `meters`: batches consumed and stall time for Prometheus, when
//!   `LoaderOptions::metrics_listen` serves them.
//! - [`state`](LoaderState): [`LoaderState`], what [`Loader::state`] saves and
//!   [`LoaderBuilder::resume`] continues from, exactly.
//! - [`pin`]: the pin-memory stage: batches copied to a device (a GPU
//!   with the feature `cuda`) straight from the ring, one event each, in
//!   order, slots returned after their copies; [`Device`] names the device.
//! - `reorder`: the reorder buffer keyed by sequence number.
//! - [`batch`](Batch): [`Batch`], [`Tensor`] and [`Transport`]: views over a
//!   validated frame or ring slot.
//! - [`spec`] and [`spec_file`]: the `loader_job::authoring` crate and its `file`
//!   module, re-exported: [`JobSpec`] builders validated locally, the image
//!   pipeline's steps, a job written as YAML or JSON ([`spec_file::parse`]).
//! - `footprint`: the bytes of a job's batch, told from its spec, by which
//!   the trainer sizes its ring and prefetch window.
//! - [`connect`]: calls to the coordinator in `LoaderError` terms: bounded
//!   connects, per-call timeouts, retries (channels and the backoff come
//!   from `loader_process`).
//! - [`error`](LoaderError): [`LoaderError`]; the one place a gRPC status is mapped.
//! - [`embedded`] (feature `embedded`): what [`Loader::local`] starts, a
//!   coordinator in-process and worker processes, for one machine with no
//!   deployment.

mod batch;
mod blobs;
mod builder;
mod consumer;
mod error;
mod event;
mod fetch;
mod footprint;
mod gap;
mod late;
mod loader;
mod meters;
mod options;
pub mod pin;
mod reorder;
mod routes;
mod session;
mod state;

pub mod connect;
#[cfg(feature = "embedded")]
pub mod embedded;
/// Spec authoring lives in its own crate, `loader_job::authoring`, so `loaderctl`
/// and the Python SDK write specs without the trainer SDK; re-exported
/// here so a trainer needs one dependency and code written against
/// `loader_client::spec` keeps working. Its errors become [`LoaderError`]s
/// with `?`.
pub use loader_job::authoring as spec;
/// Spec files (YAML or JSON): `loader_job::authoring::file`, under the name it had
/// when it lived in this crate.
pub use loader_job::authoring::file as spec_file;

pub use batch::{Batch, Tensor, Transport};
pub use pin::{DEFAULT_DEVICE_PREFETCH, Device, DeviceCopy, DeviceTensor};
pub use error::LoaderError;
pub use builder::LoaderBuilder;
pub use loader::{BatchStream, Loader, RingSlots};
pub use options::{DEFAULT_COORDINATOR_TIMEOUT, DEFAULT_PREFETCH, LoaderOptions, RingSize};
pub use loader_proto::pb::{CorruptPolicy, Dtype, Job, JobSpec, Transform};
pub use spec_file::parse;
pub use loader_ring::trainer::DEFAULT_SLOT_SIZE;
pub use state::{LoaderState, Resumption, STATE_FORMAT};
#[doc(hidden)]
pub mod fuzzing;
