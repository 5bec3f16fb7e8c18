//! gRPC the same way in every process.
//!
//! - [`server`]: serving a process's services on a listener, with health
//!   checking and reflection, TCP_NODELAY on every connection, and the
//!   layer stack of [`layers`].
//! - [`layers`]: the tower layers every server runs behind: the one place
//!   where policy plugs in: [`auth`] (tokens per role, per [`access`]) and
//!   [`limits`] (deadlines, message sizes, the admin rate limit).
//! - `incoming`: TLS connections handshaken with the certificate of the
//!   moment.
//! - [`channel`]: addresses as people type them, endpoints with transport
//!   settings sized for batches, and connecting within a deadline.

pub mod access;
pub mod auth;
pub mod channel;
mod incoming;
pub mod layers;
pub mod limits;
pub mod server;

pub use access::Access;
pub use channel::{AddressError, Channel, ConnectError, Target, connect, endpoint, normalize, root_cause};
pub use server::{Services, serve};
