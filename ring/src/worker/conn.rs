//! One connection to a trainer's ring, as a task on the runtime: joins the
//! ring, then carries grants in and reports out until the trainer goes away,
//! breaks the protocol, or the worker stops.
//!
//! The task owns the socket; the book of slots sits in the registry
//! ([`Rings`]) where the producer takes leases. When the task ends it removes
//! its connection from the registry, which drops the book and, once the last
//! lease is gone, the mapping.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use loader_proto::pb::{
    RingHello, RingToTrainer, RingToWorker, SlotFilled, SlotReturned, ring_to_trainer, ring_to_worker,
};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::bell::Bell;
use super::slots::{Mapping, Outgoing, Slots};
use super::socket::RingSocket;
use super::{Rings, RingError, handshake};
use crate::frame::{RingGeometry, decode, encode};

/// How long a trainer gets to answer the hello.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Joins the ring at `path` and serves it until it ends.
pub(crate) async fn run(rings: Arc<Rings>, path: PathBuf, hello: RingHello) {
    let mut registered = Deregister { rings: Arc::clone(&rings), path: path.clone(), id: None };
    let socket = path.display().to_string();
    let joined = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake::join(&path, hello)).await {
        Ok(r) => r,
        Err(_) => Err(RingError::HandshakeTimeout(HANDSHAKE_TIMEOUT)),
    };
    let attached = joined.and_then(|a| {
        let geometry = RingGeometry { slot_size: a.attach.slot_size, slot_count: a.attach.slot_count };
        let mapping = Mapping::new(&a.memfd, geometry, a.attach.doorbell)?;
        // The mapping keeps the memory; the descriptor is not needed.
        drop(a.memfd);
        let bell = Bell::new(Arc::clone(&mapping), a.eventfd);
        Ok((a.stream, a.attach, a.rest, mapping, bell))
    });
    let (stream, attach, rest, mapping, bell) = match attached {
        Ok(parts) => parts,
        Err(e) => {
            tracing::warn!(socket, "cannot use the trainer's shared-memory ring, delivering over gRPC: {e}");
            return;
        }
    };
    let (tx, rx) = unbounded_channel();
    let Some(id) = rings.attached(&path, &attach, Slots::new(mapping), tx) else {
        // The worker stopped meanwhile.
        return;
    };
    registered.id = Some(id);
    tracing::info!(
        socket,
        session = attach.session_id,
        job = attach.job_id,
        consumer = attach.consumer,
        slots = attach.slot_count,
        slot_size = attach.slot_size,
        "attached to the trainer's shared-memory ring"
    );
    let outcome = serve(&rings, id, stream, rest, rx, bell.as_ref()).await;
    // Unmaps the ring (once the last lease is gone) before saying so.
    drop(registered);
    match outcome {
        Ok(End::TrainerClosed) => tracing::info!(socket, "trainer closed its ring socket; dropping its tasks' batches"),
        Ok(End::Stopped) => tracing::debug!(socket, "ring connection closed: worker stopping"),
        Err(e) => tracing::warn!(socket, "closing the ring connection and dropping its tasks' batches: {e}"),
    }
}

/// Takes the connection out of the registry however the task ends (return,
/// panic, or the runtime dropping it), so the producer never waits on a
/// connection that no longer runs.
struct Deregister {
    rings: Arc<Rings>,
    path: PathBuf,
    /// Set once attached.
    id: Option<u64>,
}

impl Drop for Deregister {
    fn drop(&mut self) {
        match self.id {
            Some(id) => self.rings.closed(&self.path, id),
            None => self.rings.failed(&self.path),
        }
    }
}

/// Why a connection ended without error.
enum End {
    TrainerClosed,
    Stopped,
}

async fn serve(
    rings: &Rings,
    id: u64,
    stream: tokio::net::UnixStream,
    mut buf: BytesMut,
    mut outgoing: UnboundedReceiver<Outgoing>,
    bell: Option<&Bell>,
) -> Result<End, RingError> {
    let socket = RingSocket::new(stream)?;
    loop {
        // Grants that arrived with the attach message, or in the last read.
        while let Some(msg) = decode::<RingToWorker>(&mut buf)? {
            match msg.msg {
                Some(ring_to_worker::Msg::Grant(g)) => rings.grant(id, g.slot, g.generation)?,
                Some(ring_to_worker::Msg::Reclaim(r)) => {
                    let count = usize::try_from(r.count).unwrap_or(usize::MAX);
                    for (slot, generation) in rings.take_unused_upto(id, count) {
                        let msg = ring_to_trainer::Msg::Returned(SlotReturned { slot, generation });
                        socket.write_all(&encode(&RingToTrainer { msg: Some(msg) })).await?;
                    }
                }
                Some(ring_to_worker::Msg::Attach(_)) => {
                    return Err(RingError::Protocol("a second attach message".into()));
                }
                None => return Err(RingError::Protocol("an empty or unknown message".into())),
            }
        }
        tokio::select! {
            () = rings.stop.cancelled() => {
                give_back(rings, id, &socket).await;
                return Ok(End::Stopped);
            }
            read = socket.read_buf(&mut buf) => {
                if read? == 0 {
                    return Ok(End::TrainerClosed);
                }
            }
            Some(out) = outgoing.recv() => report(rings, id, &socket, out, bell).await?,
        }
    }
}

/// Tells the trainer a lease ended, after the book knows; a filled slot is
/// counted on the doorbell once its report is in the socket.
async fn report(
    rings: &Rings,
    id: u64,
    socket: &RingSocket,
    out: Outgoing,
    bell: Option<&Bell>,
) -> Result<(), RingError> {
    match out {
        Outgoing::Filled { slot, generation, len, seq, key, traceparent } => {
            rings.settle(id, slot, generation);
            let msg = ring_to_trainer::Msg::Filled(SlotFilled { slot, generation, len, seq, traceparent });
            socket.write_all(&encode(&RingToTrainer { msg: Some(msg) })).await?;
            if let Some(bell) = bell {
                bell.reported();
            }
            rings.deliveries.delivered(key, seq);
        }
        Outgoing::Returned { slot, generation } => {
            rings.settle(id, slot, generation);
            let msg = ring_to_trainer::Msg::Returned(SlotReturned { slot, generation });
            socket.write_all(&encode(&RingToTrainer { msg: Some(msg) })).await?;
        }
    }
    Ok(())
}

/// Returns the grants no batch used, so a trainer that outlives this worker
/// gets its slots back at once; best effort, the socket closes next anyway.
async fn give_back(rings: &Rings, id: u64, socket: &RingSocket) {
    for (slot, generation) in rings.take_unused(id) {
        let msg = ring_to_trainer::Msg::Returned(SlotReturned { slot, generation });
        if socket.write_all(&encode(&RingToTrainer { msg: Some(msg) })).await.is_err() {
            return;
        }
    }
}
