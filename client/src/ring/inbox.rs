//! The attached workers' sockets, read by the consumer itself: a worker's
//! report wakes the thread that waits for the batch (it sleeps in the
//! [`WaitSet`] these sockets are in), not a runtime thread that would have
//! to wake it in turn. Grants go out on the same sockets through the book
//! (see `grant`).
//!
//! Every report is checked by the book before it becomes a view; every view
//! is parsed and checked like a gRPC frame (`Batch::from_slot`, one path)
//! before it reaches the consumer. A worker that breaks the protocol ends
//! the session with an error naming it: a lying worker is a bug, not a
//! hiccup. A worker whose socket closes (stopping, or dead) gives back the
//! slots granted to it; the consumer remembers it for the gap watch.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use loader_proto::batch::TableCache;
use loader_proto::pb::{RingToTrainer, ring_to_trainer};
use loader_proto::ring::decode;
use tokio::time::Instant;

use super::book::{ConnId, SlotCredit};
use super::grant::GrantLine;
use super::{Disconnect, RingError, SlotRing, SlotView};
use crate::batch::{Batch, Expected};
use crate::error::LoaderError;
use crate::event::Credit;
use crate::wake::WaitSet;

/// Bytes read from a socket at a time: reports are about twenty bytes, so
/// one read takes every report a wake-up normally brings (a longer burst is
/// reported again by the level-triggered wait set). Small, because the
/// buffer is zeroed on every read.
const READ_CHUNK: usize = 1024;

/// A worker that attached: what errors and logs call it.
#[derive(Debug, Clone)]
pub(crate) struct Worker {
    /// Its gRPC address, from the hello.
    pub(crate) address: String,
    /// Its pid, from SO_PEERCRED.
    pub(crate) pid: i32,
}

/// One attached worker's socket, read side.
#[derive(Debug)]
struct Link {
    /// Non-blocking; its write side is the book's [`GrantLine`].
    socket: Arc<UnixStream>,
    /// Bytes read and not yet decoded (a report cut by a read).
    buf: BytesMut,
    /// Who it is, for errors and logs.
    worker: Worker,
    /// The last tensor table it wrote, parsed.
    tables: TableCache,
}

/// How reading a link ended.
enum Outcome {
    /// Reports were handled; the socket stays open.
    Open,
    /// The worker closed its socket (stopping, or dead).
    Closed,
}

/// The ring's attached connections, shared by the accept loop (which adds
/// them) and the consumer (which reads them).
#[derive(Debug)]
pub(crate) struct Inbox {
    /// The book and memory the reports are checked against.
    ring: Arc<SlotRing>,
    /// The consumer's epoll set, which holds every open link.
    wait: Arc<WaitSet>,
    /// Identity checks for every batch, as on gRPC.
    expected: Expected,
    /// Open links by connection id; `None` once the loader stopped.
    links: Mutex<Option<BTreeMap<ConnId, Link>>>,
}

impl Inbox {
    /// An inbox with no link yet.
    pub(crate) fn new(ring: Arc<SlotRing>, wait: Arc<WaitSet>, expected: Expected) -> Self {
        Self {
            ring,
            wait,
            expected,
            links: Mutex::new(Some(BTreeMap::new())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<BTreeMap<ConnId, Link>>> {
        // A map of sockets stays consistent across a panic elsewhere.
        self.links
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes over an attached worker's socket (non-blocking, off any
    /// runtime) with the bytes read after its hello: opens its account, which
    /// grants it slots, and has the consumer watch it.
    pub(crate) fn adopt(
        &self,
        socket: UnixStream,
        buf: BytesMut,
        worker: Worker,
    ) -> Result<(), RingError> {
        socket.set_nonblocking(true)?;
        let socket = Arc::new(socket);
        let mut links = self.lock();
        let Some(open) = links.as_mut() else {
            // The loader stopped meanwhile; dropping the socket closes it.
            return Ok(());
        };
        let id = self
            .ring
            .book
            .open(|id| GrantLine::new(Arc::clone(&socket), Arc::clone(&self.wait), id));
        if let Err(e) = self.wait.watch(socket.as_fd(), id, false) {
            self.ring.book.close(id);
            return Err(e.into());
        }
        // Grants the socket could not take before it was watched.
        self.ring.book.flush(id);
        tracing::debug!(worker = %worker.address, pid = worker.pid, conn = id, "worker attached to the ring");
        open.insert(
            id,
            Link {
                socket,
                buf,
                worker,
                tables: TableCache::default(),
            },
        );
        Ok(())
    }

    /// Reads the sockets of the connections in `ready`, turning each filled
    /// slot into a batch handed to `deliver`. A worker that broke the
    /// protocol is disconnected and its error returned.
    pub(crate) fn read(
        &self,
        ready: &[ConnId],
        mut deliver: impl FnMut(Batch, Credit),
    ) -> Result<(), LoaderError> {
        let mut links = self.lock();
        let Some(open) = links.as_mut() else {
            return Ok(());
        };
        for &id in ready {
            let Some(link) = open.get_mut(&id) else {
                continue;
            };
            match self.read_link(id, link, &mut deliver) {
                Ok(Outcome::Open) => {}
                Ok(Outcome::Closed) => {
                    if let Some(link) = open.remove(&id) {
                        self.closed(id, link);
                    }
                }
                Err(e) => {
                    if let Some(link) = open.remove(&id) {
                        tracing::warn!(pid = link.worker.pid, "closing the ring connection: {e}");
                        self.forget(id, &link);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Sends grants that waited for these connections' sockets to drain.
    pub(crate) fn flush(&self, writable: &[ConnId]) {
        for &id in writable {
            self.ring.book.flush(id);
        }
    }

    /// Closes every link: the loader stopped. Their workers see the sockets
    /// close; slots granted to them are free again (held ones stay with
    /// their views).
    pub(crate) fn close(&self) {
        let Some(open) = self.lock().take() else {
            return;
        };
        for (id, link) in open {
            self.forget(id, &link);
        }
    }

    /// One read of `link`'s socket, and every complete report in it.
    fn read_link(
        &self,
        id: ConnId,
        link: &mut Link,
        deliver: &mut impl FnMut(Batch, Credit),
    ) -> Result<Outcome, LoaderError> {
        let mut chunk = [0u8; READ_CHUNK];
        let outcome = match (&*link.socket).read(&mut chunk) {
            Ok(0) => Outcome::Closed,
            Ok(n) => {
                link.buf.extend_from_slice(&chunk[..n]);
                Outcome::Open
            }
            // Woken for nothing (or by a signal): the wait set reports it again.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                return Ok(Outcome::Open);
            }
            // A reset is a worker that died, like an orderly close.
            Err(_) => Outcome::Closed,
        };
        // Reports that came before a close count: the worker filled those
        // slots before it went.
        while let Some(msg) =
            decode::<RingToTrainer>(&mut link.buf).map_err(|e| bad(&link.worker, e.to_string()))?
        {
            self.on_report(id, &link.worker, &mut link.tables, msg, deliver)?;
        }
        Ok(outcome)
    }

    /// Handles one report.
    fn on_report(
        &self,
        id: ConnId,
        worker: &Worker,
        tables: &mut TableCache,
        msg: RingToTrainer,
        deliver: &mut impl FnMut(Batch, Credit),
    ) -> Result<(), LoaderError> {
        match msg.msg {
            Some(ring_to_trainer::Msg::Filled(f)) => {
                tracing::trace!(worker = %worker.address, slot = f.slot, generation = f.generation, seq = f.seq, "filled");
                let batch = self.slot_batch(id, worker, tables, f.slot, f.generation, f.len)?;
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
                let credit = Credit::Slot(SlotCredit::new(Arc::clone(&self.ring.book), id));
                deliver(batch, credit);
                Ok(())
            }
            Some(ring_to_trainer::Msg::Returned(r)) => self
                .ring
                .book
                .returned(id, r.slot, r.generation)
                .map_err(|e| bad(worker, e.to_string())),
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
        &self,
        id: ConnId,
        worker: &Worker,
        tables: &mut TableCache,
        slot: u32,
        generation: u64,
        len: u64,
    ) -> Result<Batch, LoaderError> {
        let release = self
            .ring
            .book
            .filled(id, slot, generation, len)
            .map_err(|e| bad(worker, e.to_string()))?;
        let view = SlotView::new(Arc::clone(&self.ring.memory), release, len)
            .map_err(|e| bad(worker, e.to_string()))?;
        Batch::from_slot(
            Bytes::from_owner(view),
            &self.expected,
            &worker.address,
            tables,
        )
    }

    /// A worker left: its grants are free again, and the gap watch learns
    /// who it was.
    fn closed(&self, id: ConnId, link: Link) {
        let outstanding = self.forget(id, &link);
        tracing::info!(
            worker = %link.worker.address,
            pid = link.worker.pid,
            grants = outstanding,
            "worker left the shared-memory ring"
        );
        self.ring.record_disconnect(Disconnect {
            address: link.worker.address,
            pid: link.worker.pid,
            at: Instant::now(),
        });
    }

    /// Stops watching `link` and closes its account, which frees the slots
    /// granted to it (nothing writes them any more) and drops the book's
    /// half of the socket. Returns how many grants it held.
    fn forget(&self, id: ConnId, link: &Link) -> u32 {
        self.wait.forget(link.socket.as_fd());
        self.ring.book.close(id)
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.close();
    }
}

fn bad(worker: &Worker, problem: String) -> LoaderError {
    LoaderError::BadBatch {
        address: worker.address.clone(),
        problem,
    }
}
