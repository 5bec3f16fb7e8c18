//! The coordinator's half of batch tracing (see
//! `loader_process::telemetry::trace`): it decides which batches are
//! traced, and holds each traced batch's root span, `batch`, from the
//! moment a worker is given it until that worker reports it delivered.
//!
//! Only sampled batches get a span (`trace::sample_batch` decides first),
//! so memory follows the sampling ratio times the batches in flight; with
//! export off nothing is made at all.

use std::collections::HashMap;
use std::ops::Range;

use loader_proto::ConsumerKey;
use loader_process::telemetry::trace;
use tracing::Span;
use tracing::field::Empty;

/// The root spans of traced batches in flight, by (job, consumer, seq).
#[derive(Debug, Default)]
pub(crate) struct BatchTraces {
    /// Closed (and exported) when removed.
    open: HashMap<(u64, u32, u64), Span>,
}

impl BatchTraces {
    /// Starts (or, for a batch given out again, keeps) the root span of
    /// every batch of `range`, and returns the `traceparent` of those
    /// sampled, for the task. Empty when spans are not exported.
    pub(crate) fn assign(&mut self, key: ConsumerKey, range: Range<u64>, worker_id: u64) -> HashMap<u64, String> {
        if !trace::exporting() {
            return HashMap::new();
        }
        let (job_id, consumer) = key;
        let mut carried = HashMap::new();
        for seq in range {
            // Decided before any span exists: an unsampled batch costs a
            // hash (a batch given out again gets the same answer).
            if !trace::sample_batch(job_id, consumer, seq) {
                continue;
            }
            let span = self
                .open
                .entry((job_id, consumer, seq))
                .or_insert_with(|| tracing::info_span!("batch", job_id, consumer, seq, worker_id = Empty));
            // The last worker given it (a batch given out again keeps its
            // span: the trace shows each attempt's produce span).
            span.record("worker_id", worker_id);
            let traceparent = trace::carry(span);
            if traceparent.is_empty() {
                self.open.remove(&(job_id, consumer, seq));
            } else {
                carried.insert(seq, traceparent);
            }
        }
        carried
    }

    /// Ends the root spans of `seqs` of `key`: their worker reported them
    /// delivered.
    pub(crate) fn delivered(&mut self, key: ConsumerKey, seqs: &[u64]) {
        if self.open.is_empty() {
            return;
        }
        for &seq in seqs {
            self.open.remove(&(key.0, key.1, seq));
        }
    }

    /// Ends every root span of a consumer whose batches are no longer
    /// wanted (it ended, or its job failed).
    pub(crate) fn forget(&mut self, job_id: u64, consumer: Option<u32>) {
        if self.open.is_empty() {
            return;
        }
        self.open.retain(|&(j, c, _), _| j != job_id || consumer.is_some_and(|k| k != c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_held_or_carried_without_export() {
        let mut traces = BatchTraces::default();
        assert!(traces.assign((1, 0), 0..100, 7).is_empty());
        assert!(traces.open.is_empty());
    }
}
