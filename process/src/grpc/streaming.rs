//! Streaming calls whose responses are read from the HTTP/2 chunks that
//! carried them, without tonic's copy.
//!
//! tonic's `Streaming` appends every DATA chunk to a buffer of its own
//! before decoding (and copies again whenever that buffer grows): every
//! byte of a batch was copied once more in user space than the socket read
//! copied it (the measured share of a trainer's CPU: docs/benchmarks.md,
//! "Receiving over gRPC").
//! Here a message that lies within one chunk is a slice of it, and one that
//! spans chunks is copied once, into a buffer of its exact size; a prost
//! `bytes::Bytes` field of it is then a slice too. Requests are small and
//! are sent as tonic sends them (uncompressed, length-prefixed).
//!
//! Statuses follow tonic's client: a trailers-only answer, then the
//! trailers' `grpc-status`, then the HTTP status.

use std::pin::Pin;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http::HeaderValue;
use http::header::{CONTENT_TYPE, TE};
use http_body::{Body as _, Frame};
use tonic::Status;
use tonic::body::Body;

use super::Channel;

/// gRPC's message prefix: a compressed flag and a big-endian length.
const PREFIX: usize = 5;
/// The most memory a message spanning chunks gets before its bytes arrive;
/// a longer one grows as they do, so a peer's length prefix alone never
/// reserves gigabytes.
const UPFRONT: usize = 64 << 20;

/// Opens the streaming call `path` (`/package.Service/Method`) on
/// `channel`, sending `requests` as they come.
pub async fn call<Req, S>(channel: &Channel, path: &'static str, requests: S) -> Result<Messages, Status>
where
    Req: prost::Message + 'static,
    S: Stream<Item = Req> + Send + 'static,
{
    let frames = requests.map(|r| Ok::<_, Status>(Frame::data(encode(&r))));
    let mut request = http::Request::new(Body::new(http_body_util::StreamBody::new(frames)));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = http::Uri::from_static(path);
    *request.version_mut() = http::Version::HTTP_2;
    request.headers_mut().insert(TE, HeaderValue::from_static("trailers"));
    request.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let response = tower::ServiceExt::oneshot(channel.clone(), request)
        .await
        .map_err(|e| Status::from_error(Box::new(e)))?;
    // Trailers-only: the call ended before any message, with this status.
    let ended = match Status::from_header_map(response.headers()) {
        Some(status) if status.code() != tonic::Code::Ok => return Err(status),
        Some(_) => true,
        None => false,
    };
    let http_status = response.status();
    Ok(Messages { body: response.into_body(), http_status, splitter: Splitter::default(), ended })
}

/// One request message, length-prefixed.
fn encode(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(PREFIX + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // Cannot fail: the buffer was sized for the message.
    let _ = message.encode(&mut buf);
    buf.freeze()
}

/// The responses of a call opened by [`call`].
#[derive(Debug)]
pub struct Messages {
    body: Body,
    http_status: http::StatusCode,
    splitter: Splitter,
    ended: bool,
}

impl Messages {
    /// The next response, or `None` once the call ended with status OK.
    pub async fn message<M: prost::Message + Default>(&mut self) -> Result<Option<M>, Status> {
        let Some(bytes) = self.next_bytes().await? else {
            return Ok(None);
        };
        M::decode(bytes).map(Some).map_err(|e| Status::internal(format!("malformed message: {e}")))
    }

    async fn next_bytes(&mut self) -> Result<Option<Bytes>, Status> {
        loop {
            if let Some(message) = self.splitter.next()? {
                return Ok(Some(message));
            }
            if self.ended {
                return Ok(None);
            }
            let frame = std::future::poll_fn(|cx| Pin::new(&mut self.body).poll_frame(cx)).await;
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.splitter.push(data),
                    Err(frame) => return self.end(frame.into_trailers().ok()),
                },
                Some(Err(status)) => return Err(status),
                None => return self.end(None),
            }
        }
    }

    /// The call's end: OK, or the status its trailers (else its HTTP
    /// status) carry.
    fn end(&mut self, trailers: Option<http::HeaderMap>) -> Result<Option<Bytes>, Status> {
        self.ended = true;
        if self.splitter.mid_message() {
            return Err(Status::internal("the stream ended in the middle of a message"));
        }
        match trailers.as_ref().and_then(Status::from_header_map) {
            Some(status) if status.code() == tonic::Code::Ok => Ok(None),
            Some(status) => Err(status),
            None if self.http_status == http::StatusCode::OK => {
                Err(Status::unknown("the stream ended without a grpc-status (cut off on the way?)"))
            }
            None => Err(Status::unknown(format!("the call failed with HTTP status {}", self.http_status))),
        }
    }
}

/// Cuts a response's DATA chunks into messages.
#[derive(Debug, Default)]
struct Splitter {
    /// The unread part of the last chunk pushed.
    chunk: Bytes,
    /// The next message's prefix, as far as it has arrived.
    prefix: [u8; PREFIX],
    prefix_len: usize,
    /// A message that spans chunks, with its full length.
    partial: Option<(BytesMut, usize)>,
}

impl Splitter {
    /// Takes the next chunk; call once [`Splitter::next`] returned `None`.
    fn push(&mut self, chunk: Bytes) {
        debug_assert!(self.chunk.is_empty(), "a chunk was pushed before the last one was used up");
        self.chunk = chunk;
    }

    /// The next whole message, or `None` when another chunk is needed.
    fn next(&mut self) -> Result<Option<Bytes>, Status> {
        loop {
            if let Some((buf, len)) = &mut self.partial {
                let take = (*len - buf.len()).min(self.chunk.len());
                buf.put_slice(&self.chunk[..take]);
                self.chunk.advance(take);
                if buf.len() < *len {
                    return Ok(None);
                }
                return Ok(self.partial.take().map(|(buf, _)| buf.freeze()));
            }
            let take = (PREFIX - self.prefix_len).min(self.chunk.len());
            self.prefix[self.prefix_len..][..take].copy_from_slice(&self.chunk[..take]);
            self.chunk.advance(take);
            self.prefix_len += take;
            if self.prefix_len < PREFIX {
                return Ok(None);
            }
            self.prefix_len = 0;
            let [flag, l0, l1, l2, l3] = self.prefix;
            if flag != 0 {
                return Err(Status::internal(format!(
                    "a message with compressed flag {flag}: this call accepts no compression"
                )));
            }
            let len = u32::from_be_bytes([l0, l1, l2, l3]) as usize;
            if self.chunk.len() >= len {
                // Within the chunk: a slice of it, no copy.
                return Ok(Some(self.chunk.split_to(len)));
            }
            self.partial = Some((BytesMut::with_capacity(len.min(UPFRONT)), len));
        }
    }

    /// Whether part of a message has arrived and not the rest.
    fn mid_message(&self) -> bool {
        self.prefix_len > 0 || self.partial.is_some() || !self.chunk.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn framed(messages: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            out.push(0);
            out.extend_from_slice(&(m.len() as u32).to_be_bytes());
            out.extend_from_slice(m);
        }
        out
    }

    /// Every message back, whatever the chunking, and nothing left over.
    fn split(stream: &[u8], cuts: &[usize]) -> Result<Vec<Bytes>, Status> {
        let mut s = Splitter::default();
        let mut out = Vec::new();
        let mut at = 0;
        let mut ends: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
        ends.push(stream.len());
        ends.sort_unstable();
        for end in ends {
            s.push(Bytes::copy_from_slice(&stream[at..end]));
            at = end;
            while let Some(m) = s.next()? {
                out.push(m);
            }
        }
        assert!(!s.mid_message(), "bytes left over");
        Ok(out)
    }

    proptest! {
        #[test]
        fn any_chunking_gives_back_the_messages(
            messages in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..8),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
        ) {
            let stream = framed(&messages);
            let got = split(&stream, &cuts).expect("well-formed");
            prop_assert_eq!(got.iter().map(|b| b.to_vec()).collect::<Vec<_>>(), messages);
        }
    }

    #[test]
    fn a_message_within_one_chunk_is_a_slice_of_it() {
        let chunk = Bytes::from(framed(&[vec![7; 1000], vec![8; 10]]));
        let mut s = Splitter::default();
        s.push(chunk.clone());
        let first = s.next().expect("ok").expect("whole");
        assert_eq!(first.as_ptr(), chunk[PREFIX..].as_ptr(), "no copy");
        let second = s.next().expect("ok").expect("whole");
        assert_eq!(&second[..], &[8; 10]);
        assert!(s.next().expect("ok").is_none());
        assert!(!s.mid_message());
    }

    /// A message as a worker would send one: a `bytes` field.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Probe {
        #[prost(bytes = "bytes", tag = "1")]
        data: Bytes,
    }

    /// The responses of a call whose body brings `frames`.
    fn messages(frames: Vec<Frame<Bytes>>) -> Messages {
        let body = http_body_util::StreamBody::new(futures::stream::iter(frames.into_iter().map(Ok::<_, Status>)));
        Messages { body: Body::new(body), http_status: http::StatusCode::OK, splitter: Splitter::default(), ended: false }
    }

    fn trailers(code: i32, message: &str) -> Frame<Bytes> {
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", code.to_string().parse().expect("header"));
        t.insert("grpc-message", message.parse().expect("header"));
        Frame::trailers(t)
    }

    #[tokio::test]
    async fn messages_then_the_trailers_status_end_the_call() {
        let probe = Probe { data: Bytes::from_static(b"batch") };
        let one = Bytes::from(framed(&[prost::Message::encode_to_vec(&probe)]));
        let mut m = messages(vec![Frame::data(one.clone()), trailers(0, "")]);
        assert_eq!(m.message::<Probe>().await.expect("ok"), Some(probe.clone()));
        assert_eq!(m.message::<Probe>().await.expect("ok"), None);

        let mut m = messages(vec![Frame::data(one), trailers(16, "bad token")]);
        assert!(m.message::<Probe>().await.expect("ok").is_some());
        let e = m.message::<Probe>().await.expect_err("the status");
        assert_eq!((e.code(), e.message()), (tonic::Code::Unauthenticated, "bad token"));
    }

    #[tokio::test]
    async fn a_malformed_a_cut_or_an_unfinished_call_is_one_line_error() {
        // Field 1 says 100 bytes follow; 2 do.
        let garbage = Bytes::from(framed(&[vec![0x0a, 100, 1, 2]]));
        let e = messages(vec![Frame::data(garbage), trailers(0, "")]).message::<Probe>().await.expect_err("malformed");
        assert_eq!(e.code(), tonic::Code::Internal);
        assert!(e.message().starts_with("malformed message") && !e.message().contains('\n'), "{e}");

        let cut = Bytes::from(framed(&[vec![7; 10]])).slice(..8);
        let e = messages(vec![Frame::data(cut), trailers(0, "")]).message::<Probe>().await.expect_err("cut");
        assert_eq!(e.code(), tonic::Code::Internal);
        assert!(e.message().contains("middle of a message"), "{e}");

        let e = messages(Vec::new()).message::<Probe>().await.expect_err("no status");
        assert_eq!(e.code(), tonic::Code::Unknown);
        assert!(e.message().contains("without a grpc-status"), "{e}");
    }

    #[test]
    fn a_compressed_message_is_refused_in_one_line() {
        let mut stream = framed(&[vec![1, 2, 3]]);
        stream[0] = 1;
        let e = split(&stream, &[]).expect_err("compressed");
        assert_eq!(e.code(), tonic::Code::Internal);
        assert!(e.message().contains("compressed") && !e.message().contains('\n'), "{e}");
    }

    #[test]
    fn a_cut_message_is_mid_message_and_a_huge_prefix_reserves_little() {
        let mut s = Splitter::default();
        s.push(Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff, 1, 2]));
        assert!(s.next().expect("ok").is_none());
        assert!(s.mid_message());
        let (buf, len) = s.partial.as_ref().expect("partial");
        assert_eq!(*len, u32::MAX as usize);
        assert!(buf.capacity() <= UPFRONT);
        let mut s = Splitter::default();
        s.push(Bytes::from_static(&[0, 0]));
        assert!(s.next().expect("ok").is_none());
        assert!(s.mid_message(), "half a prefix");
    }
}
