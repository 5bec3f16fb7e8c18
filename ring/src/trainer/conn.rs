//! One worker's connection to the ring, as a task until it attaches: check
//! its credentials, read its hello, attach it (memfd over SCM_RIGHTS), then
//! hand its socket to the [`Inbox`], where the consumer reads its reports
//! and the book writes its grants.

use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use loader_proto::{ConsumerKey, PROTOCOL_VERSION};
use loader_proto::pb::{
    RingAttach, RingHello, RingToTrainer, RingToWorker, ring_to_trainer, ring_to_worker,
};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::inbox::{Inbox, Worker};
use super::peer::{PeerCreds, PeerPolicy, authorize};
use super::{RingError, SlotRing};
use crate::frame::{decode, encode};

/// How long a peer gets to say hello after connecting.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// What the connections need from the loader.
#[derive(Debug)]
pub struct ConnContext {
    /// The current session id, which the attach message carries; it
    /// changes when the session is reopened. An id, not the session: the
    /// ring sits below the session and needs nothing else of it.
    pub session_id: watch::Receiver<u64>,
    /// The job and consumer the attach message names.
    pub owner: ConsumerKey,
    /// Where attached workers' sockets go.
    pub inbox: Arc<Inbox>,
}

impl ConnContext {
    pub(super) fn with(self, ring: Arc<SlotRing>, policy: PeerPolicy) -> Served {
        Served {
            ctx: self,
            ring,
            policy,
        }
    }
}

/// Everything a connection task shares with the others.
#[derive(Debug)]
pub(super) struct Served {
    ctx: ConnContext,
    ring: Arc<SlotRing>,
    policy: PeerPolicy,
}

/// Serves one connection until it attached (or failed to); never panics on
/// peer input.
pub(super) async fn serve(served: Arc<Served>, mut stream: UnixStream) {
    let creds = match PeerCreds::of(&stream).and_then(|c| authorize(c, &served.policy).map(|()| c))
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("{e}");
            return;
        }
    };
    let mut buf = BytesMut::with_capacity(1024);
    let hello = match tokio::time::timeout(HELLO_TIMEOUT, read_hello(&mut stream, &mut buf)).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            tracing::warn!(
                pid = creds.pid,
                "closing a ring connection before attaching: {e}"
            );
            return;
        }
        Err(_) => {
            tracing::warn!(
                pid = creds.pid,
                "closing a ring connection: no hello within {HELLO_TIMEOUT:?}"
            );
            return;
        }
    };
    let address = if hello.address.is_empty() {
        "(no address)".to_owned()
    } else {
        hello.address.clone()
    };
    let worker = Worker {
        address,
        pid: creds.pid,
    };
    // Off the runtime from here: the consumer reads the socket itself.
    let adopted = match attach(&served, &stream).await {
        Ok(()) => stream
            .into_std()
            .map_err(RingError::from)
            .and_then(|socket| served.ctx.inbox.adopt(socket, buf, worker.clone())),
        Err(e) => Err(e),
    };
    match adopted {
        Ok(()) => {
            tracing::trace!(worker = %worker.address, worker_id = hello.worker_id, "ring connection handed to the consumer");
        }
        Err(e) => {
            tracing::warn!(worker = %worker.address, pid = worker.pid, "cannot attach a worker to the ring: {e}");
        }
    }
}

/// Reads until the first message, which must be a hello of our version.
async fn read_hello(stream: &mut UnixStream, buf: &mut BytesMut) -> Result<RingHello, RingError> {
    let first = loop {
        if let Some(msg) = decode::<RingToTrainer>(buf)? {
            break msg;
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(RingError::Protocol(
                "the peer closed the socket before saying hello".into(),
            ));
        }
    };
    match first.msg {
        Some(ring_to_trainer::Msg::Hello(h)) if h.protocol_version == PROTOCOL_VERSION => Ok(h),
        Some(ring_to_trainer::Msg::Hello(h)) => Err(RingError::Protocol(format!(
            "the worker speaks protocol version {}, this trainer speaks {PROTOCOL_VERSION}",
            h.protocol_version
        ))),
        _ => Err(RingError::Protocol(
            "the first message is not a hello".into(),
        )),
    }
}

/// Sends the attach message with the memfd and the consumer's eventfd (the
/// doorbell the worker rings) riding on its first byte.
async fn attach(served: &Served, stream: &UnixStream) -> Result<(), RingError> {
    let g = served.ring.memory.geometry();
    let attach = RingAttach {
        session_id: *served.ctx.session_id.borrow(),
        job_id: served.ctx.owner.0,
        consumer: served.ctx.owner.1,
        slot_size: g.slot_size,
        slot_count: g.slot_count,
        doorbell: true,
    };
    let bytes = encode(&RingToWorker {
        msg: Some(ring_to_worker::Msg::Attach(attach)),
    });
    let fds = [
        served.ring.memory.fd().as_raw_fd(),
        served.ctx.inbox.bell_fd().as_raw_fd(),
    ];
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            let cmsgs = [ControlMessage::ScmRights(&fds)];
            let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
            Ok(sendmsg::<()>(
                stream.as_raw_fd(),
                &[IoSlice::new(&bytes)],
                &cmsgs,
                flags,
                None,
            )?)
        })
        .await?;
    // The descriptor went with the first byte; the rest is plain data.
    let mut rest = &bytes[sent..];
    while !rest.is_empty() {
        stream.writable().await?;
        match stream.try_write(rest) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
