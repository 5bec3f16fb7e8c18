//! The shared-memory ring, both halves in one place: a trainer's ring of
//! fixed-size slots in one memfd, and the co-located workers that collate
//! batches straight into them.
//!
//! The protocol is one piece: the messages (`loader/v1/ring.proto`, in
//! `loader_proto::pb`) framed on a Unix socket, the slot geometry, the
//! doorbell both sides share, the trainer's grants and the worker's
//! reports. It lives here so that a change to it edits one crate, is
//! tested here against both halves, and has one fuzz target. The trainer
//! SDK (`loader-client`) and the worker (`loader-worker`) use it through a
//! small interface and lend it what only they know: the SDK its wait set,
//! a [`RingConfig`](trainer::RingConfig) it builds from its options and
//! what a filled slot becomes (its batch type); the worker where deliveries
//! are recorded ([`DeliveryLog`](worker::DeliveryLog)).
//!
//! # Layout
//! - [`frame`]: framing of the ring messages and the slot geometry.
//! - [`doorbell`]: the two shared words that let a trainer sleep until
//!   several reports are waiting, instead of waking for each one.
//! - [`wake`]: where a blocked trainer sleeps: one epoll set over the
//!   doorbell's eventfd, the ring's sockets and the gRPC streams' wakes.
//! - [`trainer`]: the trainer's half: the memfd, the book of slots,
//!   accepting and attaching workers, reading their reports, granting.
//! - [`worker`]: the worker's half: one connection per trainer ring, the
//!   mapping, slot leases, filled and returned reports.
//! - [`fuzzing`]: entry points for the fuzz target, not an API.

pub mod doorbell;
pub mod frame;
#[doc(hidden)]
pub mod fuzzing;
pub mod trainer;
pub mod wake;
pub mod worker;
