//! The device buffer pool: at most `capacity` buffers exist, reused from
//! batch to batch; a buffer returns when the last holder of its batch (a
//! `Batch`, a DLPack tensor) drops it. The bound is what keeps GPU memory
//! bounded however far the workers run ahead: with every buffer held, the
//! stage pulls no more batches (back-pressure reaches the ring's slots and
//! so the workers).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::backend::{Backend, Event, Memory};
use crate::error::LoaderError;

/// Buffers are allocated in multiples of this, so the smaller last batch
/// of an epoch reuses a full batch's buffer and sizes that differ a little
/// share buffers.
const ROUND: usize = 1 << 20;

/// What the pool guards.
#[derive(Debug)]
struct Shelf {
    /// Buffers nobody holds, ready for the next copy.
    free: Vec<Returned>,
    /// Buffers that exist (free or held).
    live: usize,
}

/// A buffer back in the pool, with what the next copy into it must wait for.
#[derive(Debug)]
struct Returned {
    /// The memory.
    memory: Memory,
    /// Recorded on the stream the consumer read it on (if it said, through
    /// DLPack) when it let go: the next copy into it waits for it, so it
    /// cannot overwrite what a queued kernel still reads.
    fence: Option<Event>,
}

/// The pool; shared by the stage and every buffer it lent.
#[derive(Debug)]
pub(crate) struct DevicePool {
    /// Buffers and count.
    shelf: Mutex<Shelf>,
    /// Wakes a stage waiting for a buffer to return.
    returned: Condvar,
    /// Most buffers at once: `device_prefetch + 2` (the copies queued ahead,
    /// the batch being yielded, and the one the user still holds while
    /// asking for the next).
    capacity: usize,
}

/// The right to one buffer: a free one or a new one, fitted to a batch by
/// [`Lease::fit`]. Dropped unfitted, it gives its place back.
#[derive(Debug)]
pub(crate) struct Lease {
    /// The pool.
    pool: Arc<DevicePool>,
    /// A free buffer, or None for "allocate one".
    reuse: Option<Returned>,
    /// Set once fitted, so drop does not give the place back twice.
    fitted: bool,
}

/// A buffer lent to one batch; returns to the pool when dropped.
#[derive(Debug)]
pub(crate) struct PooledBuffer {
    /// Back to here on drop.
    pool: Arc<DevicePool>,
    /// Taken on drop.
    memory: Option<Memory>,
    /// The consumer stream that last read it (set through DLPack).
    used_on: Mutex<Option<u64>>,
}

impl DevicePool {
    /// A pool of at most `capacity` buffers (at least 1).
    pub(crate) fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            shelf: Mutex::new(Shelf {
                free: Vec::new(),
                live: 0,
            }),
            returned: Condvar::new(),
            capacity: capacity.max(1),
        })
    }

    /// Most buffers at once.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Buffers that exist and are held (not free).
    pub(crate) fn held(&self) -> usize {
        self.shelf
            .lock()
            .map(|s| s.live - s.free.len())
            .unwrap_or(0)
    }

    /// A place for one more buffer. Without `wait_for`, None when every
    /// buffer is held; with it, waits that long for one to return, then
    /// fails saying the batches must be dropped.
    pub(crate) fn lease(
        self: &Arc<Self>,
        wait_for: Option<Duration>,
    ) -> Result<Option<Lease>, LoaderError> {
        let poisoned = || LoaderError::Device("the device pool's lock was poisoned".into());
        let mut shelf = self.shelf.lock().map_err(|_| poisoned())?;
        let deadline = wait_for.map(|w| Instant::now() + w);
        loop {
            if let Some(reuse) = shelf.free.pop() {
                return Ok(Some(self.lease_of(Some(reuse))));
            }
            if shelf.live < self.capacity {
                shelf.live += 1;
                return Ok(Some(self.lease_of(None)));
            }
            let Some(deadline) = deadline else {
                return Ok(None);
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LoaderError::Device(format!(
                    "all {} device buffers are held by batches not yet dropped (device_prefetch + 2); \
                     drop each batch (and its tensors) before asking for more, or raise device_prefetch",
                    self.capacity
                )));
            }
            shelf = self
                .returned
                .wait_timeout(shelf, left)
                .map_err(|_| poisoned())?
                .0;
        }
    }

    fn lease_of(self: &Arc<Self>, reuse: Option<Returned>) -> Lease {
        Lease {
            pool: Arc::clone(self),
            reuse,
            fitted: false,
        }
    }

    /// Gives a place back: a buffer, or (None) the right to allocate one.
    fn give_back(&self, returned: Option<Returned>) {
        if let Ok(mut shelf) = self.shelf.lock() {
            match returned {
                Some(r) => shelf.free.push(r),
                None => shelf.live = shelf.live.saturating_sub(1),
            }
        }
        self.returned.notify_all();
    }
}

impl Lease {
    /// A buffer of at least `len` bytes on `backend`: the free one when it
    /// is large enough, else a new one (the small one is freed). A buffer
    /// a consumer read on a stream is written again only after that
    /// stream's reads.
    pub(crate) fn fit(
        mut self,
        backend: &Backend,
        len: usize,
    ) -> Result<PooledBuffer, LoaderError> {
        let reuse = self.reuse.take();
        let (memory, fence) = match reuse {
            Some(r) if r.memory.len() >= len => (r.memory, r.fence),
            _ => {
                let rounded = len.div_ceil(ROUND).max(1) * ROUND;
                // The place stays ours while allocating; on error `drop`
                // gives it back.
                (backend.alloc(rounded)?, None)
            }
        };
        if let Some(fence) = &fence {
            backend.after(fence)?;
        }
        self.fitted = true;
        Ok(PooledBuffer {
            pool: Arc::clone(&self.pool),
            memory: Some(memory),
            used_on: Mutex::new(None),
        })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.fitted {
            self.pool.give_back(self.reuse.take());
        }
    }
}

impl PooledBuffer {
    /// The memory.
    pub(crate) fn memory(&self) -> Option<&Memory> {
        self.memory.as_ref()
    }

    /// Records that the consumer reads the buffer on `stream`: the next
    /// copy into it waits for the work queued on that stream until the
    /// buffer is let go.
    pub(crate) fn used_on(&self, stream: u64) {
        if let Ok(mut s) = self.used_on.lock() {
            *s = Some(stream);
        }
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Some(memory) = self.memory.take() {
            let used_on = self.used_on.lock().ok().and_then(|s| *s);
            let fence = match used_on.map(|stream| memory.record_on(stream)) {
                Some(Ok(fence)) => fence,
                Some(Err(e)) => {
                    // Without the fence the buffer cannot be reused safely.
                    tracing::warn!("a device buffer is dropped, not reused: {e}");
                    self.pool.give_back(None);
                    return;
                }
                None => None,
            };
            self.pool.give_back(Some(Returned { memory, fence }));
        }
    }
}
