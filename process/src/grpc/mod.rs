//! gRPC the same way in every process.
//!
//! - [`server`]: serving a process's services on a listener, with health
//!   checking and reflection, TCP_NODELAY on every connection, and the
//!   layer stack of [`layers`].
//! - [`layers`]: the tower layers every server runs behind: the one place
//!   where policy plugs in: [`auth`] (tokens per role, per [`access`]) and
//!   [`limits`] (deadlines, message sizes, the admin rate limit).
//! - [`connections`]: which of a server's connections are open, so that a
//!   service can tell a caller whose process ended from one merely silent.
//! - `incoming`: TLS connections handshaken with the certificate of the
//!   moment; `connector`: a channel's TLS connections; both read through
//!   `read_ahead` (one large `recv` for rustls's many small reads).
//! - [`channel`]: addresses as people type them, endpoints with transport
//!   settings sized for batches, and connecting within a deadline.
//! - [`streaming`]: streaming calls whose responses are read from the
//!   HTTP/2 chunks that carried them (a trainer's batches, without tonic's
//!   copy of every byte).

pub mod access;
pub mod auth;
pub mod channel;
pub mod connections;
mod connector;
mod incoming;
pub mod layers;
pub mod limits;
mod read_ahead;
pub mod server;
pub mod streaming;

pub use access::Access;
pub use connections::{Connection, Connections};
pub use channel::{AddressError, Channel, ConnectError, Target, connect, endpoint, normalize, root_cause};
pub use server::{Services, serve};
