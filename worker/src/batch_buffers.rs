//! Buffers for the batches a worker makes outside a ring slot (a gRPC
//! stream's, and a shared stream's before it is copied to its
//! subscribers), given back when the last holder of a batch drops it and
//! handed out again.
//!
//! Why: a 3x224x224 batch of 64 is 9.6 MB, and a fresh buffer of that size
//! per batch is fresh pages from the allocator every time (glibc gives
//! large blocks back to the kernel as soon as they are free): about 2,300
//! page faults and as many pages zeroed by the kernel per batch, a tenth
//! of what making the batch costs once its samples are cached. A buffer
//! that comes back is written over as a ring slot is (the collate path
//! zeroes only the rows a dataset expects zeroed), so it costs neither.
//!
//! Batches under [`MIN_POOLED`] do not use the pool: malloc reuses small
//! blocks without faults anyway, and at 200,000 batches a second the
//! pool's lock would cost more than it saves (tokens at batch 1 read 0.95x
//! with it).
//!
//! The pool is bounded ([`MAX_KEPT`] buffers, [`MAX_KEPT_BYTES`] in all):
//! what a worker holds beyond its batches in flight stays small, and a
//! buffer of a job that ended leaves once newer ones push it out.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;

/// Buffers of at least this many bytes come from the pool and go back.
pub(crate) const MIN_POOLED: usize = 1 << 20;
/// The most idle buffers the pool keeps.
pub(crate) const MAX_KEPT: usize = 8;
/// The most bytes of idle buffers the pool keeps.
pub(crate) const MAX_KEPT_BYTES: usize = 64 << 20;

/// Idle buffers, most recently given back last. Each is initialized over
/// its whole length (stale bytes of an earlier batch).
static IDLE: Mutex<VecDeque<Vec<u8>>> = Mutex::new(VecDeque::new());

fn idle() -> MutexGuard<'static, VecDeque<Vec<u8>>> {
    // A thread that panicked holding the lock left a queue of whole
    // buffers: still usable.
    IDLE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A buffer of `len` bytes for one batch: one given back if one of about
/// that size is idle (its bytes stale), else a new one (zeroed).
#[derive(Debug)]
pub(crate) struct BatchBuffer {
    buf: Vec<u8>,
    /// Whether every byte is zero (a new buffer).
    zeroed: bool,
}

impl BatchBuffer {
    /// A buffer of exactly `len` bytes.
    pub(crate) fn take(len: usize) -> Self {
        if len < MIN_POOLED {
            return Self { buf: vec![0; len], zeroed: true };
        }
        let reused = {
            let mut idle = idle();
            // A buffer at most twice as long: a far larger one is worth
            // more to a job whose batches need it.
            let found = idle.iter().rposition(|b| b.len() >= len && b.len() / 2 <= len);
            found.and_then(|at| idle.remove(at))
        };
        match reused {
            Some(mut buf) => {
                buf.truncate(len);
                Self { buf, zeroed: false }
            }
            None => Self { buf: vec![0; len], zeroed: true },
        }
    }

    /// Whether every byte is zero; else they are stale bytes of an earlier
    /// batch.
    pub(crate) fn is_zeroed(&self) -> bool {
        self.zeroed
    }

    /// The bytes, to write the batch into.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// The first `len` bytes as the batch, which goes back to the pool
    /// when its last clone drops.
    pub(crate) fn freeze(mut self, len: usize) -> Bytes {
        let pooled = self.buf.len() >= MIN_POOLED;
        self.buf.truncate(len);
        let buf = std::mem::take(&mut self.buf);
        if pooled { Bytes::from_owner(Returning(buf)) } else { Bytes::from(buf) }
    }
}

/// A batch's buffer while a `Bytes` holds it; given back on drop.
struct Returning(Vec<u8>);

impl AsRef<[u8]> for Returning {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.0));
    }
}

/// Puts `buf` among the idle buffers, dropping the oldest ones beyond the
/// bounds (outside the lock: freeing 10 MB is not instant).
fn give_back(mut buf: Vec<u8>) {
    if buf.capacity() == 0 || buf.capacity() > MAX_KEPT_BYTES {
        return;
    }
    // Whole again: a short batch's tail (bytes of its own) is zeroed, which
    // costs only that tail.
    buf.resize(buf.capacity(), 0);
    let mut out = Vec::new();
    {
        let mut idle = idle();
        idle.push_back(buf);
        let mut held: usize = idle.iter().map(Vec::len).sum();
        while idle.len() > MAX_KEPT || held > MAX_KEPT_BYTES {
            let Some(old) = idle.pop_front() else { break };
            held -= old.len();
            out.push(old);
        }
    }
    drop(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool is one per process; these run as one test so that no
    /// other test's buffers come between.
    #[test]
    fn a_dropped_batch_comes_back_stale_and_the_pool_stays_bounded() {
        let len = (3 << 20) + 12_345;
        let mut first = BatchBuffer::take(len);
        assert!(first.is_zeroed());
        assert!(first.bytes_mut().iter().all(|&b| b == 0));
        first.bytes_mut().fill(7);
        let batch = first.freeze(len - 5);
        assert_eq!(batch.len(), len - 5);
        let clone = batch.clone();
        drop(batch);
        // Still held by a clone: not back yet, so a new one is zeroed.
        let second = BatchBuffer::take(len);
        assert!(second.is_zeroed());
        drop(second);
        drop(clone);
        let mut again = BatchBuffer::take(len);
        assert!(!again.is_zeroed(), "the dropped batch's buffer is handed out again, whole");
        assert_eq!(again.bytes_mut().len(), len);
        assert!(again.bytes_mut()[..len - 5].iter().all(|&b| b == 7), "its bytes are the earlier batch's");
        // Far smaller requests do not take it, and small batches do not
        // come back.
        assert!(BatchBuffer::take(len / 3).is_zeroed());
        drop(BatchBuffer::take(1000).freeze(1000));
        assert!(idle().iter().all(|b| b.len() >= MIN_POOLED));
        drop(again.freeze(len));
        // Many buffers given back at once: the pool keeps at most MAX_KEPT.
        let many: Vec<Bytes> = (0..MAX_KEPT + 4).map(|_| BatchBuffer::take(1 << 20).freeze(1 << 20)).collect();
        drop(many);
        assert!(idle().len() <= MAX_KEPT);
        assert!(idle().iter().map(Vec::len).sum::<usize>() <= MAX_KEPT_BYTES);
    }
}
