//! When the batch the consumer waits on does not come. A late batch (see
//! `LateWatch`) is reported to the coordinator, which launches a backup
//! task, and each source gets a credit early so the copy comes through. A
//! whole tick with nothing while batches are held nudges the routes task
//! and spreads credits the same way (the missing batch may sit behind
//! them at a worker that took it over), hands the gap to `GapWatch` when
//! there is a ring, and ends with the error of a worker that left it.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use crate::batch::Transport;
use crate::error::LoaderError;
use crate::event::Credit;

use super::Consumer;

/// How long the consumer waits on a gap, holding batches, before it suspects
/// a worker is out of credits with the missing batch queued (see
/// `Routes::unstick`).
pub(crate) const STALL_GRACE: Duration = Duration::from_secs(1);
/// While the consumer waits on a late batch (a backup task copies it), how
/// often a wait that brings nothing gives each source a credit early: the
/// copy comes from a worker whose credits the batches held here took, and
/// which first finishes the batches it was making when it took the copy
/// (each needing a credit), then sends its lowest batch first.
pub(super) const LATE_TICK: Duration = Duration::from_millis(25);
/// Bytes of batches whose credits go back early while one batch is late:
/// memory grows by at most this much for a copy that does not come.
const LATE_SPREAD_BYTES: u64 = 64 << 20;

impl Consumer {
    /// Before a wait for the next batch in order: when it will be late (and
    /// reports it if it is already).
    pub(super) fn watch_late(&mut self, now: Instant) -> Option<Instant> {
        if !self.reorder.in_order() {
            return None;
        }
        let late_at = self.late.waiting_on(self.reorder.watermark(), now)?;
        if let Some(seq) = self.late.due(now) {
            self.report_late(seq);
        }
        // Past it (reported): nothing more to wake for.
        (late_at > now).then_some(late_at)
    }

    /// Batch `seq` is late: the coordinator is told (it launches a backup),
    /// and each source gets a credit at once for the copy to come through.
    pub(super) fn report_late(&mut self, seq: u64) {
        self.session.report_late(seq);
        self.late_spread = Some(self.spread_credits());
    }

    /// Whether the batch waited on is late and batches held here may still
    /// give their credits back early.
    pub(super) fn spreading_late(&self) -> bool {
        self.reorder.len() > 0 && self.late_spread.is_some_and(|bytes| bytes < LATE_SPREAD_BYTES)
    }

    /// Nothing arrived for a tick: nudges the workers that may hold the
    /// gap, or ends with the error of a worker that left the ring.
    pub(super) fn stuck(&mut self, called: Instant) -> Option<LoaderError> {
        if self.reorder.len() > 0 {
            if self.spreading_late() {
                let bytes = self.spread_credits();
                self.late_spread = self.late_spread.map(|b| b + bytes);
            } else if self.last_stall_notice.elapsed() >= STALL_GRACE {
                self.last_stall_notice = Instant::now();
                self.stalled.notify_one();
                self.spread_credits();
            }
            if let Some(gap) = &mut self.gap {
                gap.stuck(self.reorder.pending_mut(), Credit::give_back_early);
            }
        }
        self.gap.as_ref()?.lost(called)
    }

    /// Stuck on a gap: each stream and ring connection gets back the credit
    /// of its newest waiting batch (copied out of its ring slot first), once
    /// per stall grace. The missing batch may sit behind those credits at a
    /// worker that took it over from a dead one: workers hand out their
    /// lowest sequence number first, so one credit lets it through. Memory
    /// grows by at most one batch per source per grace while the gap lasts.
    /// Returns the bytes of the batches whose credits went back.
    fn spread_credits(&mut self) -> u64 {
        let mut seen = HashSet::new();
        let mut bytes = 0;
        for (batch, credit) in self.reorder.pending_mut().rev() {
            let Some(source) = credit.source() else {
                continue;
            };
            if !seen.insert(source) {
                continue;
            }
            if batch.transport() == Transport::SharedMemory {
                batch.copy_out();
            }
            bytes += batch.len() as u64;
            credit.give_back_early();
        }
        if !seen.is_empty() {
            tracing::debug!(
                sources = seen.len(),
                "stuck on a gap: gave each source one credit early"
            );
        }
        bytes
    }
}
