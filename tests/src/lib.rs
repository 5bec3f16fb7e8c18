//! Helpers for end-to-end tests: start the real `loader-server`,
//! `loader-worker` and `loaderctl` binaries, read the address each one
//! announces, and make sure that nothing a test started outlives it.
//!
//! # Layout
//! - `scope`: [`run`] executes a test body under a time limit with a
//!   [`Scope`] that tracks every process group the body starts; at the end
//!   every group is killed and reaped, and a process still alive fails the
//!   test.
//! - [`proc`](Proc): one child in its own process group: `listening` line,
//!   stdout lines, bounded wait for its exit, its memory maps; killed with
//!   its group on drop.
//! - [`cluster`](Cluster): a coordinator and its workers; coordinator
//!   restart on the same address.
//! - [`admin`](Admin): a blocking, bounded `AdminService` client and polls
//!   with deadlines.
//! - [`trainer`](Trainer): the Rust SDK consuming on a thread, with the
//!   time of every batch, and the exact-sequence check against the plan.
//! - [`silent`](SilentTrainer): a session kept alive that never fetches (a
//!   trainer stuck before its first step), over the real `TrainerService`.
//! - [`wait`](wait_until): bounded polling, the one wait loop
//!   ([`wait_until`], [`wait_for`], [`poll`]); every other helper waits
//!   through it.
//! - [`netns`](RemoteNamespace): a network namespace on a veth pair, for a
//!   remote worker whose link can be cut.
//! - [`relay`](Relay): a loopback TCP relay a worker advertises, whose path
//!   a test freezes (a port blackholed both ways) and thaws.
//! - [`otlp`](OtlpReceiver): a real OTLP/gRPC trace receiver that keeps
//!   what it is sent.
//! - [`certs`](TestCa): a CA and the certificates it signs, as PEM files;
//!   [`write_secret`] for token files.
//! - [`dataset_files`]: images, class folders, tar shards and npy arrays
//!   written by tests.
//! - [`scrape`]: a process's Prometheus `/metrics`, fetched and parsed.
//! - [`moto`]: moto's S3 server and boto3, from `LOADER_PYTHON`'s
//!   virtualenv, for datasets in object storage.
//! - [`fault_relay`](FaultRelay): a loopback relay in front of that server
//!   that answers as a failing store would (503, 403, silence), switched
//!   at run time.
//! - [`needs`]: what a test needs from the machine (root, `ip`, `nft`,
//!   Prometheus, moto), or a one-line failure naming what installs it;
//!   no test passes without running.

mod admin;
mod certs;
mod cluster;
mod kube_api;
mod needs;
pub mod dataset_files;
mod fault_relay;
pub mod moto;
mod netns;
mod otlp;
mod proc;
mod relay;
mod scope;
pub mod scrape;
mod silent;
mod trainer;
mod wait;

pub use admin::Admin;
pub use certs::{TestCa, TestCert, write_secret};
pub use kube_api::{KubeApi, KubeRequest};
pub use needs::needs;
pub use cluster::{Cluster, ClusterBuilder};
pub use fault_relay::{Fault, FaultRelay};
pub use netns::{HOST_ADDR, NS_ADDR, RemoteNamespace};
pub use otlp::{OtlpReceiver, ReceivedSpan, string_attribute};
pub use proc::{Proc, binary, loaderctl};
pub use relay::Relay;
pub use scope::{Scope, run};
pub use silent::SilentTrainer;
pub use trainer::{Received, Trainer, assert_exact, assert_received};
pub use wait::{poll, wait_for, wait_until};
