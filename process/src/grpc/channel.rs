//! Channels to a coordinator or a worker: the address as people type it,
//! one set of transport settings sized for ~10 MB batches, TLS and the
//! caller's token when its [`ClientSecurity`] has them, and connecting
//! within a deadline, so an unreachable peer is one clear error instead of
//! a hang.

use std::task::{Context, Poll};
use std::time::Duration;

use http::HeaderValue;
use tokio::time::Instant;
use tonic::body::Body;
use tonic::transport::Endpoint;

use super::connector::TlsConnector;
use crate::retry::{self, Backoff};
use crate::security::ClientSecurity;

/// One connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// HTTP/2 pings on a connection with a call in flight, for the channels
/// that ask ([`Target::keepalive`]: a trainer's Fetch streams, a worker's
/// link to its coordinator): a path that went silent (a blackholed port, a
/// half-dead link) fails its calls within `KEEPALIVE_INTERVAL +
/// KEEPALIVE_TIMEOUT` instead of waiting on TCP's retransmission backoff
/// for minutes. Only channels whose runtime polls them all along: a client
/// that polls its connection only while it calls (a blocking client on a
/// current-thread runtime, as `loaderctl status`) finds its connection
/// closed by a ping timer that ran out while it was not looking. Servers
/// do not ping, for the same reason; a worker learns of a trainer that
/// cannot reach it from the coordinator (told to drop its batches).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
/// How long a ping may go unanswered: long enough for a peer on a busy
/// machine (its runtime threads starved for a moment) to answer.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 windows big enough that a whole batch flows without waiting for
/// window updates, and never is cut at a window's edge: the peer may send
/// only what the window has room for, so with 16 MiB windows a 9.6 MB
/// batch arrived in two or three pieces that the trainer had to copy
/// together (`super::streaming`). The receiver releases a window as it
/// reads, not as batches are consumed, and credits bound what a worker
/// sends ahead, so the windows reserve no memory.
const STREAM_WINDOW: u32 = 64 << 20;
const CONNECTION_WINDOW: u32 = 256 << 20;
/// Largest HTTP/2 frame the peer may send: HTTP/2's largest (16 MiB - 1),
/// so a batch up to that size is one DATA frame, which the trainer reads
/// in place (`super::streaming`); 1 MiB frames cost a copy of every batch
/// over 1 MiB, and 16 KiB frames (the default) multiply the per-frame work.
const MAX_FRAME: u32 = (1 << 24) - 1;
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

/// Accepts `host:port` as well as a URL, since that is what people type:
/// `host:port` is `https://` for a client with TLS settings, `http://`
/// otherwise; a URL keeps the scheme it was given.
pub fn normalize(address: &str, tls: bool) -> String {
    let address = address.trim();
    if address.contains("://") {
        address.to_owned()
    } else if tls {
        format!("https://{address}")
    } else {
        format!("http://{address}")
    }
}

/// Where to connect and how: an endpoint with Loader's transport settings
/// (and TLS for an `https://` address), and the token every call carries.
#[derive(Debug, Clone)]
pub struct Target {
    /// The address as given (`https://` for TLS), for messages.
    address: String,
    /// tonic's endpoint: the transport settings; for TLS, an `http://`
    /// origin that [`Target::tls`] connects to.
    endpoint: Endpoint,
    /// TLS connections, for an `https://` address.
    tls: Option<TlsConnector>,
    authorization: Option<HeaderValue>,
}

impl Target {
    /// Changes the endpoint's settings (e.g. its connect timeout).
    pub fn map_endpoint(mut self, f: impl FnOnce(Endpoint) -> Endpoint) -> Self {
        self.endpoint = f(self.endpoint);
        self
    }

    /// Pings the peer while calls are in flight (see [`KEEPALIVE_INTERVAL`]);
    /// only for a channel its runtime polls all along.
    pub fn keepalive(self) -> Self {
        self.map_endpoint(|e| {
            e.http2_keep_alive_interval(KEEPALIVE_INTERVAL).keep_alive_timeout(KEEPALIVE_TIMEOUT).keep_alive_while_idle(false)
        })
    }

    /// The address, as a URL without a trailing slash.
    pub fn address(&self) -> String {
        self.address.clone()
    }

    /// A channel that connects on its first call (and reconnects by itself).
    pub fn connect_lazy(&self) -> Channel {
        let inner = match &self.tls {
            Some(tls) => self.endpoint.connect_with_connector_lazy(tls.clone()),
            None => self.endpoint.connect_lazy(),
        };
        Channel { inner, authorization: self.authorization.clone() }
    }

    /// One connection attempt.
    async fn connect_once(&self) -> Result<tonic::transport::Channel, tonic::transport::Error> {
        match &self.tls {
            Some(tls) => self.endpoint.connect_with_connector(tls.clone()).await,
            None => self.endpoint.connect().await,
        }
    }
}

/// An endpoint for `address` (a URL: `http://host:port` or `https://`)
/// with Loader's transport settings and `security`'s TLS and token;
/// nothing is connected yet.
pub fn endpoint(address: &str, security: &ClientSecurity) -> Result<Target, AddressError> {
    let bad = |cause: String| AddressError { address: address.to_owned(), cause };
    let endpoint = Endpoint::from_shared(address.to_owned()).map_err(|e| bad(root_cause(&e)))?;
    let uri = endpoint.uri().clone();
    let shown = uri.to_string().trim_end_matches('/').to_owned();
    let (Some(scheme @ ("http" | "https")), Some(host)) = (uri.scheme_str(), uri.host()) else {
        return Err(bad("expected a URL such as http://host:port".into()));
    };
    let tls = if scheme == "https" {
        let Some(tls) = &security.tls else {
            return Err(bad("an https:// address needs the CA to verify the server with: set --tls-ca or LOADER_TLS_CA".into()));
        };
        let config = tls.client_config().map_err(|e| bad(e.to_string()))?;
        Some(TlsConnector::new(config, host).map_err(bad)?)
    } else {
        None
    };
    let endpoint = match tls {
        // The connector does the TLS; see `super::connector`.
        Some(_) => {
            let mut parts = uri.into_parts();
            parts.scheme = Some(http::uri::Scheme::HTTP);
            let origin = http::Uri::from_parts(parts).map_err(|e| bad(e.to_string()))?;
            Endpoint::from(origin)
        }
        None => endpoint,
    };
    let endpoint = endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME);
    let authorization = security
        .token
        .as_ref()
        .map(|t| {
            let mut v = HeaderValue::try_from(format!("Bearer {}", t.secret()))
                .map_err(|_| bad("the token is not a valid header value".into()))?;
            // Never put the secret in HPACK's dynamic table.
            v.set_sensitive(true);
            Ok::<_, AddressError>(v)
        })
        .transpose()?;
    Ok(Target { address: shown, endpoint, tls, authorization })
}

/// Connects to `target`, retrying until `deadline`. The channel reconnects
/// by itself afterwards, so a peer's restart later on is survived by the
/// calls' own retries.
pub async fn connect(target: &Target, deadline: Instant) -> Result<Channel, ConnectError> {
    let inner = retry::until(deadline, CONNECT_BACKOFF, || target.connect_once(), |_| true)
        .await
        .map_err(|e| ConnectError { address: target.address(), cause: explain(&target.address(), &root_cause(&e)) })?;
    Ok(Channel { inner, authorization: target.authorization.clone() })
}

/// `cause` of a failed connection to `address`, with a hint for the
/// failures a TLS mismatch causes, which otherwise read as a broken
/// connection.
pub fn explain(address: &str, cause: &str) -> String {
    let tls = address.starts_with("https://");
    let lower = cause.to_lowercase();
    let hung_up = PLAINTEXT_CUT_OFF.iter().any(|c| lower.contains(c));
    // About the server's certificate (rustls: "invalid peer certificate: ...").
    let server_cert = lower.contains("invalid peer certificate");
    let presented = || crate::security::tls::presented_certificate_problem();
    let hint = if !tls && hung_up {
        " (the server closed the connection: if it requires TLS, use https:// and --tls-ca)".to_owned()
    } else if tls && (cause.contains("CertificateRequired") || cause.contains("certificate required")) {
        " (the server requires a client certificate: set --tls-cert and --tls-key)".to_owned()
    } else if tls && cause.contains("CertificateExpired") && !server_cert {
        // The server's alert about this client's certificate.
        match presented() {
            Some(p) => format!(" (the server refused it: {p})"),
            None => " (the server refused this client's certificate as expired or not yet valid: renew --tls-cert, or check the clocks)".to_owned(),
        }
    } else if tls && (cause.contains("UnknownCA") || cause.contains("BadCertificate")) {
        " (the server does not trust this client's certificate: --tls-cert must be signed by its --tls-client-ca)".to_owned()
    } else if tls && hung_up {
        // TLS 1.3 checks a client's certificate after the client thinks the
        // handshake is done: a refusal can arrive as a plain hang-up. What
        // this process knows of its own certificate says which refusal.
        match presented() {
            Some(p) => format!(" (the server closed the connection: {p})"),
            None => " (the server closed the connection: if it requires a client certificate, set --tls-cert and --tls-key signed by its CA)".to_owned(),
        }
    } else if tls && (cause.contains("InvalidContentType") || cause.contains("corrupt message")) {
        " (the server does not speak TLS: use http:// for it, or give it --tls-cert)".to_owned()
    } else if tls && cause.contains("UnknownIssuer") {
        " (the server's certificate is not signed by the CA in --tls-ca)".to_owned()
    } else if tls && (cause.contains("NotValidForName") || lower.contains("not valid for name")) {
        " (the server's certificate does not name this host)".to_owned()
    } else if tls && server_cert && (cause.contains("Expired") || lower.contains("certificate expired")) {
        " (the server's certificate has expired: the server needs a renewed --tls-cert)".to_owned()
    } else if tls && server_cert && (cause.contains("NotValidYet") || lower.contains("not valid yet")) {
        " (the server's certificate is not valid yet: check this machine's clock and the server's)".to_owned()
    } else {
        String::new()
    };
    format!("{cause}{hint}")
}

/// How a plaintext HTTP/2 connection to a TLS server ends, as the client
/// sees it (the server hangs up on the first bytes).
const PLAINTEXT_CUT_OFF: [&str; 4] = ["connection closed", "connection reset", "broken pipe", "connection error"];

/// A channel whose calls carry the caller's token (when it has one).
#[derive(Debug, Clone)]
pub struct Channel {
    inner: tonic::transport::Channel,
    authorization: Option<HeaderValue>,
}

impl tower::Service<http::Request<Body>> for Channel {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = tonic::transport::channel::ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        if let Some(v) = &self.authorization {
            req.headers_mut().insert(http::header::AUTHORIZATION, v.clone());
        }
        tower::Service::call(&mut self.inner, req)
    }
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
        assert_eq!(normalize("127.0.0.1:7000", false), "http://127.0.0.1:7000");
        assert_eq!(normalize("127.0.0.1:7000", true), "https://127.0.0.1:7000");
        assert_eq!(normalize(" http://h:1 ", true), "http://h:1");
    }

    #[test]
    fn garbage_and_schemeless_addresses_are_invalid() {
        let none = ClientSecurity::none();
        let e = endpoint("http://bad host", &none).expect_err("space in host");
        assert!(e.to_string().starts_with("invalid address"), "{e}");
        let e = endpoint("ftp://h:1", &none).expect_err("not http");
        assert_eq!(e.cause, "expected a URL such as http://host:port");
        let e = endpoint("https://h:1", &none).expect_err("no CA");
        assert!(e.cause.contains("--tls-ca"), "{e}");
    }

    #[test]
    fn tls_mismatches_get_a_hint() {
        let hint = |a: &str, c: &str| explain(a, c).trim_start_matches(c).to_owned();
        assert!(hint("http://h:1", "connection closed before message completed").contains("use https://"));
        assert!(hint("http://h:1", "connection reset").contains("use https://"));
        assert!(hint("http://h:1", "Connection reset by peer (os error 104)").contains("use https://"));
        assert!(hint("https://h:1", "received corrupt message of type InvalidContentType").contains("does not speak TLS"));
        assert!(hint("https://h:1", "invalid peer certificate: UnknownIssuer").contains("--tls-ca"));
        assert!(hint("https://h:1", "received fatal alert: CertificateRequired").contains("--tls-cert"));
        assert!(hint("https://h:1", "received fatal alert: UnknownCA").contains("--tls-client-ca"));
        assert_eq!(hint("http://h:1", "Connection refused (os error 111)"), "");
        // rustls 0.23's words for the server's certificate, and a server's
        // alert about this client's (no client certificate loaded here).
        let expired = "invalid peer certificate: certificate expired: verification time 1800000000 (UNIX), but certificate is not valid after 1700000000 (100000000 seconds ago)";
        assert!(hint("https://h:1", expired).contains("server's certificate has expired"));
        let early = "invalid peer certificate: certificate not valid yet: verification time 1 (UNIX), but certificate is not valid before 2 (1 seconds in future)";
        assert!(hint("https://h:1", early).contains("server's certificate is not valid yet"));
        let name = "invalid peer certificate: certificate not valid for name \"db\"; certificate is only valid for localhost";
        assert!(hint("https://h:1", name).contains("does not name this host"));
        assert!(hint("https://h:1", "received fatal alert: CertificateExpired").contains("this client's certificate as expired"));
    }

    #[tokio::test]
    async fn nothing_listening_is_one_bounded_error() {
        let budget = Duration::from_millis(500);
        let started = std::time::Instant::now();
        let e = connect(&endpoint("http://127.0.0.1:1", &ClientSecurity::none()).expect("valid"), Instant::now() + budget)
            .await
            .expect_err("nothing listens on port 1");
        assert_eq!(e.address, "http://127.0.0.1:1");
        assert!(!e.cause.is_empty() && !e.cause.contains('\n'), "{e}");
        assert!(started.elapsed() < budget + CONNECT_TIMEOUT + Duration::from_secs(1));
    }
}
