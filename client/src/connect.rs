//! Channels to the coordinator and to workers: address parsing, transport
//! settings sized for ~10 MB batches, and the bounded retries that turn an
//! unreachable coordinator into one clear error instead of a hang.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

use crate::error::{LoaderError, root_cause};

/// Total time spent trying to reach the coordinator (or to get a retryable
/// call through) before giving up.
pub(crate) const CONNECT_BUDGET: Duration = Duration::from_secs(3);
/// One call to the coordinator: a coordinator that accepted the connection
/// but does not answer (stopped, partitioned) must not hang the caller.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// One connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// HTTP/2 windows big enough that a whole batch flows without waiting for
/// window updates.
const STREAM_WINDOW: u32 = 16 << 20;
const CONNECTION_WINDOW: u32 = 64 << 20;
/// Largest HTTP/2 frame the worker may send us: 1 MiB frames cut the
/// per-frame work of a 10 MB batch 64-fold against the 16 KiB default.
const MAX_FRAME: u32 = 1 << 20;

/// Accepts `host:port` as well as a URL, since that is what people type.
pub(crate) fn normalize(address: &str) -> String {
    let address = address.trim();
    if address.contains("://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    }
}

/// A configured endpoint for `address` (already normalized).
pub(crate) fn endpoint(address: &str) -> Result<Endpoint, LoaderError> {
    let ep =
        Endpoint::from_shared(address.to_owned()).map_err(|e| LoaderError::InvalidAddress {
            address: address.to_owned(),
            cause: root_cause(&e),
        })?;
    Ok(ep
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME))
}

/// Connects to the coordinator, retrying with backoff for at most
/// [`CONNECT_BUDGET`]. The channel reconnects by itself afterwards, so a
/// coordinator restart later on is survived by the calls' own retries.
pub(crate) async fn coordinator(address: &str) -> Result<Channel, LoaderError> {
    let ep = endpoint(address)?;
    let deadline = Instant::now() + CONNECT_BUDGET;
    let mut backoff = Duration::from_millis(50);
    loop {
        match ep.connect().await {
            Ok(channel) => return Ok(channel),
            Err(e) => {
                let cause = root_cause(&e);
                if Instant::now() + backoff >= deadline {
                    return Err(LoaderError::CoordinatorUnreachable {
                        address: address.to_owned(),
                        cause,
                    });
                }
                tracing::debug!(%address, %cause, "coordinator not reachable yet");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(800));
    }
}

/// Awaits one unary call to `address`, bounded by [`ATTEMPT_TIMEOUT`]; a call
/// that takes longer fails as `DeadlineExceeded`, which is retryable.
pub(crate) async fn attempt<T>(
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
pub(crate) async fn with_retries<T, F, Fut>(mut call: F) -> Result<T, LoaderError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, LoaderError>>,
{
    let deadline = Instant::now() + CONNECT_BUDGET;
    let mut backoff = Duration::from_millis(50);
    loop {
        match call().await {
            Err(e) if e.is_retryable() && Instant::now() + backoff < deadline => {
                tracing::debug!(error = %e, "retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(800));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_gets_a_scheme() {
        assert_eq!(normalize("127.0.0.1:7000"), "http://127.0.0.1:7000");
        assert_eq!(normalize(" http://h:1 "), "http://h:1");
    }

    #[tokio::test]
    async fn unreachable_coordinator_is_one_bounded_error() {
        let started = std::time::Instant::now();
        let e = coordinator("http://127.0.0.1:1")
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
        let e = endpoint("http://bad host").expect_err("space in host");
        assert!(e.to_string().starts_with("invalid address"), "{e}");
    }
}
