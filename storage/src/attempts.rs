//! The attempts of a store's requests that its client retries, counted.
//!
//! object_store retries a failing request inside the request itself, out
//! of sight of the code that made it: `meters` sees one request, however
//! many attempts it took. Every attempt goes through the HTTP client the
//! store's builder was given, so [`CountingConnector`] (installed by
//! `stores::build`) wraps object_store's own reqwest client, passes each
//! attempt on unchanged, and counts those that failed in a way the client
//! retries ([`retried`]) as `loader_storage_retries_total` and
//! [`StorageTotals::retries`](crate::StorageTotals::retries).
//!
//! The count is of failed attempts, not of retries made: an attempt that
//! fails when the retry time (or count) is spent, which ends the request
//! with an error, counts too, since no attempt can know it is the last.
//! The connector also carries the client's credential requests (the
//! instance metadata service, ECS task credentials, web identity's STS
//! call): their failed attempts count with the reads'.

use object_store::ClientOptions;
use object_store::client::{HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService, ReqwestConnector};

use crate::meters::RetryReason;

/// Why object_store (=0.14.2) retries an attempt at a `method` request
/// that ended in `outcome` (the status answered, or the kind of transport
/// error), or None when it does not: the rule of `RetryableRequest::send`
/// in its `src/client/retry.rs`, which this mirrors, so it must be read
/// again when object_store is upgraded.
///
/// - a status: retried if a server error (5xx), 429 Too Many Requests or
///   408 Request Timeout. (A 409 retried for a conditional write, and a
///   200 whose body holds an S3 error, retried for a multipart upload's
///   completion, are writes', which no store here makes.)
/// - a transport error: retried if of kind `Connect` or `Request` (the
///   request was not sent); `Timeout` or `Interrupted` only for an
///   idempotent request, which object_store takes a safe method (GET,
///   HEAD) to be unless the request says otherwise. Two credential
///   requests say so (the metadata service's token `PUT`, web identity's
///   STS `POST`): theirs are retried, and not counted here, on a timeout.
fn retried(method: &http::Method, outcome: Result<http::StatusCode, HttpErrorKind>) -> Option<RetryReason> {
    use http::StatusCode;
    match outcome {
        Ok(status) => (status.is_server_error()
            || status == StatusCode::TOO_MANY_REQUESTS
            || status == StatusCode::REQUEST_TIMEOUT)
            .then_some(RetryReason::Status),
        Err(HttpErrorKind::Connect | HttpErrorKind::Request) => Some(RetryReason::Transport),
        Err(HttpErrorKind::Timeout | HttpErrorKind::Interrupted) => method.is_safe().then_some(RetryReason::Transport),
        Err(_) => None,
    }
}

/// Makes the store's clients: object_store's own ([`ReqwestConnector`]),
/// each wrapped in a [`CountingClient`].
#[derive(Debug, Default)]
pub(crate) struct CountingConnector {
    /// What makes the client that sends the requests.
    inner: ReqwestConnector,
}

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(CountingClient { inner: self.inner.connect(options)? }))
    }
}

/// An HTTP client that sends each attempt through `inner` and counts the
/// failed ones the store's client will retry.
#[derive(Debug)]
struct CountingClient {
    /// object_store's reqwest client, configured from the store's options.
    inner: HttpClient,
}

#[async_trait::async_trait]
impl HttpService for CountingClient {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let method = req.method().clone();
        let answer = self.inner.execute(req).await;
        let outcome = answer.as_ref().map(|r| r.status()).map_err(|e| e.kind());
        if let Some(reason) = retried(&method, outcome) {
            crate::meters::retry(reason);
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Duration;

    use http::{Method, StatusCode};
    use object_store::aws::AmazonS3Builder;
    use object_store::path::Path;
    use object_store::{BackoffConfig, ObjectStoreExt, RetryConfig};

    use super::*;

    /// What object_store retries (its retry.rs), and nothing else.
    #[test]
    fn attempts_count_when_the_client_retries_them() {
        let status = |code: u16| Ok(StatusCode::from_u16(code).expect("a status"));
        for code in [500, 502, 503, 504, 429, 408] {
            assert_eq!(retried(&Method::GET, status(code)), Some(RetryReason::Status), "{code}");
        }
        for code in [200, 206, 304, 307, 400, 401, 403, 404, 409, 412, 416] {
            assert_eq!(retried(&Method::GET, status(code)), None, "{code}");
        }
        for kind in [HttpErrorKind::Connect, HttpErrorKind::Request] {
            assert_eq!(retried(&Method::GET, Err(kind)), Some(RetryReason::Transport), "{kind:?}");
            assert_eq!(retried(&Method::POST, Err(kind)), Some(RetryReason::Transport), "{kind:?}: not sent");
        }
        for kind in [HttpErrorKind::Timeout, HttpErrorKind::Interrupted] {
            assert_eq!(retried(&Method::GET, Err(kind)), Some(RetryReason::Transport), "{kind:?}");
            assert_eq!(retried(&Method::HEAD, Err(kind)), Some(RetryReason::Transport), "{kind:?}");
            assert_eq!(retried(&Method::POST, Err(kind)), None, "{kind:?}: maybe done, not retried");
        }
        for kind in [HttpErrorKind::Decode, HttpErrorKind::Unknown] {
            assert_eq!(retried(&Method::GET, Err(kind)), None, "{kind:?}");
        }
        assert_eq!((RetryReason::Status.label(), RetryReason::Transport.label()), ("status", "transport"));
    }

    /// A store that answers `answers`, one per request, on `listener`;
    /// each answer is a bare status line, no body.
    fn answer(listener: TcpListener, answers: Vec<u16>) {
        let mut answers = answers.into_iter();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            // A HEAD or GET carries no body: a request ends at its blank line.
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while stream.read(&mut byte).is_ok_and(|n| n == 1) {
                request.push(byte[0]);
                if !request.ends_with(b"\r\n\r\n") {
                    continue;
                }
                request.clear();
                let Some(code) = answers.next() else { return };
                let reply = format!("HTTP/1.1 {code} Whatever\r\ncontent-length: 0\r\n\r\n");
                if stream.write_all(reply.as_bytes()).is_err() {
                    break;
                }
            }
        }
    }

    /// Through object_store's own retry loop: two 503s, retried, count two;
    /// the 404 that ends the request is not retried, and not counted.
    #[tokio::test]
    async fn the_connector_counts_the_attempts_the_store_retried() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("address"));
        std::thread::spawn(move || answer(listener, vec![503, 503, 404]));
        let backoff = BackoffConfig { init_backoff: Duration::from_millis(1), max_backoff: Duration::from_millis(5), base: 2.0 };
        let store = AmazonS3Builder::new()
            .with_endpoint(&endpoint)
            .with_allow_http(true)
            .with_bucket_name("b")
            .with_region("us-east-1")
            .with_access_key_id("key")
            .with_secret_access_key("secret")
            .with_retry(RetryConfig { backoff, max_retries: 5, retry_timeout: Duration::from_secs(10) })
            .with_http_connector(CountingConnector::default())
            .build()
            .expect("a store");
        let before = crate::totals().retries;
        let e = store.head(&Path::from("k")).await.expect_err("404");
        assert!(matches!(e, object_store::Error::NotFound { .. }), "{e}");
        let counted = crate::totals().retries - before;
        // Other tests of this process count no retries: none talks to a store.
        assert_eq!(counted, 2, "{e}");
    }
}
