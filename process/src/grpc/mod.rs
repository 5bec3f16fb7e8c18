//! gRPC the same way in every process.
//!
//! - [`server`]: serving a process's services on a listener, with health
//!   checking and reflection, TCP_NODELAY on every connection, and the
//!   layer stack of [`layers`].
//! - [`layers`]: the tower layers every server runs behind: the one place
//!   where timeouts, limits, auth, TLS and metrics plug in.
//! - [`channel`]: addresses as people type them, endpoints with transport
//!   settings sized for batches, and connecting within a deadline.

pub mod channel;
pub mod layers;
pub mod server;

pub use channel::{AddressError, ConnectError, connect, endpoint, normalize, root_cause};
pub use server::{Services, serve};
