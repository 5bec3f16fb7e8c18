//! Joining a trainer's ring: connect to its Unix socket, say hello, and
//! receive the attach message with the ring's memfd riding on it
//! (SCM_RIGHTS), and the trainer's eventfd when the ring has a doorbell.

use std::fs::File;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use bytes::BytesMut;
use loader_proto::pb::{RingAttach, RingHello, RingToTrainer, RingToWorker, ring_to_trainer, ring_to_worker};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;

use super::RingError;
use super::slots::adopt_received_fds;
use crate::frame::{decode, encode};

/// Bytes read per `recvmsg` during the handshake.
const CHUNK: usize = 4096;
/// Descriptors one `recvmsg` has room for: one or two are expected, the rest
/// are received only to be closed.
const MAX_FDS: usize = 4;

/// A trainer's ring, attached but not yet mapped.
#[derive(Debug)]
pub(crate) struct Attached {
    /// The connection, for grants in and reports out.
    pub(crate) stream: UnixStream,
    /// Session, job, consumer and geometry of the ring.
    pub(crate) attach: RingAttach,
    /// The ring's memfd.
    pub(crate) memfd: File,
    /// The trainer's eventfd, rung through the doorbell (see `bell`).
    pub(crate) eventfd: Option<OwnedFd>,
    /// Bytes that arrived after the attach message (early grants).
    pub(crate) rest: BytesMut,
}

/// Connects to `path`, sends `hello` and waits for the attach message and
/// its memfd. The caller bounds the time.
pub(crate) async fn join(path: &Path, hello: RingHello) -> Result<Attached, RingError> {
    let mut stream = UnixStream::connect(path).await.map_err(RingError::Connect)?;
    let hello = RingToTrainer { msg: Some(ring_to_trainer::Msg::Hello(hello)) };
    stream.write_all(&encode(&hello)).await?;

    let mut buf = BytesMut::with_capacity(CHUNK);
    let mut fds = Vec::new();
    let first = loop {
        if let Some(msg) = decode::<RingToWorker>(&mut buf)? {
            break msg;
        }
        if recv_with_fds(&stream, &mut buf, &mut fds).await? == 0 {
            return Err(RingError::ClosedBeforeAttach);
        }
    };
    let attach = match first.msg {
        Some(ring_to_worker::Msg::Attach(attach)) => attach,
        Some(ring_to_worker::Msg::Grant(_)) => {
            return Err(RingError::Protocol("a grant before the attach message".into()));
        }
        Some(ring_to_worker::Msg::Reclaim(_)) => {
            return Err(RingError::Protocol("a reclaim before the attach message".into()));
        }
        None => return Err(RingError::Protocol("an empty or unknown message instead of attach".into())),
    };
    let expected = if attach.doorbell { 2 } else { 1 };
    if fds.is_empty() {
        return Err(RingError::NoMemfd);
    }
    if fds.len() != expected {
        return Err(RingError::Protocol(format!(
            "attach carried {} file descriptors, expected {expected}",
            fds.len()
        )));
    }
    let eventfd = if attach.doorbell { fds.pop().map(checked_eventfd).transpose()? } else { None };
    let memfd = fds.pop().map(File::from).ok_or(RingError::NoMemfd)?;
    Ok(Attached { stream, attach, memfd, eventfd, rest: buf })
}

/// The doorbell's descriptor, if it is an eventfd: the worker writes eight
/// bytes to it now and then, which must not land in some other file.
fn checked_eventfd(fd: OwnedFd) -> Result<OwnedFd, RingError> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    if link.as_os_str() == "anon_inode:[eventfd]" {
        Ok(fd)
    } else {
        Err(RingError::Protocol(format!("the doorbell descriptor is {}, not an eventfd", link.display())))
    }
}

/// Reads what is available into `buf`, keeping any descriptors that came
/// with it. Returns the bytes read; 0 at end of stream.
async fn recv_with_fds(stream: &UnixStream, buf: &mut BytesMut, fds: &mut Vec<OwnedFd>) -> Result<usize, RingError> {
    let mut chunk = [0u8; CHUNK];
    let (n, received, truncated) = stream
        .async_io(Interest::READABLE, || {
            let mut iov = [IoSliceMut::new(&mut chunk)];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; MAX_FDS]);
            let msg = recvmsg::<()>(
                stream.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
            )?;
            let mut raw = Vec::new();
            for cmsg in msg.cmsgs()? {
                if let ControlMessageOwned::ScmRights(r) = cmsg {
                    raw.extend(r);
                }
            }
            // Owned at once, so every descriptor is closed on any error.
            let received = adopt_received_fds(raw);
            Ok((msg.bytes, received, msg.flags.contains(MsgFlags::MSG_CTRUNC)))
        })
        .await?;
    fds.extend(received);
    if truncated {
        return Err(RingError::Protocol("the trainer sent more file descriptors than expected".into()));
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}
