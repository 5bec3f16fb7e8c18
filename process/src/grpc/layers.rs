//! The tower layers every Loader gRPC server runs behind, outermost first.
//!
//! Cross-cutting policy is a layer here, never code in a handler: request
//! timeouts, concurrency and rate limits, authentication, metrics and trace
//! propagation each go into [`stack`], and with it into the coordinator's
//! and every worker's server at once. Today the stack is empty: the
//! services bound their own work (leases, credits), and the policy layers
//! arrive with the issues that need them (telemetry, security).

use tower::ServiceBuilder;
use tower::layer::util::Identity;

/// The layer stack wrapped around every service of a server.
pub fn stack() -> ServiceBuilder<Identity> {
    ServiceBuilder::new()
}
