//! The worker's spans of a batch sampled for tracing (see
//! `loader_process::telemetry::trace`): `batch.produce` (read, decode and
//! transform every sample, collate them into the batch buffer) and its
//! child `batch.deliver` (into a ring slot, or queued until a `Fetch`
//! stream sends it), whose context travels with the batch to the trainer.
//!
//! A mixture's batch also records `sources`: how many of its samples each
//! source gave (`web=38 code=26`).
//!
//! A batch whose task carried no context (not sampled, or the coordinator
//! does not export) gets [`Span::none`] for both: nothing is made, entered
//! or recorded.

use std::time::Duration;

use loader_process::telemetry::trace;
use loader_proto::pb::Task;
use tracing::Span;
use tracing::field::Empty;

use crate::collate::Collated;

/// How a batch leaves the worker, as its delivery span names it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Transport {
    /// Written into the trainer's shared-memory ring.
    Ring,
    /// Queued for the trainer's `Fetch` stream.
    Grpc,
}

/// The spans of one batch being made.
#[derive(Debug)]
pub(crate) struct BatchSpans {
    /// `batch.produce`, child of the coordinator's `batch` span.
    produce: Span,
}

impl BatchSpans {
    /// The spans of batch `seq` of `task` (of job `job_id`).
    pub(crate) fn start(task: &Task, job_id: u64, seq: u64) -> Self {
        // Most tasks carry no context at all: no lookup for their batches.
        if task.traceparents.is_empty() {
            return Self { produce: Span::none() };
        }
        let traceparent = task.traceparents.get(&seq).map_or("", String::as_str);
        let produce = trace::child_of(traceparent, || {
            tracing::info_span!(
                "batch.produce",
                job_id,
                consumer = task.consumer,
                seq,
                samples = Empty,
                skipped = Empty,
                bytes = Empty,
                read_us = Empty,
                slot_wait_us = Empty,
                sources = Empty,
            )
        });
        Self { produce }
    }

    /// The produce span, to make the batch in (`in_scope`).
    pub(crate) fn produce(&self) -> &Span {
        &self.produce
    }

    /// Records what making the batch took: `samples` asked for, and what
    /// [`Collated`] says of them.
    pub(crate) fn made(&self, samples: usize, collated: &Collated) {
        if self.produce.is_none() {
            return;
        }
        self.produce.record("samples", samples);
        self.produce.record("skipped", collated.skipped.len());
        self.produce.record("bytes", collated.len);
        self.produce.record("read_us", micros(collated.read));
    }

    /// Records how long the batch waited for a ring slot before it was made.
    pub(crate) fn waited_for_slot(&self, waited: Duration) {
        self.produce.record("slot_wait_us", micros(waited));
    }

    /// The delivery span, a child of the produce span: its context goes
    /// with the batch (ring report or frame) to the trainer.
    pub(crate) fn deliver(&self, transport: Transport) -> Span {
        if self.produce.is_none() {
            return Span::none();
        }
        let transport = match transport {
            Transport::Ring => "ring",
            Transport::Grpc => "grpc",
        };
        tracing::info_span!(parent: &self.produce, "batch.deliver", transport)
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
