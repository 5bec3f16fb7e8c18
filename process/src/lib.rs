//! What every Loader process — `loader-server`, `loader-worker`, a trainer
//! (the SDK and `loaderctl`), the Python package — sets up the same way,
//! written once so that cross-cutting policy (TLS, auth, limits, metrics,
//! tracing export) plugs in at one place for all of them.
//!
//! # Layout
//! - [`telemetry`]: the tracing subscriber every binary installs (logs on
//!   stderr, filtered by `RUST_LOG`; OTLP span export when the
//!   OpenTelemetry environment asks for it, with the per-batch sampling
//!   decision and the trace context batches carry: [`telemetry::trace`]),
//!   and the Prometheus recorder and `/metrics` endpoint of a process that
//!   asks for one ([`telemetry::metrics`]).
//! - [`signals`]: SIGTERM and SIGINT as a future: how a process learns it
//!   should stop.
//! - [`heap`]: malloc settings for processes that allocate a batch-sized
//!   buffer per batch.
//! - [`node`]: the node identity that decides co-location.
//! - [`grpc`]: gRPC servers (health, reflection, TCP_NODELAY, the tower
//!   layer stack every server runs behind) and channels (address checks,
//!   transport settings sized for batches, bounded connects), and the TLS
//!   connections of both, made here rather than by tonic.
//! - [`security`]: TLS files, tokens per role, session keys, and the
//!   flags that set them (the checks are layers in [`grpc`]).
//! - [`retry`]: the one backoff schedule, and retrying a call until a
//!   deadline.
//! - [`blobs`]: the host's blob directory (large files of jobs, such as a
//!   pickled dataset, once per host), and SHA-256 in the spelling blobs are
//!   named by.
//! - [`size`]: sizes as people write them on command lines (`8GiB`).
//! - [`args`]: command lines, parsed the same way by every binary, usage
//!   errors as one line.
//! - [`runtime`]: the runtime policy: the data path on runtimes sized by
//!   their owners, everything beside it on one background runtime.
//!
//! Nothing here knows Loader's protocol: it sits below the crates that do
//! (`loader-proto` defines the messages; server, worker and client map their
//! own errors to gRPC codes).

pub mod args;
pub mod blobs;
pub mod grpc;
pub mod heap;
pub mod node;
pub mod retry;
pub mod runtime;
pub mod security;
pub mod signals;
pub mod size;
pub mod telemetry;
