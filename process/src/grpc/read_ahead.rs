//! A TCP connection read through a large buffer, under TLS.
//!
//! rustls asks its transport for at most 4 KiB at a time (its deframer
//! grows by `READ_SIZE = 4096`), so without this a 10 MB batch over TLS is
//! ~2,400 `recv` calls, each one a trip into the kernel that also sends a
//! window-update ACK from the receive path. Profiled on a trainer reading
//! batches over TLS, that per-call work cost about as much CPU as the
//! decryption itself. Through this buffer the kernel hands over whatever
//! has arrived, up to [`CLIENT_READ_AHEAD`] bytes a call, and rustls's
//! small reads become copies of memory that is still in cache. Writes pass straight
//! through: rustls already writes whole records, vectored.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Bytes one `recv` may bring in on a channel's connection, which is where
/// batches arrive (a trainer reading from workers). About what the kernel
/// has waiting while a batch streams: a plaintext connection, read straight
/// into hyper's buffer, takes a few hundred KB a call. Against 64 KiB, a
/// trainer uses less CPU per batch over TLS (docs/benchmarks.md, TLS
/// section); a process holds one per channel.
pub(crate) const CLIENT_READ_AHEAD: usize = 1 << 20;
/// The same on a server's accepted connections, which carry requests,
/// credits and window updates: small, and a coordinator has one per worker
/// and trainer, so the buffer stays small too.
pub(crate) const SERVER_READ_AHEAD: usize = 64 << 10;

/// A TCP connection whose reads go through a buffer.
#[derive(Debug)]
pub(crate) struct ReadAhead {
    /// The connection; tokio's `BufReader` passes writes through.
    inner: BufReader<TcpStream>,
}

impl ReadAhead {
    /// Buffers `tcp`'s reads, `capacity` bytes at a time.
    pub(crate) fn new(tcp: TcpStream, capacity: usize) -> Self {
        Self { inner: BufReader::with_capacity(capacity, tcp) }
    }
}

impl AsyncRead for ReadAhead {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ReadAhead {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The server's view of who connected, as for a plain `TcpStream` (tonic
/// wraps it in `TlsConnectInfo` with the client's certificates).
impl Connected for ReadAhead {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.inner.get_ref().connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// Small reads are served from one large `recv`, and every byte comes
    /// through in order, both ways.
    #[tokio::test]
    async fn small_reads_see_every_byte_in_order() {
        // Loopback only: a hang is a failure, not a wait.
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let sent: Vec<u8> = (0..3 * SERVER_READ_AHEAD + 17).map(|i| (i * 7 % 251) as u8).collect();
            let to_send = sent.clone();
            let peer = tokio::spawn(async move {
                let (mut tcp, _) = listener.accept().await.expect("accept");
                tcp.write_all(&to_send).await.expect("write");
                let mut reply = [0u8; 5];
                tcp.read_exact(&mut reply).await.expect("reply");
                reply
            });
            let mut conn = ReadAhead::new(TcpStream::connect(addr).await.expect("connect"), SERVER_READ_AHEAD);
            let info = conn.connect_info();
            assert_eq!(info.remote_addr, Some(addr));
            let mut got = Vec::with_capacity(sent.len());
            let mut chunk = [0u8; 4096];
            while got.len() < sent.len() {
                let n = conn.read(&mut chunk).await.expect("read");
                assert!(n > 0, "early EOF after {} bytes", got.len());
                got.extend_from_slice(&chunk[..n]);
            }
            assert!(got == sent, "bytes differ");
            conn.write_all(b"done!").await.expect("write through");
            conn.flush().await.expect("flush");
            assert_eq!(&peer.await.expect("peer"), b"done!");
        })
        .await
        .expect("finished within 20 s");
    }
}
