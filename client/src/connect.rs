//! The trainer's calls to its coordinator and workers, in `LoaderError`
//! terms: channels come from `loader_process::grpc` (address checks,
//! transport settings sized for batches, bounded connects), retries from
//! `loader_process::retry`; this module bounds each call and says which
//! failures a retry may fix. Public for `loaderctl`, which speaks to the
//! coordinator the same way.

use std::future::Future;
use std::time::Duration;

use loader_process::grpc::{self, Channel, Target};
use loader_process::retry::{self, Backoff};
use loader_process::security::{ClientSecurity, Role};
use tokio::time::Instant;
use tonic::Status;

use crate::error::LoaderError;

/// Accepts `host:port` as well as a URL: `host:port` is `https://` when
/// this process has a CA to verify servers with (`--tls-ca`,
/// `LOADER_TLS_CA`), `http://` otherwise.
pub fn normalize(address: &str) -> String {
    let tls = ClientSecurity::for_role(Role::Trainer).is_ok_and(|s| s.tls.is_some());
    grpc::normalize(address, tls)
}

/// Total time spent trying to reach the coordinator (or to get a retryable
/// call through) before giving up.
pub const CONNECT_BUDGET: Duration = Duration::from_secs(3);
/// One call to the coordinator: a coordinator that accepted the connection
/// but does not answer (stopped, partitioned) must not hang the caller.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pauses between retries of a call.
const CALL_BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(800));

/// A configured endpoint for `address` (already normalized), with this
/// process's TLS settings and `role`'s token.
pub(crate) fn endpoint(address: &str, role: Role) -> Result<Target, LoaderError> {
    let security = ClientSecurity::for_role(role)?;
    grpc::endpoint(address, &security).map_err(|e| LoaderError::InvalidAddress { address: e.address, cause: e.cause })
}

/// Connects to the coordinator at `address` (already normalized) as
/// `role`, retrying for at most [`CONNECT_BUDGET`]. The channel reconnects
/// by itself afterwards, so a coordinator restart later on is survived by
/// the calls' own retries.
pub async fn coordinator(address: &str, role: Role) -> Result<Channel, LoaderError> {
    grpc::connect(&endpoint(address, role)?, Instant::now() + CONNECT_BUDGET)
        .await
        .map_err(|e| LoaderError::CoordinatorUnreachable { address: address.to_owned(), cause: e.cause })
}

/// Awaits one unary call to `address`, bounded by [`ATTEMPT_TIMEOUT`]; a call
/// that takes longer fails as `DeadlineExceeded`, which is retryable.
pub async fn attempt<T>(
    address: &str,
    call: &'static str,
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, LoaderError> {
    match tokio::time::timeout(ATTEMPT_TIMEOUT, fut).await {
        Ok(Ok(reply)) => Ok(reply.into_inner()),
        Ok(Err(status)) => Err(LoaderError::rpc(address, call, status)),
        Err(_) => Err(LoaderError::rpc(
            address,
            call,
            Status::deadline_exceeded(format!("no answer within {}s", ATTEMPT_TIMEOUT.as_secs())),
        )),
    }
}

/// Runs `call` until it succeeds, fails fatally, or [`CONNECT_BUDGET`] is
/// spent on retryable failures.
pub(crate) async fn with_retries<T, F, Fut>(call: F) -> Result<T, LoaderError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, LoaderError>>,
{
    retry::until(Instant::now() + CONNECT_BUDGET, CALL_BACKOFF, call, LoaderError::is_retryable).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unreachable_coordinator_is_one_bounded_error() {
        let started = std::time::Instant::now();
        let e = coordinator("http://127.0.0.1:1", Role::Trainer)
            .await
            .expect_err("nothing listens on port 1");
        let msg = e.to_string();
        assert!(
            msg.starts_with("cannot reach coordinator http://127.0.0.1:1: "),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
        assert!(started.elapsed() < CONNECT_BUDGET + Duration::from_secs(2));
    }

    #[test]
    fn garbage_address_is_invalid() {
        let e = endpoint("http://bad host", Role::Trainer).expect_err("space in host");
        assert!(e.to_string().starts_with("invalid address"), "{e}");
    }
}
