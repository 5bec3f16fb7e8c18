//! Outboxes: produced batches waiting for their consumer's `Fetch` stream.
//!
//! One queue per (job, consumer), lowest sequence number first: a batch that
//! was produced again after another worker died is the one the trainer is
//! waiting for, so it must not wait behind later ones. The stream attached to a queue takes
//! one batch per credit its trainer granted, never more; a newer stream for
//! the same consumer replaces the older one, which then ends, and batches not
//! yet handed over stay queued for the newcomer. Handing a batch to a stream
//! is what "delivered" means: the seq is recorded for the next heartbeat and
//! the coordinator link is woken, to report it when enough are recorded
//! (see `crate::link`).

use std::collections::{BTreeMap, HashMap};
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use loader_process::telemetry::blocked::{BLOCKED_TICK, BlockedClock};
use loader_proto::ConsumerKey;
use loader_proto::pb::{BatchFrame, Delivered};
use tokio::sync::Notify;
use tracing::Span;

use crate::meters::{ConsumerMeters, Meters};

/// A batch the trainer took from a ring slot is recorded like one streamed.
impl loader_ring::worker::DeliveryLog for Outboxes {
    fn delivered(&self, key: ConsumerKey, seq: u64) {
        self.record_delivered(key, seq);
    }
}

/// Deliveries not yet reported to the coordinator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Unreported {
    /// Delivered batches, all consumers together.
    pub(crate) total: usize,
    /// Some consumer's deliveries add up to half its window.
    pub(crate) half_window: bool,
}

/// Every consumer's queue of undelivered batches, shared by the producer
/// (pushes), the `Fetch` streams (take) and the coordinator link (reports).
#[derive(Debug, Default)]
pub(crate) struct Outboxes {
    /// Queues, delivery records and the closed flag, under one lock: every
    /// critical section is a few pointer moves.
    state: Mutex<State>,
    /// Wakes the coordinator link when a batch was delivered. A permit is
    /// stored when nobody waits, so reports coalesce into one heartbeat.
    report: Notify,
    /// Each consumer's metric handles, shared with the producer.
    meters: Meters,
}

#[derive(Debug, Default)]
struct State {
    boxes: HashMap<ConsumerKey, Outbox>,
    /// Seqs handed to streams since the last heartbeat took them.
    delivered: BTreeMap<ConsumerKey, Vec<u64>>,
    /// Last stream generation handed out; generations tell a replaced stream
    /// that it is no longer the consumer's stream.
    generation: u64,
    /// Set when the worker is fenced or shutting down: nothing is queued or
    /// handed out any more and every stream ends.
    closed: bool,
    /// Batches queued or handed over since the worker started: a draining
    /// worker whose count stands still is waiting for consumers that do not
    /// fetch (see `crate::drain`).
    progress: u64,
}

#[derive(Debug)]
struct Outbox {
    /// Produced batches by seq, handed out lowest first.
    batches: BTreeMap<u64, Queued>,
    /// Generation of the attached stream, if any.
    stream: Option<u64>,
    /// Session of the attached stream, for logs.
    session: u64,
    /// Batches the attached stream may still receive.
    credits: u64,
    /// Wakes the attached stream (and a replaced one, so that it ends).
    wake: Arc<Notify>,
    /// The consumer's metric handles.
    meters: Arc<ConsumerMeters>,
}

/// A produced batch waiting for its stream.
#[derive(Debug)]
struct Queued {
    batch: Bytes,
    /// Samples it holds, for the delivery counters.
    samples: u64,
    /// When it was queued, for the deliver stage's timing.
    at: Instant,
    /// The `batch.deliver` span of a batch sampled for tracing (from queued
    /// to sent); [`Span::none`] otherwise.
    deliver: Span,
}

impl Outbox {
    fn new(meters: Arc<ConsumerMeters>) -> Self {
        Self { batches: BTreeMap::new(), stream: None, session: 0, credits: 0, wake: Arc::default(), meters }
    }

    fn idle(&self) -> bool {
        self.stream.is_none() && self.batches.is_empty()
    }
}

impl Outboxes {
    /// Creates empty outboxes.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves plain queues behind, which
        // stay consistent; keep serving rather than cascade the panic.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The metric handles of every consumer.
    pub(crate) fn meters(&self) -> &Meters {
        &self.meters
    }

    /// Queues a produced batch of `samples` samples for its consumer, with
    /// its delivery span (see [`Queued::deliver`]). Dropped if the worker is
    /// closed.
    pub(crate) fn push(&self, key: ConsumerKey, seq: u64, batch: Bytes, samples: u64, deliver: Span) {
        let mut state = self.lock();
        if state.closed {
            return;
        }
        state.progress += 1;
        let outbox = state.boxes.entry(key).or_insert_with(|| Outbox::new(self.meters.consumer(key)));
        outbox.batches.insert(seq, Queued { batch, samples, at: Instant::now(), deliver });
        outbox.wake.notify_waiters();
    }

    /// Attaches a new stream for `key` with its first `credits`, replacing
    /// (and ending) any previous stream of that consumer.
    pub(crate) fn attach(self: &Arc<Self>, key: ConsumerKey, session: u64, credits: u32) -> Attachment {
        let mut state = self.lock();
        state.generation += 1;
        let generation = state.generation;
        let outbox = state.boxes.entry(key).or_insert_with(|| Outbox::new(self.meters.consumer(key)));
        if outbox.stream.is_some() {
            tracing::debug!(job = key.0, consumer = key.1, old = outbox.session, new = session, "stream replaced");
        }
        outbox.stream = Some(generation);
        outbox.session = session;
        outbox.credits = u64::from(credits);
        outbox.wake.notify_waiters();
        let meters = Arc::clone(&outbox.meters);
        Attachment { outboxes: Arc::clone(self), key, generation, meters }
    }

    /// True when no batch waits for delivery.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batches waiting for delivery, over every consumer.
    pub(crate) fn len(&self) -> usize {
        self.lock().boxes.values().map(|o| o.batches.len()).sum()
    }

    /// Sets the gauges of batches waiting and of credits not yet used.
    pub(crate) fn sample_meters(&self) {
        let state = self.lock();
        let batches = state.boxes.values().map(|o| o.batches.len()).sum();
        let credits = state.boxes.values().filter(|o| o.stream.is_some()).map(|o| o.credits).sum();
        drop(state);
        crate::meters::outboxes(batches, credits);
    }

    /// Batches queued or handed over since the worker started; it moves
    /// whenever production or delivery moves.
    pub(crate) fn progress(&self) -> u64 {
        self.lock().progress
    }

    /// Records a batch handed to its consumer some other way (a ring slot)
    /// and wakes the link to report it, as a `Fetch` stream's delivery does.
    pub(crate) fn record_delivered(&self, key: ConsumerKey, seq: u64) {
        let mut state = self.lock();
        state.progress += 1;
        state.delivered.entry(key).or_default().push(seq);
        drop(state);
        self.report.notify_one();
    }

    /// Deliveries recorded and not yet taken for a heartbeat: how many, and
    /// whether one consumer's add up to half its job's window (`window_of`
    /// a job id, in batches).
    pub(crate) fn unreported(&self, window_of: impl Fn(u64) -> u32) -> Unreported {
        let state = self.lock();
        let mut out = Unreported::default();
        for (&(job_id, _), seqs) in &state.delivered {
            out.total += seqs.len();
            out.half_window |= seqs.len() >= (window_of(job_id) as usize / 2).max(1);
        }
        out
    }

    /// Takes the delivery records for a heartbeat.
    pub(crate) fn take_delivered(&self) -> Vec<Delivered> {
        let delivered = std::mem::take(&mut self.lock().delivered);
        delivered
            .into_iter()
            .map(|((job_id, consumer), seqs)| Delivered { job_id, consumer, seqs })
            .collect()
    }

    /// Puts back delivery records a failed heartbeat could not report.
    pub(crate) fn restore_delivered(&self, records: Vec<Delivered>) {
        let mut state = self.lock();
        for d in records {
            let seqs = state.delivered.entry((d.job_id, d.consumer)).or_default();
            let newer = std::mem::replace(seqs, d.seqs);
            seqs.extend(newer);
        }
    }

    /// Waits until a batch was delivered since the last call.
    pub(crate) async fn delivered(&self) {
        self.report.notified().await;
    }

    /// Drops every undelivered batch (the coordinator forgot this worker and
    /// handed its batches to others); streams stay attached.
    pub(crate) fn drop_batches(&self) {
        let mut state = self.lock();
        for outbox in state.boxes.values_mut() {
            outbox.batches.clear();
        }
        state.boxes.retain(|_, o| !o.idle());
    }

    /// Drops the undelivered batches of one consumer (nobody will fetch them:
    /// the coordinator took them back); a stream attached for it stays, for
    /// batches of later tasks. Returns how many were dropped.
    pub(crate) fn drop_consumer(&self, key: ConsumerKey) -> usize {
        let mut state = self.lock();
        let Some(outbox) = state.boxes.get_mut(&key) else { return 0 };
        let dropped = std::mem::take(&mut outbox.batches).len();
        if outbox.idle() {
            state.boxes.remove(&key);
        }
        dropped
    }

    /// Drops every batch, refuses new ones and ends every stream.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        for outbox in state.boxes.values_mut() {
            outbox.batches.clear();
            outbox.wake.notify_waiters();
        }
    }
}

/// A `Fetch` stream's hold on its consumer's outbox. Dropping it detaches the
/// stream; batches not yet handed over stay queued.
#[derive(Debug)]
pub(crate) struct Attachment {
    /// The shared outboxes.
    outboxes: Arc<Outboxes>,
    /// The consumer this stream serves.
    key: ConsumerKey,
    /// This stream's generation; stale once a newer stream attaches.
    generation: u64,
    /// The consumer's metric handles.
    meters: Arc<ConsumerMeters>,
}

/// What the stream should do next.
enum Step {
    Send(BatchFrame),
    /// Wait for a wake-up; `true`: batches are queued but the trainer
    /// granted no credit (it is not reading).
    Wait(Arc<Notify>, bool),
    End,
}

impl Attachment {
    /// Grants more credits, if this stream is still the consumer's stream.
    pub(crate) fn add_credits(&self, credits: u32) {
        let mut state = self.outboxes.lock();
        if let Some(outbox) = state.boxes.get_mut(&self.key)
            && outbox.stream == Some(self.generation)
        {
            outbox.credits = outbox.credits.saturating_add(u64::from(credits));
            outbox.wake.notify_waiters();
        }
    }

    /// The next batch for this stream, as its frame: waits for both a
    /// credit and a batch. `None` once the stream was replaced or the worker
    /// closed.
    pub(crate) async fn next(&self) -> Option<BatchFrame> {
        let mut blocked = BlockedClock::new(&self.meters.blocked_grpc);
        loop {
            let wake = match self.step() {
                Step::Send(batch) => return Some(batch),
                Step::End => return None,
                Step::Wait(wake, no_credit) => {
                    blocked.tick(no_credit);
                    wake
                }
            };
            // Register interest, then look again: a push or credit between
            // the first look and the wait is not missed.
            let mut notified = pin!(wake.notified());
            notified.as_mut().enable();
            match self.step() {
                Step::Send(batch) => return Some(batch),
                Step::End => return None,
                Step::Wait(_, no_credit) => {
                    blocked.tick(no_credit);
                    if blocked.running() {
                        // Wakes to count the blocked time as it goes.
                        let _ = tokio::time::timeout(BLOCKED_TICK, notified).await;
                    } else {
                        notified.await;
                    }
                }
            }
        }
    }

    fn step(&self) -> Step {
        let mut state = self.outboxes.lock();
        if state.closed {
            return Step::End;
        }
        let Some(outbox) = state.boxes.get_mut(&self.key) else {
            return Step::End;
        };
        if outbox.stream != Some(self.generation) {
            return Step::End;
        }
        if outbox.credits == 0 {
            return Step::Wait(Arc::clone(&outbox.wake), !outbox.batches.is_empty());
        }
        let Some((seq, Queued { batch, samples, at, deliver })) = outbox.batches.pop_first() else {
            return Step::Wait(Arc::clone(&outbox.wake), false);
        };
        outbox.credits -= 1;
        outbox.meters.grpc.record(samples, batch.len() as u64);
        outbox.meters.delivered_after(at.elapsed());
        state.progress += 1;
        state.delivered.entry(self.key).or_default().push(seq);
        drop(state);
        self.outboxes.report.notify_one();
        // The trainer's span of this batch is a child of the delivery.
        let traceparent = loader_process::telemetry::trace::carry(&deliver);
        Step::Send(BatchFrame { data: batch, traceparent })
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let mut state = self.outboxes.lock();
        if let Some(outbox) = state.boxes.get_mut(&self.key)
            && outbox.stream == Some(self.generation)
        {
            outbox.stream = None;
            outbox.credits = 0;
            if outbox.idle() {
                state.boxes.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    const KEY: ConsumerKey = (1, 0);

    fn batch(seq: u64) -> Bytes {
        Bytes::from(seq.to_le_bytes().to_vec())
    }

    /// The next batch if one is ready right now; `Some(None)` if the stream ended.
    fn ready(a: &Attachment) -> Option<Option<Bytes>> {
        a.next().now_or_never().map(|frame| frame.map(|f| f.data))
    }

    fn delivered(o: &Outboxes) -> Vec<u64> {
        o.take_delivered().into_iter().flat_map(|d| d.seqs).collect()
    }

    // On a runtime: a stream blocked for want of credits wakes on a timer
    // to count its blocked time.
    #[tokio::test]
    async fn credits_bound_what_is_sent() {
        let o = Outboxes::new();
        for seq in 0..5 {
            o.push(KEY, seq, batch(seq), 1, Span::none());
        }
        let a = o.attach(KEY, 9, 2);
        assert_eq!(ready(&a), Some(Some(batch(0))));
        assert_eq!(ready(&a), Some(Some(batch(1))));
        assert_eq!(ready(&a), None, "no credit left");
        assert_eq!(delivered(&o), vec![0, 1]);
        a.add_credits(10);
        for seq in 2..5 {
            assert_eq!(ready(&a), Some(Some(batch(seq))));
        }
        assert_eq!(ready(&a), None, "credits left but no batch");
        assert!(o.is_empty());
        assert_eq!(delivered(&o), vec![2, 3, 4]);
    }

    #[tokio::test]
    async fn a_waiting_stream_wakes_on_push() {
        let o = Outboxes::new();
        let a = o.attach(KEY, 9, 1);
        let waiter = tokio::spawn(async move { a.next().await.map(|f| f.data) });
        tokio::task::yield_now().await;
        o.push(KEY, 0, batch(0), 1, Span::none());
        assert_eq!(waiter.await.expect("join"), Some(batch(0)));
        // The link was told there is something to report.
        o.delivered().await;
        assert_eq!(delivered(&o), vec![0]);
    }

    #[test]
    fn a_lower_seq_produced_later_goes_out_first() {
        let o = Outboxes::new();
        let a = o.attach(KEY, 1, 0);
        for seq in [5, 6, 7] {
            o.push(KEY, seq, batch(seq), 1, Span::none());
        }
        // Seq 2 was requeued after its first worker died.
        o.push(KEY, 2, batch(2), 1, Span::none());
        a.add_credits(2);
        assert_eq!(ready(&a), Some(Some(batch(2))));
        assert_eq!(ready(&a), Some(Some(batch(5))));
    }

    #[test]
    fn a_replacing_stream_receives_the_remaining_batches() {
        let o = Outboxes::new();
        for seq in 0..4 {
            o.push(KEY, seq, batch(seq), 1, Span::none());
        }
        let old = o.attach(KEY, 1, 1);
        assert_eq!(ready(&old), Some(Some(batch(0))));
        let new = o.attach(KEY, 2, 8);
        assert_eq!(ready(&old), Some(None), "the replaced stream ends");
        old.add_credits(5); // ignored: no longer the consumer's stream
        drop(old); // does not detach the newcomer
        for seq in 1..4 {
            assert_eq!(ready(&new), Some(Some(batch(seq))));
        }
        assert_eq!(delivered(&o), vec![0, 1, 2, 3]);
    }

    #[test]
    fn batches_outlive_a_dropped_stream() {
        let o = Outboxes::new();
        for seq in 0..3 {
            o.push(KEY, seq, batch(seq), 1, Span::none());
        }
        let a = o.attach(KEY, 1, 1);
        assert_eq!(ready(&a), Some(Some(batch(0))));
        drop(a);
        assert!(!o.is_empty());
        let b = o.attach(KEY, 2, 5);
        assert_eq!(ready(&b), Some(Some(batch(1))));
        assert_eq!(ready(&b), Some(Some(batch(2))));
    }

    #[test]
    fn consumers_are_separate_and_close_ends_everything() {
        let o = Outboxes::new();
        o.push((1, 0), 0, batch(10), 1, Span::none());
        o.push((1, 1), 0, batch(11), 1, Span::none());
        let a = o.attach((1, 1), 1, 5);
        assert_eq!(ready(&a), Some(Some(batch(11))));
        assert_eq!(ready(&a), None);
        o.close();
        assert_eq!(ready(&a), Some(None));
        o.push((1, 1), 1, batch(12), 1, Span::none());
        assert!(o.is_empty(), "a closed worker queues nothing");
    }

    #[test]
    fn dropping_a_consumer_keeps_its_stream_and_the_others() {
        let o = Outboxes::new();
        for seq in 0..3 {
            o.push(KEY, seq, batch(seq), 1, Span::none());
        }
        o.push((1, 1), 0, batch(10), 1, Span::none());
        let a = o.attach(KEY, 1, 5);
        assert_eq!(ready(&a), Some(Some(batch(0))));
        let before = o.progress();
        assert_eq!(o.drop_consumer(KEY), 2);
        assert_eq!(o.drop_consumer((9, 9)), 0, "an unknown consumer holds nothing");
        assert_eq!(o.len(), 1, "the other consumer's batch stays");
        assert_eq!(o.progress(), before, "dropping is not progress");
        assert_eq!(ready(&a), None, "the stream waits for later batches");
        o.push(KEY, 7, batch(7), 1, Span::none());
        assert_eq!(ready(&a), Some(Some(batch(7))));
    }

    #[test]
    fn failed_reports_are_restored_in_order() {
        let o = Outboxes::new();
        o.push(KEY, 0, batch(0), 1, Span::none());
        o.push(KEY, 1, batch(1), 1, Span::none());
        let a = o.attach(KEY, 1, 5);
        assert!(ready(&a).is_some());
        let lost = o.take_delivered();
        assert!(ready(&a).is_some());
        o.restore_delivered(lost);
        assert_eq!(delivered(&o), vec![0, 1]);
    }
}
