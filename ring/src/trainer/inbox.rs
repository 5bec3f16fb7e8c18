//! The attached workers' sockets, read by the consumer itself: a worker's
//! reports are read by the thread that waits for the batch (it sleeps in the
//! [`WaitSet`] whose eventfd the workers ring), not by a runtime thread that
//! would have to wake it in turn. Grants go out on the same sockets through
//! the book (see `grant`).
//!
//! The consumer does not wake for every report: before it sleeps it asks,
//! through the ring's doorbell ([`crate::doorbell`]), to be woken when
//! a number of reports are in ([`Inbox::arm`]), and every wake-up reads
//! every socket to its end ([`Inbox::read_all`]). The sockets themselves
//! wake it only when they hang up.
//!
//! Every report is checked by the book before it becomes a view; every view
//! is parsed and checked by the SDK like a gRPC frame (the `parse` it passes
//! to [`Inbox::read_all`], one path for both transports) before it reaches
//! the consumer. A worker that breaks the protocol ends
//! the session with an error naming it: a lying worker is a bug, not a
//! hiccup. A worker whose socket closes (stopping, or dead) gives back the
//! slots granted to it; the consumer remembers it for the gap watch.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use loader_proto::batch::TableCache;
use loader_proto::pb::{RingToTrainer, ring_to_trainer};
use tokio::time::Instant;

use super::book::SlotCredit;
use super::conn_id::ConnId;
use super::grant::GrantLine;
use super::{Disconnect, RingError, SlotRing, SlotView};
use crate::frame::decode;
use crate::wake::WaitSet;

/// Bytes read from a socket at a time: reports are about twenty bytes, so
/// one read takes every report a wake-up normally brings; a full read is
/// followed by another. Small, because the buffer is zeroed on every read.
const READ_CHUNK: usize = 1024;

/// A worker that attached: what errors and logs call it.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Its gRPC address, from the hello.
    pub address: String,
    /// Its pid, from SO_PEERCRED.
    pub pid: i32,
}

/// A worker broke the ring's protocol: a report the book refuses, a frame
/// that does not decode, a message out of place. The SDK words it like a
/// bad gRPC frame from that worker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("worker {address}: {problem}")]
pub struct BadReport {
    /// The worker's gRPC address.
    pub address: String,
    /// What it did wrong.
    pub problem: String,
}

/// A slot a worker reported filled, checked by the book (slot, generation,
/// length) and not yet parsed: what the SDK's `parse` is given.
#[derive(Debug)]
pub struct Filled<'a> {
    /// The slot's first `len` bytes; dropping the last view frees the slot.
    pub view: Bytes,
    /// The slot.
    pub slot: u32,
    /// The sequence number the report names (the header must agree).
    pub seq: u64,
    /// The batch's trace context, when it was sampled for tracing.
    pub traceparent: &'a str,
    /// Who wrote it.
    pub worker: &'a Worker,
    /// The last tensor table this worker wrote, parsed: a table like it is
    /// not parsed again.
    pub tables: &'a mut TableCache,
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
    /// Every report was handled; the socket stays open.
    Drained,
    /// The read filled the buffer: more may wait.
    More,
    /// The worker closed its socket (stopping, or dead).
    Closed,
}

/// Where reading stands against the doorbell's count.
#[derive(Debug, Default)]
struct Counts {
    /// Filled reports read, all links together.
    read: u64,
    /// Every report counted up to here has been read: the larger of the
    /// count seen before the last full read and `read` (a report can be read
    /// before its worker counts it).
    base: u64,
}

/// The ring's attached connections, shared by the accept loop (which adds
/// them) and the consumer (which reads them).
#[derive(Debug)]
pub struct Inbox {
    /// The book and memory the reports are checked against.
    ring: Arc<SlotRing>,
    /// The consumer's epoll set, which holds every open link.
    wait: Arc<WaitSet>,
    /// Open links by connection id; `None` once the loader stopped.
    links: Mutex<Option<BTreeMap<ConnId, Link>>>,
    /// Reports read, against the doorbell's count; changed only by
    /// `read_all` under the `links` lock.
    counts: Mutex<Counts>,
}

impl Inbox {
    /// An inbox with no link yet.
    pub fn new(ring: Arc<SlotRing>, wait: Arc<WaitSet>) -> Self {
        Self {
            ring,
            wait,
            links: Mutex::new(Some(BTreeMap::new())),
            counts: Mutex::new(Counts::default()),
        }
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        // Two counters stay consistent across a panic elsewhere.
        self.counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The eventfd workers ring, to lend them at attach.
    pub fn bell_fd(&self) -> BorrowedFd<'_> {
        self.wait.bell_fd()
    }

    /// Whether workers counted reports that have not been read yet.
    #[inline]
    pub fn unread(&self) -> bool {
        self.ring.memory.doorbell().reported() > self.counts().base
    }

    /// Asks the workers to ring the consumer's eventfd once `reports` more
    /// filled reports are in (at least one). False when they already are:
    /// read instead of sleeping. [`Inbox::disarm`] after waking.
    #[inline]
    pub fn arm(&self, reports: u64) -> bool {
        let target = self.counts().base.saturating_add(reports.max(1));
        self.ring.memory.doorbell().arm(target)
    }

    /// The consumer is awake: no worker needs to ring.
    #[inline]
    pub fn disarm(&self) {
        self.ring.memory.doorbell().disarm();
    }

    /// Slots the ring's workers know they may fill: the reports that can
    /// still come without the consumer giving a slot back.
    #[inline]
    pub fn in_flight(&self) -> u32 {
        self.ring.book.known_grants()
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
    pub fn adopt(
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

    /// Reads every link's socket to its end, turning each filled slot into
    /// a batch by `parse` (the SDK's batch type and checks; an error is the
    /// worker's) handed to `deliver` with the credit it owes its
    /// connection, in whatever type the consumer keeps credits as (one made
    /// from a [`SlotCredit`]: the ring knows nothing of gRPC streams'
    /// credits); returns how many. A worker that broke the protocol is
    /// disconnected and its error returned; a closed socket ends its link.
    pub fn read_all<B, C, E>(
        &self,
        mut parse: impl FnMut(Filled<'_>) -> Result<B, E>,
        mut deliver: impl FnMut(B, C),
    ) -> Result<u64, E>
    where
        C: From<SlotCredit>,
        E: From<BadReport> + std::fmt::Display,
    {
        let mut links = self.lock();
        let Some(open) = links.as_mut() else {
            return Ok(0);
        };
        // Every report counted now is already in its socket: read below.
        let counted = self.ring.memory.doorbell().reported();
        let mut filled = 0;
        let mut ended = Vec::new();
        let mut failed = None;
        for (&id, link) in open.iter_mut() {
            match self.read_link(id, link, &mut filled, &mut parse, &mut deliver) {
                Ok(Outcome::Drained | Outcome::More) => {}
                Ok(Outcome::Closed) => ended.push(id),
                Err(e) => {
                    failed = Some((id, e));
                    break;
                }
            }
        }
        for id in ended {
            if let Some(link) = open.remove(&id) {
                self.closed(id, link);
            }
        }
        let mut counts = self.counts();
        counts.read += filled;
        counts.base = counts.read.max(counted);
        drop(counts);
        if let Some((id, e)) = failed {
            if let Some(link) = open.remove(&id) {
                tracing::warn!(pid = link.worker.pid, "closing the ring connection: {e}");
                self.forget(id, &link);
            }
            return Err(e);
        }
        Ok(filled)
    }

    /// Sends grants that waited for these connections' sockets to drain.
    #[inline]
    pub fn flush(&self, writable: &[ConnId]) {
        for &id in writable {
            self.ring.book.flush(id);
        }
    }

    /// Closes every link: the loader stopped. Their workers see the sockets
    /// close; slots granted to them are free again (held ones stay with
    /// their views).
    pub fn close(&self) {
        let Some(open) = self.lock().take() else {
            return;
        };
        for (id, link) in open {
            self.forget(id, &link);
        }
    }

    /// Reads `link`'s socket until it has nothing more, handling every
    /// complete report; counts filled ones in `filled`.
    fn read_link<B, C: From<SlotCredit>, E: From<BadReport>>(
        &self,
        id: ConnId,
        link: &mut Link,
        filled: &mut u64,
        parse: &mut impl FnMut(Filled<'_>) -> Result<B, E>,
        deliver: &mut impl FnMut(B, C),
    ) -> Result<Outcome, E> {
        loop {
            let outcome = self.read_once(id, link, filled, parse, deliver)?;
            if !matches!(outcome, Outcome::More) {
                return Ok(outcome);
            }
        }
    }

    /// One read of `link`'s socket, and every complete report in it.
    fn read_once<B, C: From<SlotCredit>, E: From<BadReport>>(
        &self,
        id: ConnId,
        link: &mut Link,
        filled: &mut u64,
        parse: &mut impl FnMut(Filled<'_>) -> Result<B, E>,
        deliver: &mut impl FnMut(B, C),
    ) -> Result<Outcome, E> {
        let mut chunk = [0u8; READ_CHUNK];
        let outcome = match (&*link.socket).read(&mut chunk) {
            Ok(0) => Outcome::Closed,
            Ok(n) => {
                link.buf.extend_from_slice(&chunk[..n]);
                // A short read emptied the socket's queue.
                if n == READ_CHUNK {
                    Outcome::More
                } else {
                    Outcome::Drained
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => Outcome::More,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(Outcome::Drained),
            // A reset is a worker that died, like an orderly close.
            Err(_) => Outcome::Closed,
        };
        // Reports that came before a close count: the worker filled those
        // slots before it went.
        while let Some(msg) =
            decode::<RingToTrainer>(&mut link.buf).map_err(|e| bad(&link.worker, e.to_string()))?
        {
            if matches!(msg.msg, Some(ring_to_trainer::Msg::Filled(_))) {
                *filled += 1;
            }
            self.on_report(id, &link.worker, &mut link.tables, msg, parse, deliver)?;
        }
        Ok(outcome)
    }

    /// Handles one report.
    fn on_report<B, C: From<SlotCredit>, E: From<BadReport>>(
        &self,
        id: ConnId,
        worker: &Worker,
        tables: &mut TableCache,
        msg: RingToTrainer,
        parse: &mut impl FnMut(Filled<'_>) -> Result<B, E>,
        deliver: &mut impl FnMut(B, C),
    ) -> Result<(), E> {
        match msg.msg {
            Some(ring_to_trainer::Msg::Filled(f)) => {
                tracing::trace!(worker = %worker.address, slot = f.slot, generation = f.generation, seq = f.seq, "filled");
                // On error the view is dropped, which frees the slot.
                let view = self.slot_view(id, worker, f.slot, f.generation, f.len)?;
                let batch = parse(Filled { view, slot: f.slot, seq: f.seq, traceparent: &f.traceparent, worker, tables })?;
                let credit = SlotCredit::new(Arc::clone(&self.ring.book), id);
                deliver(batch, C::from(credit));
                Ok(())
            }
            Some(ring_to_trainer::Msg::Returned(r)) => self
                .ring
                .book
                .returned(id, r.slot, r.generation)
                .map_err(|e| bad(worker, e.to_string()).into()),
            Some(ring_to_trainer::Msg::Hello(_)) => {
                Err(bad(worker, "said hello twice on the ring".into()).into())
            }
            None => Err(bad(worker, "sent an empty or unknown ring message".into()).into()),
        }
    }

    /// The bytes of a filled slot, checked by the book (slot, generation,
    /// length): a view that frees the slot when its last clone drops.
    fn slot_view(
        &self,
        id: ConnId,
        worker: &Worker,
        slot: u32,
        generation: u64,
        len: u64,
    ) -> Result<Bytes, BadReport> {
        let release = self
            .ring
            .book
            .filled(id, slot, generation, len)
            .map_err(|e| bad(worker, e.to_string()))?;
        let view = SlotView::new(Arc::clone(&self.ring.memory), release, len)
            .map_err(|e| bad(worker, e.to_string()))?;
        Ok(Bytes::from_owner(view))
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

fn bad(worker: &Worker, problem: String) -> BadReport {
    BadReport {
        address: worker.address.clone(),
        problem,
    }
}
