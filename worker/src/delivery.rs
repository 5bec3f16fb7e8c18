//! Where one batch goes, written once for both transports: the producer
//! asks where a batch goes ([`Target`]), writes it there ([`Target::write`]:
//! into the ring slot it leased, or into a buffer of its own for the gRPC
//! outbox) and, once the batch is counted, hands it over
//! ([`Written::hand_over`]: the slot reported filled, or the buffer queued).
//! The bookkeeping between the two (spans, timing, meters, skipped samples)
//! is the producer's, the same whichever the target.

use std::time::{Duration, Instant};

use bytes::Bytes;
use loader_process::telemetry::trace;
use loader_proto::ConsumerKey;
use loader_proto::batch::{BatchLayout, BatchMeta};
use loader_ring::worker::SlotLease;

use crate::batch_spans::{BatchSpans, Transport};
use crate::collate::{BatchRules, CollateError, Collated, collate_bytes, collate_into, made_bytes, write_made};
use crate::dataset::{Dataset, MadeBatch};
use crate::meters::ConsumerMeters;
use crate::outbox::Outboxes;

/// What one batch is made of.
pub(crate) struct Sources<'a> {
    /// The job's dataset.
    pub(crate) dataset: &'a dyn Dataset,
    /// The batch's layout (from the dataset's tensors, or from the batch
    /// the dataset made whole).
    pub(crate) layout: &'a BatchLayout,
    /// The batch's header fields.
    pub(crate) meta: &'a BatchMeta,
    /// The samples it holds, in batch order.
    pub(crate) indices: &'a [u64],
    /// The job's seed and corrupt-sample policy.
    pub(crate) rules: BatchRules,
    /// A batch the dataset made whole (a Python `collate_fn`), with the time
    /// its samples took to read; `None`: collate the samples.
    pub(crate) made: Option<(MadeBatch, Duration)>,
}

/// Where a batch will be written, decided before it is made.
#[derive(Debug)]
pub(crate) enum Target {
    /// A slot of the trainer's ring, leased when `asked` for.
    Slot {
        /// The slot; dropping it gives the slot back.
        lease: SlotLease,
        /// When the producer asked for a slot.
        asked: Instant,
    },
    /// A buffer of its own, for the consumer's gRPC outbox.
    Grpc,
}

/// A batch written into its target, to be handed over.
#[derive(Debug)]
pub(crate) enum Written {
    /// In a ring slot: `len` bytes.
    Slot {
        /// The slot.
        lease: SlotLease,
        /// Bytes of the batch.
        len: u64,
        /// How long the slot was waited for, before the batch was made.
        waited: Duration,
    },
    /// In its own buffer.
    Grpc(Bytes),
}

impl Target {
    /// Makes the batch from `sources` in this target, starting at
    /// `started`; the time a slot was waited for goes on the batch's spans.
    pub(crate) fn write(
        self,
        sources: Sources<'_>,
        spans: &BatchSpans,
        started: Instant,
    ) -> Result<(Written, Collated), CollateError> {
        match self {
            Target::Slot { mut lease, asked } => {
                let Sources { dataset, layout, meta, indices, rules, made } = sources;
                let waited = started.saturating_duration_since(asked);
                spans.waited_for_slot(waited);
                // A failure drops the lease, which gives the slot back.
                let collated = match made {
                    Some((batch, read)) => write_made(batch, layout, meta, read, lease.bytes_mut()),
                    None => spans.produce().in_scope(|| collate_into(dataset, layout, meta, indices, rules, lease.bytes_mut())),
                }?;
                Ok((Written::Slot { lease, len: collated.len as u64, waited }, collated))
            }
            Target::Grpc => {
                let (batch, collated) = sources.into_bytes(spans)?;
                Ok((Written::Grpc(batch), collated))
            }
        }
    }
}

impl Sources<'_> {
    /// Makes the batch into a buffer of its own.
    pub(crate) fn into_bytes(self, spans: &BatchSpans) -> Result<(Bytes, Collated), CollateError> {
        let Sources { dataset, layout, meta, indices, rules, made } = self;
        match made {
            Some((batch, read)) => made_bytes(batch, layout, meta, read),
            None => spans.produce().in_scope(|| collate_bytes(dataset, layout, meta, indices, rules)),
        }
    }
}

impl Written {
    /// A copy of the made batch `bytes` in a ring slot; None (the slot
    /// given back) if it does not fit, which the ring's lease for this
    /// length rules out.
    pub(crate) fn copied_into(mut lease: SlotLease, bytes: &[u8]) -> Option<Self> {
        lease.bytes_mut().get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(Written::Slot { lease, len: bytes.len() as u64, waited: Duration::ZERO })
    }
}

impl Written {
    /// Hands batch `seq` of `key`, holding `samples` samples, to its
    /// trainer: the slot is reported filled, or the buffer queued in the
    /// consumer's outbox.
    pub(crate) fn hand_over(
        self,
        key: ConsumerKey,
        seq: u64,
        samples: u64,
        spans: &BatchSpans,
        meters: &ConsumerMeters,
        outboxes: &Outboxes,
    ) {
        match self {
            Written::Slot { lease, len, waited } => {
                let deliver = spans.deliver(Transport::Ring);
                lease.fill(len, seq, key, trace::carry(&deliver));
                // The slot was waited for before the batch was made.
                meters.delivered_after(waited);
                meters.shm.record(samples, len);
            }
            Written::Grpc(batch) => outboxes.push(key, seq, batch, samples, spans.deliver(Transport::Grpc)),
        }
    }
}
