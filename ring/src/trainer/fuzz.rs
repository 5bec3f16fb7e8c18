//! Entry points for the fuzz target (`fuzz/`), not an API: the trainer's
//! checks of what a worker sends on the ring — reports read by the real
//! inbox from a real socket into a real sealed memfd — reachable without a
//! coordinator or a listening socket. What a filled slot becomes is the
//! target's `parse` (the SDK's batch check, as the consumer passes it).

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;

use super::book::{Book, SlotCredit};
use super::inbox::{BadReport, Filled, Inbox, Worker};
use super::memory::RingMemory;
use super::SlotRing;
use crate::frame::RingGeometry;
use crate::wake::WaitSet;

/// Bytes per slot of a [`TrainerRing`]: one page.
pub const SLOT_SIZE: u64 = 4096;

/// A trainer's ring of `slot_count` one-page slots with one attached worker,
/// whose end of the socket the target writes to.
#[derive(Debug)]
pub struct TrainerRing<B> {
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
    held: Mutex<Vec<(B, SlotCredit)>>,
}

impl<B> TrainerRing<B> {
    /// A ring with `prefetch` credits per connection and one attached
    /// worker; the book has granted it its first slots already.
    pub fn new(slot_count: u32, prefetch: u32) -> Result<Self, String> {
        let geometry = RingGeometry { slot_size: SLOT_SIZE, slot_count };
        let memory = RingMemory::create(geometry).map_err(|e| e.to_string())?;
        let memfd = File::from(memory.fd().try_clone_to_owned().map_err(|e| e.to_string())?);
        let ring = Arc::new(SlotRing {
            memory,
            book: Book::new(geometry, prefetch),
            disconnected: Mutex::new(None),
        });
        let wait = Arc::new(WaitSet::new().map_err(|e| e.to_string())?);
        let inbox = Inbox::new(Arc::clone(&ring), wait);
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

    /// Sends `bytes` from the worker and has the inbox read them; each
    /// filled slot goes through `parse`, and the batches delivered are held
    /// while `hold` says so (else dropped, which frees their slots).
    /// Returns the batches delivered, or the error that closed the worker's
    /// connection.
    pub fn feed(
        &self,
        bytes: &[u8],
        mut parse: impl FnMut(Filled<'_>) -> Result<B, BadReport>,
        mut hold: impl FnMut(&B) -> bool,
    ) -> Result<u64, String> {
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
            let got = self.inbox.read_all(&mut parse, |batch: B, credit: SlotCredit| {
                if hold(&batch) {
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
