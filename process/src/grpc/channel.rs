//! Channels to a coordinator or a worker: the address as people type it,
//! one set of transport settings sized for ~10 MB batches, and connecting
//! within a deadline, so an unreachable peer is one clear error instead of
//! a hang.

use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::retry::{self, Backoff};

/// One connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// HTTP/2 windows big enough that a whole batch flows without waiting for
/// window updates.
const STREAM_WINDOW: u32 = 16 << 20;
const CONNECTION_WINDOW: u32 = 64 << 20;
/// Largest HTTP/2 frame the peer may send: 1 MiB frames cut the per-frame
/// work of a 10 MB batch 64-fold against the 16 KiB default.
const MAX_FRAME: u32 = 1 << 20;
/// Pauses between connection attempts.
const CONNECT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(800));

/// An address that is not a URL a channel can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid address {address:?}: {cause}")]
pub struct AddressError {
    /// The address as given (after [`normalize`]).
    pub address: String,
    /// What is wrong with it, on one line.
    pub cause: String,
}

/// No connection could be made within the deadline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot reach {address}: {cause}")]
pub struct ConnectError {
    /// The address tried.
    pub address: String,
    /// Why the last attempt failed, on one line ("Connection refused").
    pub cause: String,
}

/// Accepts `host:port` as well as a URL, since that is what people type.
pub fn normalize(address: &str) -> String {
    let address = address.trim();
    if address.contains("://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    }
}

/// An endpoint for `address` (a URL: `http://host:port`) with Loader's
/// transport settings; nothing is connected yet.
pub fn endpoint(address: &str) -> Result<Endpoint, AddressError> {
    let bad = |cause: String| AddressError { address: address.to_owned(), cause };
    let endpoint = Endpoint::from_shared(address.to_owned()).map_err(|e| bad(root_cause(&e)))?;
    let uri = endpoint.uri();
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(bad("expected a URL such as http://host:port".into()));
    }
    Ok(endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME))
}

/// Connects to `endpoint`, retrying until `deadline`. The channel
/// reconnects by itself afterwards, so a peer's restart later on is
/// survived by the calls' own retries.
pub async fn connect(endpoint: &Endpoint, deadline: Instant) -> Result<Channel, ConnectError> {
    retry::until(deadline, CONNECT_BACKOFF, || endpoint.connect(), |_| true)
        .await
        .map_err(|e| ConnectError {
            address: endpoint.uri().to_string().trim_end_matches('/').to_owned(),
            cause: root_cause(&e),
        })
}

/// The innermost cause of an error, on one line: what a user can act on
/// ("Connection refused (os error 111)"), not tonic's "transport error".
pub fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_gets_a_scheme() {
        assert_eq!(normalize("127.0.0.1:7000"), "http://127.0.0.1:7000");
        assert_eq!(normalize(" http://h:1 "), "http://h:1");
    }

    #[test]
    fn garbage_and_schemeless_addresses_are_invalid() {
        let e = endpoint("http://bad host").expect_err("space in host");
        assert!(e.to_string().starts_with("invalid address"), "{e}");
        let e = endpoint("ftp://h:1").expect_err("not http");
        assert_eq!(e.cause, "expected a URL such as http://host:port");
    }

    #[tokio::test]
    async fn nothing_listening_is_one_bounded_error() {
        let budget = Duration::from_millis(500);
        let started = std::time::Instant::now();
        let e = connect(&endpoint("http://127.0.0.1:1").expect("valid"), Instant::now() + budget)
            .await
            .expect_err("nothing listens on port 1");
        assert_eq!(e.address, "http://127.0.0.1:1");
        assert!(!e.cause.is_empty() && !e.cause.contains('\n'), "{e}");
        assert!(started.elapsed() < budget + CONNECT_TIMEOUT + Duration::from_secs(1));
    }
}
