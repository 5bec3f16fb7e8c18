//! The consumer's side of `next()`: takes events from the background tasks,
//! reorders and de-duplicates batches, returns credits as batches are
//! yielded, keeps the watermark and stall time the heartbeat reports, and
//! ends after the last batch of the job.
//! With a shared-memory ring, gaps are also handed to `ring::GapWatch`.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::batch::{Batch, Transport};
use crate::error::LoaderError;
use crate::event::{Credit, Event, EventRx};
use crate::reorder::Reorder;
use crate::ring::GapWatch;
use crate::session::Session;

/// How long the consumer waits on a gap, holding batches, before it suspects
/// a worker is out of credits with the missing batch queued (see
/// `Routes::unstick`).
pub(crate) const STALL_GRACE: Duration = Duration::from_secs(1);
/// Bound on the best-effort final heartbeat after the last batch.
const FINAL_HEARTBEAT: Duration = Duration::from_secs(1);

/// State behind `Loader::next`.
#[derive(Debug)]
pub(crate) struct Consumer {
    /// Batches and fatal errors from the background tasks.
    events: EventRx,
    /// Arrived, not yet yielded.
    reorder: Reorder<(Batch, Credit)>,
    /// For the watermark, stall time and the final heartbeat.
    session: Arc<Session>,
    /// Tells the routes task the consumer is stuck on a gap.
    stalled: Arc<Notify>,
    /// Batches this consumer receives over the whole job.
    total: u64,
    /// Batches yielded so far.
    yielded: u64,
    /// Set after the last batch or a fatal error: `next` returns `None`.
    done: bool,
    /// Gaps involving the shared-memory ring, when there is one.
    gap: Option<GapWatch>,
    /// When the routes task was last told the consumer is stuck.
    last_stall_notice: Instant,
    /// The job's last batch while the final heartbeat is awaited: when that
    /// wait is cancelled (an interrupted caller), the next call yields it,
    /// so `next` loses nothing at any await point.
    last: Option<Batch>,
}

impl Consumer {
    /// A consumer for `total` batches.
    pub(crate) fn new(
        events: EventRx,
        session: Arc<Session>,
        stalled: Arc<Notify>,
        total: u64,
        in_order: bool,
    ) -> Self {
        Self {
            events,
            reorder: Reorder::new(in_order),
            session,
            stalled,
            total,
            yielded: 0,
            done: false,
            gap: None,
            last_stall_notice: Instant::now(),
            last: None,
        }
    }

    /// A consumer resumed from a saved state: the batches below `next_seq`
    /// and those in `yielded_above` were yielded by an earlier loader, so
    /// copies of them are dropped and they count as yielded.
    pub(crate) fn resuming(mut self, next_seq: u64, yielded_above: BTreeSet<u64>) -> Self {
        let in_order = self.reorder.in_order();
        self.yielded = next_seq + yielded_above.len() as u64;
        self.reorder = Reorder::resuming(in_order, next_seq, yielded_above);
        self.session
            .progress()
            .set_consumed(self.reorder.watermark());
        self
    }

    /// Where the consumer stands: every batch below the first value was
    /// yielded, and so were those in the second.
    pub(crate) fn position(&self) -> (u64, BTreeSet<u64>) {
        (
            self.reorder.watermark(),
            self.reorder.yielded_above().clone(),
        )
    }

    /// Batches may also arrive through a ring, watched by `gap`.
    pub(crate) fn with_gap_watch(mut self, gap: Option<GapWatch>) -> Self {
        self.gap = gap;
        self
    }

    /// Batches yielded so far, including those yielded before a resume.
    pub(crate) fn yielded(&self) -> u64 {
        self.yielded
    }

    /// The next batch; `None` after the last one or after an error.
    /// Cancel-safe: dropped at any await, it loses no batch.
    pub(crate) async fn next(&mut self) -> Option<Result<Batch, LoaderError>> {
        if let Some(batch) = self.last.take() {
            return Some(Ok(batch));
        }
        if self.done {
            return None;
        }
        // Time the user spends on a batch is no gap: only blocking counts.
        let called = Instant::now();
        loop {
            if let Some((_, (batch, credit))) = self.reorder.pop() {
                credit.give_back();
                self.yielded += 1;
                self.session
                    .progress()
                    .set_consumed(self.reorder.watermark());
                if self.yielded >= self.total {
                    self.last = Some(batch);
                    self.finish().await;
                    return self.last.take().map(Ok);
                }
                return Some(Ok(batch));
            }
            if self.yielded >= self.total {
                self.done = true;
                return None;
            }
            let waiting = Instant::now();
            let tick = self.gap.as_ref().map_or(STALL_GRACE, GapWatch::tick);
            let event = tokio::select! {
                e = self.events.recv() => e,
                () = tokio::time::sleep(tick) => {
                    self.session.progress().add_stall(waiting.elapsed());
                    if let Some(e) = self.stuck(called) {
                        self.done = true;
                        return Some(Err(e));
                    }
                    continue;
                }
            };
            self.session.progress().add_stall(waiting.elapsed());
            match event {
                Some(Event::Batch(batch, credit)) => {
                    if let Err((why, (batch, credit))) =
                        self.reorder.insert(batch.seq(), (batch, credit))
                    {
                        tracing::debug!(seq = batch.seq(), ?why, "dropping a copy of a batch");
                        credit.give_back();
                    }
                }
                Some(Event::Fatal(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                None => {
                    self.done = true;
                    return Some(Err(LoaderError::InvalidArgument(
                        "the loader's background tasks stopped (its runtime was shut down)".into(),
                    )));
                }
            }
        }
    }

    /// Nothing arrived for a tick: nudges the workers that may hold the
    /// gap, or ends with the error of a worker that left the ring.
    fn stuck(&mut self, called: Instant) -> Option<LoaderError> {
        if self.reorder.len() > 0 {
            if self.last_stall_notice.elapsed() >= STALL_GRACE {
                self.last_stall_notice = Instant::now();
                self.stalled.notify_one();
                self.spread_credits();
            }
            if let Some(gap) = &mut self.gap {
                gap.stuck(self.reorder.pending_mut());
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
    fn spread_credits(&mut self) {
        let mut seen = HashSet::new();
        for (batch, credit) in self.reorder.pending_mut().rev() {
            let Some(source) = credit.source() else { continue };
            if !seen.insert(source) {
                continue;
            }
            if batch.transport() == Transport::SharedMemory {
                batch.copy_out();
            }
            credit.give_back_early();
        }
        if !seen.is_empty() {
            tracing::debug!(sources = seen.len(), "stuck on a gap: gave each source one credit early");
        }
    }

    /// Tells the coordinator at once that everything was consumed, so the job
    /// shows as complete without waiting for the next heartbeat tick.
    async fn finish(&mut self) {
        self.done = true;
        match tokio::time::timeout(FINAL_HEARTBEAT, self.session.heartbeat()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "final heartbeat failed"),
            Err(_) => tracing::debug!("final heartbeat timed out"),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use loader_proto::batch::{BatchLayout, BatchMeta, TensorDesc};
    use loader_proto::pb::{Dtype, FetchRequest, Job};
    use tokio::sync::mpsc;

    use super::*;
    use crate::batch::Expected;
    use crate::event::CreditLine;

    const EXPECTED: Expected = Expected {
        job_id: 1,
        consumer: 0,
        batches_per_epoch: 4,
        total: 4,
    };

    fn batch(seq: u64) -> Batch {
        let layout = BatchLayout::new(
            1,
            vec![TensorDesc {
                name: "label".into(),
                dtype: Dtype::I64,
                shape: vec![1],
            }],
        )
        .expect("layout");
        let mut buf = vec![0u8; layout.total_len()];
        let meta = BatchMeta {
            job_id: 1,
            epoch: 0,
            consumer: 0,
            seq,
        };
        layout.write(&meta, &[seq], &mut buf).expect("write");
        Batch::from_frame(Bytes::from(buf), &EXPECTED, "http://w:1").expect("valid")
    }

    /// Credits returned on the line, summed.
    fn returned(rx: &mut mpsc::UnboundedReceiver<FetchRequest>) -> u32 {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|r| r.credits)
            .sum()
    }

    #[tokio::test]
    async fn reorders_drops_copies_returns_credits_and_ends() {
        let session = Arc::new(Session::unconnected(
            Job {
                job_id: 1,
                ..Default::default()
            },
            0,
        ));
        let (tx, rx) = mpsc::unbounded_channel();
        let mut consumer = Consumer::new(rx, session.clone(), Arc::new(Notify::new()), 4, true);
        let (credit_tx, mut credit_rx) = mpsc::unbounded_channel();
        let line = CreditLine::new(credit_tx);
        line.grant(8);
        assert_eq!(returned(&mut credit_rx), 8);
        for seq in [1, 0, 1, 3] {
            tx.send(Event::Batch(batch(seq), Credit::for_frame(&line)))
                .expect("send");
        }
        let seq =
            |item: Option<Result<Batch, LoaderError>>| item.expect("item").expect("batch").seq();
        assert_eq!(seq(consumer.next().await), 0);
        assert_eq!(seq(consumer.next().await), 1);
        // Two yielded: two credits back (the second copy of 1 is still queued).
        assert_eq!(returned(&mut credit_rx), 2);
        assert_eq!(session.reported_consumed(), 2);
        // A late copy of 0 arrives before 2.
        tx.send(Event::Batch(batch(0), Credit::for_frame(&line)))
            .expect("send");
        tx.send(Event::Batch(batch(2), Credit::for_frame(&line)))
            .expect("send");
        assert_eq!(seq(consumer.next().await), 2);
        assert_eq!(seq(consumer.next().await), 3);
        // Both dropped copies and both yielded batches: every frame's credit.
        assert_eq!(returned(&mut credit_rx), 4);
        assert_eq!(session.reported_consumed(), 4);
        assert!(consumer.next().await.is_none());
        assert_eq!(consumer.yielded(), 4);
    }

    #[tokio::test]
    async fn a_fatal_event_is_yielded_once_then_the_end() {
        let session = Arc::new(Session::unconnected(
            Job {
                job_id: 1,
                ..Default::default()
            },
            0,
        ));
        let (tx, rx) = mpsc::unbounded_channel();
        let mut consumer = Consumer::new(rx, session, Arc::new(Notify::new()), 4, true);
        tx.send(Event::Fatal(LoaderError::JobFailed(
            "sample 7: corrupt".into(),
        )))
        .expect("send");
        let e = consumer.next().await.expect("item").expect_err("fatal");
        assert_eq!(e.to_string(), "job failed: sample 7: corrupt");
        assert!(consumer.next().await.is_none());
    }
}
