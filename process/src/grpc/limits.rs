//! Limits every server applies, as tower layers: a deadline on each call,
//! a cap on the size of each request message, and a rate limit on admin
//! calls. (Concurrent calls per connection are capped by tonic's own
//! per-connection limit, set in [`super::server`].)
//!
//! Each refusal is an ordinary gRPC status, so a client sees one line
//! saying which limit it hit.

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt as _};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http_body::Frame;
use tonic::Status;
use tonic::body::Body;
use tower::{Layer, Service};

use super::access::Policy;
use crate::security::Role;

/// Longest a call may take until its response starts (for a stream: until
/// the stream is open). The longest legitimate one, a worker's long-polled
/// heartbeat, waits at most a lease interval.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request message a server decodes: the protocol's
/// (`loader_proto::MAX_REQUEST_MESSAGE`), which a spec file is also held to.
pub use loader_proto::MAX_REQUEST_MESSAGE;
/// Admin calls per second a server answers (with bursts of as many):
/// enough for `loaderctl top` and scripts polling status, not for a
/// runaway loop to crowd out the workers' and trainers' calls.
pub const ADMIN_CALLS_PER_SECOND: u32 = 200;
/// Calls in progress on one connection, and HTTP/2 streams open on it.
pub const CALLS_PER_CONNECTION: usize = 256;

type Respond = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

fn refuse(status: Status) -> Respond {
    let response = status.into_http();
    async move { Ok(response) }.boxed()
}

/// Fails calls whose response has not started within `limit` with
/// DEADLINE_EXCEEDED.
#[derive(Debug, Clone, Copy)]
pub struct TimeoutLayer(pub Duration);

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;
    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout { inner, limit: self.0 }
    }
}

/// The service [`TimeoutLayer`] makes.
#[derive(Debug, Clone)]
pub struct Timeout<S> {
    inner: S,
    limit: Duration,
}

impl<S> Service<http::Request<Body>> for Timeout<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Respond;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Respond {
        let limit = self.limit;
        let call = self.inner.call(req);
        async move {
            match tokio::time::timeout(limit, call).await {
                Ok(answered) => answered,
                Err(_) => Ok(Status::deadline_exceeded(format!("no answer within {}s", limit.as_secs())).into_http()),
            }
        }
        .boxed()
    }
}

/// Rate-limits the calls to services of the admin role (one budget per
/// server, shared by all connections); others pass untouched.
#[derive(Debug, Clone)]
pub struct AdminRateLimitLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
    policy: Arc<Policy>,
    per_second: u32,
}

impl AdminRateLimitLayer {
    /// At most `per_second` admin calls a second, in bursts of as many.
    pub fn new(per_second: NonZeroU32, policy: Arc<Policy>) -> Self {
        Self { limiter: Arc::new(RateLimiter::direct(Quota::per_second(per_second))), policy, per_second: per_second.get() }
    }
}

impl<S> Layer<S> for AdminRateLimitLayer {
    type Service = AdminRateLimit<S>;
    fn layer(&self, inner: S) -> AdminRateLimit<S> {
        AdminRateLimit { inner, layer: self.clone() }
    }
}

/// The service [`AdminRateLimitLayer`] makes.
#[derive(Debug, Clone)]
pub struct AdminRateLimit<S> {
    inner: S,
    layer: AdminRateLimitLayer,
}

impl<S> Service<http::Request<Body>> for AdminRateLimit<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Respond;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Respond {
        let admin = self.layer.policy.of_path(req.uri().path()).role() == Some(Role::Admin);
        if admin && self.layer.limiter.check().is_err() {
            return refuse(Status::resource_exhausted(format!(
                "admin calls are limited to {} a second on this server; slow down",
                self.layer.per_second
            )));
        }
        self.inner.call(req).boxed()
    }
}

/// Refuses a request carrying a gRPC message larger than the limit, with
/// RESOURCE_EXHAUSTED, as soon as its length prefix arrives (before the
/// message is buffered).
#[derive(Debug, Clone, Copy)]
pub struct MessageSizeLayer(pub u32);

impl<S> Layer<S> for MessageSizeLayer {
    type Service = MessageSize<S>;
    fn layer(&self, inner: S) -> MessageSize<S> {
        MessageSize { inner, limit: self.0 }
    }
}

/// The service [`MessageSizeLayer`] makes.
#[derive(Debug, Clone)]
pub struct MessageSize<S> {
    inner: S,
    limit: u32,
}

impl<S> Service<http::Request<Body>> for MessageSize<S>
where
    S: Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> S::Future {
        let limit = self.limit;
        self.inner.call(req.map(|body| Body::new(Framed { inner: body, limit, prefix: Prefix::default() })))
    }
}

/// Where a request body is in its gRPC framing: each message is a 1-byte
/// flag and a 4-byte big-endian length, then that many bytes.
#[derive(Debug, Default)]
struct Prefix {
    /// Prefix bytes seen of the next message.
    bytes: [u8; 5],
    /// How many of `bytes` are filled.
    have: usize,
    /// Message bytes still to pass before the next prefix.
    skip: u64,
}

impl Prefix {
    /// Walks `data`; the length of the first message over `limit`, if any.
    fn scan(&mut self, mut data: &[u8], limit: u32) -> Option<u32> {
        while !data.is_empty() {
            if self.skip > 0 {
                let n = data.len().min(usize::try_from(self.skip).unwrap_or(usize::MAX));
                self.skip -= n as u64;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.have).min(data.len());
            self.bytes[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == 5 {
                self.have = 0;
                let len = u32::from_be_bytes([self.bytes[1], self.bytes[2], self.bytes[3], self.bytes[4]]);
                if len > limit {
                    return Some(len);
                }
                self.skip = u64::from(len);
            }
        }
        None
    }
}

/// A request body checked message by message.
struct Framed {
    inner: Body,
    limit: u32,
    prefix: Prefix,
}

impl http_body::Body for Framed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Some(len) = this.prefix.scan(data, this.limit)
                {
                    return Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                        "request message of {len} bytes is over this server's limit of {} bytes",
                        this.limit
                    )))));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: u32) -> Vec<u8> {
        let mut m = vec![0];
        m.extend_from_slice(&len.to_be_bytes());
        m.extend(std::iter::repeat_n(7, len as usize));
        m
    }

    #[test]
    fn prefixes_are_found_across_any_split() {
        let mut body = message(10);
        body.extend(message(3));
        body.extend(message(100));
        for split in 0..body.len() {
            let mut p = Prefix::default();
            let (a, b) = body.split_at(split);
            assert_eq!(p.scan(a, 100).or_else(|| p.scan(b, 100)), None, "split at {split}");
            let mut p = Prefix::default();
            assert_eq!(p.scan(a, 99).or_else(|| p.scan(b, 99)), Some(100), "split at {split}");
        }
    }

    #[test]
    fn byte_by_byte_is_the_same() {
        let mut body = message(5);
        body.extend(message(6));
        let mut p = Prefix::default();
        // The first message (5 bytes) passes; the second's length is known
        // at its prefix's last byte (index 10 + 4), before its payload.
        let found = body.iter().enumerate().find_map(|(i, b)| p.scan(std::slice::from_ref(b), 5).map(|len| (i, len)));
        assert_eq!(found, Some((14, 6)));
    }
}
