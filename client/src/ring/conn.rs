//! One worker's connection to the ring, as a task: check its credentials,
//! read its hello, attach it (memfd over SCM_RIGHTS), then carry grants out
//! and reports in until either side goes away.
//!
//! Every report is checked by the book before it becomes a view; every view
//! is parsed and checked like a gRPC frame (`Batch::from_slot`, one path)
//! before it reaches the consumer. A worker that breaks the protocol ends
//! the session with an error naming it: a lying worker is a bug, not a
//! hiccup.

use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use loader_proto::PROTOCOL_VERSION;
use loader_proto::pb::{
    RingAttach, RingHello, RingToTrainer, RingToWorker, ring_to_trainer, ring_to_worker,
};
use loader_proto::ring::{decode, encode};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::sync::mpsc::unbounded_channel;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::book::{ConnId, SlotCredit};
use super::peer::{PeerCreds, PeerPolicy, authorize};
use super::{Disconnect, RingError, SlotRing, SlotView};
use crate::batch::{Batch, Expected};
use crate::error::LoaderError;
use crate::event::{Credit, Event, EventTx};
use crate::session::Session;

/// How long a peer gets to say hello after connecting.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// What the connections need from the loader.
#[derive(Debug)]
pub(crate) struct ConnContext {
    /// For the current session id, which the attach message carries.
    pub(crate) session: Arc<Session>,
    /// Identity checks for every batch, as on gRPC.
    pub(crate) expected: Expected,
    /// Where batches and fatal errors go.
    pub(crate) events: EventTx,
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
pub(crate) struct Served {
    ctx: ConnContext,
    ring: Arc<SlotRing>,
    policy: PeerPolicy,
}

/// A worker that attached: what errors and logs call it.
#[derive(Debug, Clone)]
struct Worker {
    /// Its gRPC address, from the hello.
    address: String,
    /// Its pid, from SO_PEERCRED.
    pid: i32,
}

/// How an attached connection ended.
enum End {
    /// The worker closed its socket (stopping, or dead).
    PeerClosed,
    /// The loader stopped.
    Stopped,
    /// The consumer is gone.
    ConsumerGone,
}

/// Serves one connection until it ends; never panics on peer input.
pub(crate) async fn serve(served: Arc<Served>, mut stream: UnixStream, stop: CancellationToken) {
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
    if let Err(e) = attach(&served, &stream).await {
        tracing::warn!(worker = %worker.address, pid = worker.pid, "cannot attach a worker to the ring: {e}");
        return;
    }
    let (tx, mut grants) = unbounded_channel();
    let id = served.ring.book.open(tx);
    tracing::debug!(worker = %worker.address, pid = worker.pid, worker_id = hello.worker_id, "worker attached to the ring");

    let (mut reader, mut writer) = stream.into_split();
    let outcome: Result<End, LoaderError> = async {
        loop {
            while let Some(msg) = decode::<RingToTrainer>(&mut buf).map_err(|e| bad(&worker, e.to_string()))? {
                if !on_report(&served, id, &worker, msg)? {
                    return Ok(End::ConsumerGone);
                }
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(End::Stopped),
                read = reader.read_buf(&mut buf) => {
                    // A reset is a worker that died, like an orderly close.
                    if read.unwrap_or(0) == 0 {
                        return Ok(End::PeerClosed);
                    }
                }
                Some(grant) = grants.recv() => {
                    tracing::trace!(worker = %worker.address, slot = grant.slot, generation = grant.generation, "grant");
                    let msg = RingToWorker { msg: Some(ring_to_worker::Msg::Grant(grant)) };
                    if writer.write_all(&encode(&msg)).await.is_err() {
                        return Ok(End::PeerClosed);
                    }
                }
            }
        }
    }
    .await;
    // Its granted slots are free again: nothing writes them any more.
    let outstanding = served.ring.book.close(id);
    match outcome {
        Ok(End::PeerClosed) => {
            tracing::info!(
                worker = %worker.address,
                pid = worker.pid,
                grants = outstanding,
                "worker left the shared-memory ring"
            );
            served.ring.record_disconnect(Disconnect {
                address: worker.address,
                pid: worker.pid,
                at: Instant::now(),
            });
        }
        Ok(End::Stopped | End::ConsumerGone) => {}
        Err(e) => {
            tracing::warn!(pid = worker.pid, "closing the ring connection: {e}");
            let _ = served.ctx.events.send(Event::Fatal(e));
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

/// Sends the attach message with the memfd riding on its first byte.
async fn attach(served: &Served, stream: &UnixStream) -> Result<(), RingError> {
    let g = served.ring.memory.geometry();
    let attach = RingAttach {
        session_id: served.ctx.session.id(),
        job_id: served.ctx.expected.job_id,
        consumer: served.ctx.expected.consumer,
        slot_size: g.slot_size,
        slot_count: g.slot_count,
    };
    let bytes = encode(&RingToWorker {
        msg: Some(ring_to_worker::Msg::Attach(attach)),
    });
    let fds = [served.ring.memory.fd().as_raw_fd()];
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

/// Handles one report. False when the consumer is gone.
fn on_report(
    served: &Served,
    id: ConnId,
    worker: &Worker,
    msg: RingToTrainer,
) -> Result<bool, LoaderError> {
    match msg.msg {
        Some(ring_to_trainer::Msg::Filled(f)) => {
            tracing::trace!(worker = %worker.address, slot = f.slot, generation = f.generation, seq = f.seq, "filled");
            let batch = slot_batch(served, id, worker, f.slot, f.generation, f.len)?;
            if batch.seq() != f.seq {
                return Err(bad(
                    worker,
                    format!(
                        "reported batch {} in slot {}, but its header says {}",
                        f.seq,
                        f.slot,
                        batch.seq()
                    ),
                ));
            }
            let credit = Credit::Slot(SlotCredit::new(Arc::clone(&served.ring.book), id));
            Ok(served.ctx.events.send(Event::Batch(batch, credit)).is_ok())
        }
        Some(ring_to_trainer::Msg::Returned(r)) => {
            served
                .ring
                .book
                .returned(id, r.slot, r.generation)
                .map_err(|e| bad(worker, e.to_string()))?;
            Ok(true)
        }
        Some(ring_to_trainer::Msg::Hello(_)) => {
            Err(bad(worker, "said hello twice on the ring".into()))
        }
        None => Err(bad(worker, "sent an empty or unknown ring message".into())),
    }
}

/// The batch in a filled slot, checked by the book (slot, generation,
/// length) and then like any frame. On error the view is dropped, which
/// frees the slot.
fn slot_batch(
    served: &Served,
    id: ConnId,
    worker: &Worker,
    slot: u32,
    generation: u64,
    len: u64,
) -> Result<Batch, LoaderError> {
    let release = served
        .ring
        .book
        .filled(id, slot, generation, len)
        .map_err(|e| bad(worker, e.to_string()))?;
    let view = SlotView::new(Arc::clone(&served.ring.memory), release, len)
        .map_err(|e| bad(worker, e.to_string()))?;
    Batch::from_slot(
        Bytes::from_owner(view),
        &served.ctx.expected,
        &worker.address,
    )
}

fn bad(worker: &Worker, problem: String) -> LoaderError {
    LoaderError::BadBatch {
        address: worker.address.clone(),
        problem,
    }
}
