//! [`PinStage`]: between the consumer and the user. It keeps up to
//! `device_prefetch` copies queued ahead of the batch it yields, each into a
//! pooled device buffer with one event, and yields device batches in the
//! order the consumer gave them whatever order the copies complete in. The
//! host batch (its ring slot) goes to the reaper, which drops it only once
//! the copy's event completed: the DMA reads the slot itself, so the slot
//! must stay untouched until then.
//!
//! The stage does not pull by itself: the loader asks it what it needs
//! ([`PinStage::plan`]), pulls from the consumer (blocking, or only if a
//! batch is ready), hands the result in ([`PinStage::accept`]) and takes
//! the next batch out ([`PinStage::pop`]), the same for the blocking and
//! the async front.

use std::collections::{BTreeSet, VecDeque};
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use super::backend::{Backend, Event};
use super::device::Device;
use super::on_device::DeviceCopy;
use super::pool::{DevicePool, Lease};
use crate::batch::Batch;
use crate::error::LoaderError;

/// What the stage needs before it can yield.
#[derive(Debug)]
pub(crate) enum Pull {
    /// Nothing is queued: pull a batch, waiting for it.
    Must(Lease),
    /// A copy could be queued ahead: pull a batch if one is ready now.
    May(Lease),
    /// Enough is queued (or the stream ended, or the pool is full).
    Enough,
}

/// The stage; see the module doc.
#[derive(Debug)]
pub(crate) struct PinStage {
    /// Where batches are copied to. Dropped after the reaper finished, so
    /// the ring stays registered until every copy from it completed.
    backend: Backend,
    /// Which device (for each batch).
    device: Device,
    /// Device buffers.
    pool: std::sync::Arc<DevicePool>,
    /// Copies to keep queued ahead of the batch being yielded.
    depth: usize,
    /// How long a stage with nothing queued waits for the user to drop a
    /// batch when every buffer is held, before failing.
    pool_wait: Duration,
    /// Device batches whose copies are queued, in the consumer's order.
    queued: VecDeque<Batch>,
    /// The consumer said there is nothing more.
    ended: bool,
    /// The consumer's error, yielded after the queued batches.
    failed: Option<LoaderError>,
    /// Host batches waiting for their copies' events.
    reaper: Option<Reaper>,
}

impl PinStage {
    /// A stage copying to `backend`'s `device`, `depth` copies ahead (at
    /// least 1), with `depth + 2` device buffers.
    pub(crate) fn new(
        backend: Backend,
        device: Device,
        depth: u32,
        pool_wait: Duration,
    ) -> Result<Self, LoaderError> {
        let depth = depth.max(1) as usize;
        Ok(Self {
            backend,
            device,
            pool: DevicePool::new(depth + 2),
            depth,
            pool_wait,
            queued: VecDeque::new(),
            ended: false,
            failed: None,
            reaper: Some(Reaper::start()?),
        })
    }

    /// The backend, for tests that complete copies by hand.
    #[cfg(test)]
    pub(crate) fn backend_for_tests(&self) -> &Backend {
        &self.backend
    }

    /// The device batches land on.
    pub(crate) fn device(&self) -> Device {
        self.device
    }

    /// For a GPU: whether ring batches are DMA'd with no staging copy.
    pub(crate) fn ring_registered(&self) -> bool {
        self.backend.ring_registered()
    }

    /// Device buffers held now (queued copies and batches the user holds).
    pub(crate) fn buffers_held(&self) -> usize {
        self.pool.held()
    }

    /// Most device buffers at once.
    pub(crate) fn buffers(&self) -> usize {
        self.pool.capacity()
    }

    /// What to pull next; see [`Pull`]. Fails when nothing is queued and
    /// every buffer stayed held for `pool_wait`.
    pub(crate) fn plan(&mut self) -> Result<Pull, LoaderError> {
        if self.ended || self.failed.is_some() || self.queued.len() > self.depth {
            return Ok(Pull::Enough);
        }
        if self.queued.is_empty() {
            return Ok(self
                .pool
                .lease(Some(self.pool_wait))?
                .map_or(Pull::Enough, Pull::Must));
        }
        Ok(self.pool.lease(None)?.map_or(Pull::Enough, Pull::May))
    }

    /// Takes in what the consumer gave for `lease`: a batch is copied
    /// (queued), the end or an error is remembered for after the queue.
    pub(crate) fn accept(&mut self, item: Option<Result<Batch, LoaderError>>, lease: Lease) {
        match item {
            None => self.ended = true,
            Some(Err(e)) => self.failed = Some(e),
            Some(Ok(batch)) => match self.submit(batch, lease) {
                Ok(on_device) => self.queued.push_back(on_device),
                Err(e) => self.failed = Some(e),
            },
        }
    }

    /// The next device batch (its copy queued, maybe not complete: wait on
    /// its event), then the consumer's error if it gave one; None when
    /// nothing is queued.
    pub(crate) fn pop(&mut self) -> Option<Result<Batch, LoaderError>> {
        match self.queued.pop_front() {
            Some(batch) => Some(Ok(batch)),
            None => self.failed.take().map(Err),
        }
    }

    /// Sequence numbers the consumer handed over that the user has not
    /// had: a saved state must count them as not yielded.
    pub(crate) fn pending(&self) -> impl Iterator<Item = u64> + '_ {
        self.queued.iter().map(Batch::seq)
    }

    /// Queues the copy of `host` into a buffer fitted from `lease`, and
    /// hands `host` to the reaper.
    fn submit(&mut self, host: Batch, lease: Lease) -> Result<Batch, LoaderError> {
        let len = host.bytes().len();
        let buffer = lease.fit(&self.backend, len)?;
        let memory = buffer
            .memory()
            .ok_or_else(|| LoaderError::Device("a fitted buffer has no memory".into()))?;
        let event = self.backend.copy(host.bytes(), memory)?;
        let on_device = host.onto_device(DeviceCopy::new(buffer, event.clone(), self.device, len));
        match &self.reaper {
            Some(reaper) => reaper.hold(event, host),
            // Only during drop; waiting here keeps the rule.
            None => {
                let _ = event.wait();
                drop(host);
            }
        }
        Ok(on_device)
    }
}

impl Drop for PinStage {
    fn drop(&mut self) {
        // Every copy completes and every host batch is dropped before the
        // backend (and the ring's registration) goes.
        self.queued.clear();
        if let Some(reaper) = self.reaper.take() {
            reaper.finish();
        }
    }
}

/// The thread that drops host batches once their copies completed, in the
/// order they were queued (a copy stream completes in that order; on the
/// host backend a later copy may wait a little for an earlier one).
#[derive(Debug)]
struct Reaper {
    /// Where submits send (event, host batch).
    tx: Sender<(Event, Batch)>,
    /// Joined on finish.
    thread: JoinHandle<()>,
}

impl Reaper {
    fn start() -> Result<Self, LoaderError> {
        let (tx, rx) = mpsc::channel::<(Event, Batch)>();
        let thread = std::thread::Builder::new()
            .name("loader-pin-reaper".into())
            .spawn(move || {
                // Ends when the stage drops the sender.
                while let Ok((event, host)) = rx.recv() {
                    if let Err(e) = event.wait() {
                        tracing::warn!("a host-to-device copy failed: {e}");
                    }
                    drop(host);
                }
            })
            .map_err(|e| {
                LoaderError::Runtime(format!("cannot start the pin stage's thread: {e}"))
            })?;
        Ok(Self { tx, thread })
    }

    fn hold(&self, event: Event, host: Batch) {
        if let Err(mpsc::SendError((event, host))) = self.tx.send((event, host)) {
            // The thread is gone (it cannot panic, but be safe): wait here.
            let _ = event.wait();
            drop(host);
        }
    }

    fn finish(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

/// A saved position (`next_seq` and the batches yielded above it) without
/// the `pending` batches, which the consumer counted as yielded but the
/// stage still holds: the batches yielded are `[0, next_seq) + above`,
/// minus `pending`.
pub(crate) fn unyield(
    next_seq: u64,
    above: BTreeSet<u64>,
    pending: impl IntoIterator<Item = u64>,
) -> (u64, BTreeSet<u64>) {
    let pending: BTreeSet<u64> = pending.into_iter().collect();
    let Some(&lowest) = pending.iter().next() else {
        return (next_seq, above);
    };
    if lowest >= next_seq {
        let above = above.into_iter().filter(|s| !pending.contains(s)).collect();
        return (next_seq, above);
    }
    // Batches in [lowest, next_seq) were yielded unless pending: they move
    // above the new `next_seq`, which is `lowest`.
    let above = (lowest..next_seq)
        .chain(above)
        .filter(|s| !pending.contains(s))
        .collect();
    (lowest, above)
}
