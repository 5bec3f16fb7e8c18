//! What the consumer does about a gap in the in-order stream when batches
//! arrive through the ring, where a worker writes only into slots it was
//! granted and produces strictly in the order of its tasks:
//!
//! - Every slot held by batches waiting behind the gap while some worker has
//!   credits but no slot (it may hold the missing batch): the newest waiting
//!   batches are copied out of their slots, one per such worker, at most
//!   once per stall grace.
//! - A worker left the ring and the coordinator no longer lists it (its
//!   lease expired, its batches were requeued): a survivor must get through
//!   the tasks it already holds before it reaches the requeued ones, so every
//!   waiting batch is copied out of its slot and its credit returned, on a
//!   short tick. The coordinator's `max_outstanding` bounds what piles up.
//! - The gap outlasts three lease TTLs plus 5 s after a worker left (far
//!   beyond the lease expiry, requeue and re-production that normally fill
//!   it): the iterator ends with an error naming it instead of hanging.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use loader_ring::trainer::SlotRing;
use tokio::time::Instant;

use crate::batch::{Batch, Transport};
use crate::error::LoaderError;

/// How often a gap is looked at while a worker that left is recovered from.
const RECOVERY_TICK: Duration = Duration::from_millis(100);

/// Worker addresses the coordinator lists for this session, kept by the
/// routes task.
#[derive(Debug, Default)]
pub(crate) struct Listed(RwLock<HashSet<String>>);

impl Listed {
    /// Replaces the list after a successful poll.
    pub(crate) fn replace(&self, addresses: impl IntoIterator<Item = String>) {
        if let Ok(mut set) = self.0.write() {
            *set = addresses.into_iter().collect();
        }
    }

    fn contains(&self, address: &str) -> bool {
        self.0.read().map(|s| s.contains(address)).unwrap_or(true)
    }
}

/// The consumer's watch over gaps that involve the ring.
#[derive(Debug)]
pub(crate) struct GapWatch {
    /// The ring's book and disconnects.
    ring: Arc<SlotRing>,
    /// Workers the coordinator still lists.
    listed: Arc<Listed>,
    /// How long a gap may last after a worker left: its lease expiry, the
    /// requeue and the re-production by another worker, with a wide margin
    /// for a loaded machine.
    lost_after: Duration,
    /// Normal stall handling runs at most this often.
    grace: Duration,
    /// When starved workers were last given slots.
    last_starved_spill: Option<Instant>,
}

impl GapWatch {
    pub(crate) fn new(
        ring: Arc<SlotRing>,
        listed: Arc<Listed>,
        lease_ttl: Duration,
        grace: Duration,
    ) -> Self {
        Self {
            ring,
            listed,
            lost_after: lease_ttl * 3 + Duration::from_secs(5),
            grace,
            last_starved_spill: None,
        }
    }

    /// How long the consumer waits for an event before looking again.
    pub(crate) fn tick(&self) -> Duration {
        if self.recovering() {
            RECOVERY_TICK
        } else {
            self.grace
        }
    }

    /// A worker left the ring recently and the coordinator dropped it.
    fn recovering(&self) -> bool {
        self.ring
            .last_disconnect()
            .is_some_and(|d| d.at.elapsed() < self.lost_after && !self.listed.contains(&d.address))
    }

    /// The consumer is stuck on a gap holding `waiting` batches (lowest
    /// `seq` first), each with what it holds of its source (a credit):
    /// frees ring slots as described in the module docs. `give_back_early`
    /// returns a batch's credit once its bytes were copied out of its slot.
    pub(crate) fn stuck<'a, C: 'a>(
        &mut self,
        waiting: impl DoubleEndedIterator<Item = &'a mut (Batch, C)>,
        mut give_back_early: impl FnMut(&mut C),
    ) {
        if self.recovering() {
            let mut copied = 0usize;
            for (batch, credit) in waiting {
                if self.in_ring(batch) {
                    batch.copy_out();
                    give_back_early(credit);
                    copied += 1;
                }
            }
            if copied > 0 {
                tracing::debug!(
                    copied,
                    "a worker left the ring: copied waiting batches out of their slots"
                );
            }
            return;
        }
        if self
            .last_starved_spill
            .is_some_and(|t| t.elapsed() < self.grace)
        {
            return;
        }
        self.last_starved_spill = Some(Instant::now());
        let mut starved = self.ring.starved();
        if starved == 0 {
            return;
        }
        tracing::debug!(starved, slots = ?self.ring.census(), "stuck on a gap with every ring slot in use");
        for (batch, _) in waiting.rev() {
            if starved == 0 {
                break;
            }
            if self.in_ring(batch) {
                batch.copy_out();
                starved -= 1;
            }
        }
    }

    fn in_ring(&self, batch: &Batch) -> bool {
        batch.transport() == Transport::SharedMemory && self.ring.holds(batch.bytes())
    }

    /// The error that ends the iterator when the call made at `called` has
    /// been blocked for `lost_after` since a worker left the ring (or since
    /// `called`, whichever is later).
    pub(crate) fn lost(&self, called: Instant) -> Option<LoaderError> {
        let gone = self.ring.last_disconnect()?;
        let waited = gone.at.max(called).elapsed();
        (waited >= self.lost_after).then_some(LoaderError::WorkerDisconnected {
            address: gone.address,
            pid: gone.pid,
            waited,
        })
    }
}
