//! The tower layers every Loader gRPC server runs behind, outermost first.
//!
//! Cross-cutting policy is a layer here, never code in a handler, and goes
//! into the coordinator's and every worker's server at once:
//! 1. [`auth`](super::auth): the caller's token must be of the role the
//!    service needs (a no-op when the server has no tokens);
//! 2. [`limits`](super::limits): the admin calls' rate limit, a deadline on
//!    each call, and the size of each request message.
//!
//! Concurrent calls per connection are tonic's own per-connection limit
//! (set where the server is built), TLS is the connection itself
//! ([`super::incoming`]).

use std::num::NonZeroU32;
use std::sync::Arc;

use tower::ServiceBuilder;
use tower::layer::util::{Identity, Stack as S};

use super::access::Policy;
use super::auth::AuthLayer;
use super::limits::{self, AdminRateLimitLayer, MessageSizeLayer, TimeoutLayer};
use crate::security::RoleTokens;

/// The layers, as the type tonic's server builder takes.
pub type Stack = S<MessageSizeLayer, S<TimeoutLayer, S<AdminRateLimitLayer, S<AuthLayer, Identity>>>>;

/// The layer stack wrapped around every service of a server whose services
/// are `policy` and whose accepted tokens are `tokens` (none: no checks).
pub fn stack(policy: Policy, tokens: Option<RoleTokens>) -> ServiceBuilder<Stack> {
    let policy = Arc::new(policy);
    let admin_rate = NonZeroU32::new(limits::ADMIN_CALLS_PER_SECOND).unwrap_or(NonZeroU32::MIN);
    ServiceBuilder::new()
        .layer(AuthLayer::new(tokens, Arc::clone(&policy)))
        .layer(AdminRateLimitLayer::new(admin_rate, policy))
        .layer(TimeoutLayer(limits::REQUEST_TIMEOUT))
        .layer(MessageSizeLayer(limits::MAX_REQUEST_MESSAGE))
}
