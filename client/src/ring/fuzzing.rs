//! Entry points for the fuzz targets (`fuzz/`), not an API: the trainer's
//! checks of what a worker sends — a batch frame, and ring reports read by
//! the real inbox from a real socket into a real sealed memfd — reachable
//! without a coordinator or a listening socket.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use loader_proto::batch::TableCache;
use loader_proto::ring::RingGeometry;

use super::book::{Book, SlotCredit};
use super::inbox::{Inbox, Worker};
use super::memory::RingMemory;
use super::SlotRing;
use crate::batch::{Batch, Expected};
use crate::wake::WaitSet;

/// Bytes per slot of a [`TrainerRing`]: one page.
pub const SLOT_SIZE: u64 = 4096;

/// What a session expects of its batches: its job, its consumer, and the
/// sequence numbers `0..total` in epochs of `batches_per_epoch`.
#[derive(Debug, Clone, Copy)]
pub struct Session {
    /// The session's job.
    pub job_id: u64,
    /// The session's consumer.
    pub consumer: u32,
    /// Batches per epoch.
    pub batches_per_epoch: u64,
    /// Batches of the consumer over all epochs.
    pub total: u64,
}

impl Session {
    fn expected(&self) -> Expected {
        Expected {
            job_id: self.job_id,
            consumer: self.consumer,
            batches_per_epoch: self.batches_per_epoch,
            total: self.total,
        }
    }
}

/// Checks `bytes` as a `Fetch` stream checks a frame from a worker, then
/// reads every tensor as a user would; returns the payload bytes read.
pub fn check_frame(bytes: Bytes, session: &Session, tables: &mut TableCache) -> Result<usize, String> {
    let batch = Batch::from_frame(bytes, &session.expected(), "fuzz", tables).map_err(|e| e.to_string())?;
    Ok(read_batch(&batch))
}

fn read_batch(batch: &Batch) -> usize {
    let _ = (batch.epoch(), batch.seq(), batch.index_in_epoch(), batch.indices().len());
    let mut n = 0;
    for t in batch.tensors() {
        n += t.bytes.len();
        let _ = t.numel();
        let _ = t.as_slice::<u32>();
        let _ = batch.tensor(t.name).map(|t| t.bytes.first().copied());
    }
    n
}

/// A trainer's ring of `slot_count` one-page slots with one attached worker,
/// whose end of the socket the target writes to.
#[derive(Debug)]
pub struct TrainerRing {
    /// The consumer thread's side: reads and checks reports.
    inbox: Inbox,
    /// Memory and book, to read the census.
    ring: Arc<SlotRing>,
    /// The memfd, written as the worker would write its slots.
    memfd: File,
    /// The worker's end of the socket.
    worker: UnixStream,
    /// Batches delivered and still held, with their credits: they hold
    /// their slots, as a user's would.
    held: Mutex<Vec<(Batch, SlotCredit)>>,
}

impl TrainerRing {
    /// A ring with `prefetch` credits per connection and one attached
    /// worker; the book has granted it its first slots already.
    pub fn new(slot_count: u32, prefetch: u32, session: &Session) -> Result<Self, String> {
        let geometry = RingGeometry { slot_size: SLOT_SIZE, slot_count };
        let memory = RingMemory::create(geometry).map_err(|e| e.to_string())?;
        let memfd = File::from(memory.fd().try_clone_to_owned().map_err(|e| e.to_string())?);
        let ring = Arc::new(SlotRing {
            memory,
            book: Book::new(geometry, prefetch),
            disconnected: Mutex::new(None),
        });
        let wait = Arc::new(WaitSet::new().map_err(|e| e.to_string())?);
        let inbox = Inbox::new(Arc::clone(&ring), wait, session.expected());
        let (ours, worker) = UnixStream::pair().map_err(|e| e.to_string())?;
        worker.set_nonblocking(true).map_err(|e| e.to_string())?;
        let who = Worker { address: "fuzz-worker".into(), pid: 0 };
        inbox.adopt(ours, BytesMut::new(), who).map_err(|e| e.to_string())?;
        Ok(Self { inbox, ring, memfd, worker, held: Mutex::new(Vec::new()) })
    }

    /// Writes `bytes` at the front of `slot`, as a worker collating into it
    /// would (cut to the slot).
    pub fn write_slot(&self, slot: u32, bytes: &[u8]) {
        let Some(range) = self.ring.memory.geometry().slot_range(slot) else { return };
        let n = bytes.len().min(range.len());
        let _ = self.memfd.write_at(&bytes[..n], range.start as u64);
    }

    /// Sends `bytes` from the worker and has the inbox read them; batches
    /// delivered are read, then held while `hold` says so (else dropped,
    /// which frees their slots). Returns the batches delivered, or the
    /// error that closed the worker's connection.
    pub fn feed(&self, bytes: &[u8], mut hold: impl FnMut(u64) -> bool) -> Result<u64, String> {
        let mut delivered = 0;
        let mut rest = bytes;
        // Each round moves at least what the socket buffer takes, unless the
        // inbox stopped reading; bounded either way.
        for _ in 0..64 {
            let wrote = match (&self.worker).write(rest) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => 0,
                Err(e) => return Err(e.to_string()),
            };
            rest = &rest[wrote..];
            self.drain_grants();
            let got = self.inbox.read_all(|batch: Batch, credit: SlotCredit| {
                read_batch(&batch);
                if hold(batch.seq()) {
                    self.held.lock().unwrap_or_else(|p| p.into_inner()).push((batch, credit));
                } else {
                    credit.give_back();
                }
            });
            delivered += got.map_err(|e| e.to_string())?;
            if rest.is_empty() {
                break;
            }
        }
        Ok(delivered)
    }

    /// Drops every held batch: their credits and slots go back, and the
    /// book grants again.
    pub fn release_all(&self) {
        for (batch, credit) in self.held.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            drop(batch);
            credit.give_back();
        }
        self.drain_grants();
    }

    /// Slots (free, granted, held) by the book's census.
    pub fn census(&self) -> (usize, usize, usize) {
        let c = self.ring.census();
        (c.free, c.granted, c.held)
    }

    /// Reads (and discards) the grants the book wrote to the worker.
    fn drain_grants(&self) {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = (&self.worker).read(&mut chunk) {
            if n == 0 {
                break;
            }
        }
    }
}
