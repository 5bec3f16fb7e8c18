//! The worker's end of a trainer's ring socket, watched by the runtime for
//! reads only.
//!
//! Why not a `tokio::net::UnixStream`: it is registered for writability too
//! (edge-triggered), so every time the trainer reads a report and frees
//! buffer space, the kernel wakes this worker's runtime for nothing. That
//! wake-up is paid by the trainer (it is an interrupt to another CPU, sent
//! from inside its `recv`), once per batch: most of the wake-ups the
//! trainer performed. Reports are a few dozen bytes against a socket buffer
//! of hundreds of kilobytes, so they are written without waiting for
//! writability; a full buffer (a trainer that stopped reading) is retried
//! after a pause.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use bytes::BytesMut;
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, send};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Bytes read at a time: grants are a dozen bytes each.
const READ_CHUNK: usize = 4096;
/// Pause before writing again to a socket whose buffer was full.
const FULL_RETRY: Duration = Duration::from_millis(1);

/// A connected ring socket, non-blocking, registered for reads only.
#[derive(Debug)]
pub(crate) struct RingSocket {
    fd: AsyncFd<UnixStream>,
}

impl RingSocket {
    /// Takes `stream` off the runtime's books and registers it again for
    /// reads only. Call on the runtime.
    pub(crate) fn new(stream: tokio::net::UnixStream) -> io::Result<Self> {
        // Deregistered; the descriptor stays non-blocking.
        let stream = stream.into_std()?;
        // SAFETY: the `UnixStream` owns its descriptor and is owned by the
        // `AsyncFd`, so the descriptor stays open, and `as_raw_fd` returns
        // that same descriptor, for the whole life of the `AsyncFd`.
        let fd = unsafe { AsyncFd::register_with_interest(stream, Interest::READABLE) }?;
        Ok(Self { fd })
    }

    /// Waits for bytes and appends them to `buf`; 0 at the end of stream.
    pub(crate) async fn read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| {
                let mut stream: &UnixStream = fd.get_ref();
                stream.read(&mut chunk)
            }) {
                Ok(Ok(n)) => {
                    buf.extend_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                // Nothing to read after all: readiness was cleared; wait again.
                Err(_would_block) => {}
            }
        }
    }

    /// Writes all of `bytes`.
    pub(crate) async fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        let fd = self.fd.get_ref().as_raw_fd();
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        while !bytes.is_empty() {
            match send(fd, bytes, flags) {
                Ok(n) => bytes = &bytes[n..],
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => tokio::time::sleep(FULL_RETRY).await,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}
