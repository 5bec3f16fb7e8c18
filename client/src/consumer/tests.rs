//! Unit tests of the consumer: reordering, copies and credits, both
//! fronts' waits, interruption, fatal events, stall accounting.

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
    stream: 0,
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
    Batch::from_frame(
        Bytes::from(buf),
        &EXPECTED,
        "http://w:1",
        &mut loader_proto::batch::TableCache::default(),
    )
    .expect("valid")
}

/// An in-order consumer of `total` batches of job 1, the sender of its
/// events, and its session.
fn consumer(total: u64) -> (Consumer, crate::event::EventTx, Arc<Session>) {
    let session = Arc::new(Session::unconnected(
        Job {
            job_id: 1,
            ..Default::default()
        },
        0,
    ));
    let wait = Arc::new(WaitSet::new().expect("wait set"));
    let (tx, rx) = crate::event::channel(Arc::clone(&wait));
    let consumer = Consumer::new(
        rx,
        wait,
        Arc::clone(&session),
        Arc::new(Notify::new()),
        total,
        true,
    );
    (consumer, tx, session)
}

/// Credits returned on the line, summed.
fn returned(rx: &mut mpsc::UnboundedReceiver<FetchRequest>) -> u32 {
    std::iter::from_fn(|| rx.try_recv().ok())
        .map(|r| r.credits)
        .sum()
}

#[tokio::test]
async fn reorders_drops_copies_returns_credits_and_ends() {
    let (mut consumer, tx, session) = consumer(4);
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

#[test]
fn a_blocked_consumer_is_woken_by_events_sent_from_another_thread() {
    // The session's lazy channel spawns its connection task on a runtime.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _enter = runtime.enter();
    let (mut consumer, tx, _session) = consumer(2);
    let (credit_tx, _credit_rx) = mpsc::unbounded_channel();
    let line = CreditLine::new(credit_tx);
    let sender = std::thread::spawn(move || {
        for seq in [1, 0] {
            // Long enough for the consumer to be asleep in its wait set.
            std::thread::sleep(Duration::from_millis(50));
            tx.send(Event::Batch(batch(seq), Credit::for_frame(&line)))
                .expect("send");
        }
        tx
    });
    let seq =
        |item: Option<Result<Batch, LoaderError>>| item.expect("item").expect("batch").seq();
    assert_eq!(seq(consumer.next_blocking()), 0);
    assert!(!consumer.take_finish_due());
    assert_eq!(seq(consumer.next_blocking()), 1);
    assert!(
        consumer.take_finish_due(),
        "the last batch: the final heartbeat is due"
    );
    assert!(consumer.next_blocking().is_none());
    drop(sender.join().expect("sender"));
}

#[test]
fn an_interrupted_blocking_wait_loses_nothing() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _enter = runtime.enter();
    let (mut consumer, tx, _session) = consumer(2);
    let (credit_tx, _credit_rx) = mpsc::unbounded_channel();
    let line = CreditLine::new(credit_tx);
    // Nothing arrives: the check runs while the thread blocks, and its
    // error ends the call.
    let mut checks = 0;
    let every = Some(Duration::from_millis(20));
    let interrupted = consumer.next_blocking_checked(every, || {
        checks += 1;
        if checks == 3 {
            Err("interrupted")
        } else {
            Ok(())
        }
    });
    assert_eq!(interrupted.expect_err("interrupted"), "interrupted");
    assert_eq!(checks, 3);
    // Batch 1 arrives while nobody waits, then 0 during the next call.
    tx.send(Event::Batch(batch(1), Credit::for_frame(&line)))
        .expect("send");
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        tx.send(Event::Batch(batch(0), Credit::for_frame(&line)))
            .expect("send");
        tx
    });
    let seq = |item: Result<Option<Result<Batch, LoaderError>>, &str>| {
        item.expect("not interrupted")
            .expect("item")
            .expect("batch")
            .seq()
    };
    assert_eq!(seq(consumer.next_blocking_checked(every, || Ok(()))), 0);
    assert_eq!(seq(consumer.next_blocking_checked(every, || Ok(()))), 1);
    drop(sender.join().expect("sender"));
}

#[test]
fn both_fronts_count_stall_the_same_way() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (credit_tx, _credit_rx) = mpsc::unbounded_channel();
    let line = CreditLine::new(credit_tx);
    let seq =
        |item: Option<Result<Batch, LoaderError>>| item.expect("item").expect("batch").seq();

    // Async: batch 1 comes from a task that first runs once `next`
    // sleeps (one thread), and sends a while after that.
    let async_stall = runtime.block_on(async {
        let (mut consumer, tx, session) = consumer(3);
        tx.send(Event::Batch(batch(0), Credit::for_frame(&line)))
            .expect("send");
        assert_eq!(seq(consumer.next().await), 0);
        assert_eq!(session.reported_stall_us(), 0, "a ready batch is no stall");
        let late = Event::Batch(batch(1), Credit::for_frame(&line));
        let sender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            tx.send(late).expect("send");
            tx
        });
        assert_eq!(seq(consumer.next().await), 1);
        drop(sender.await.expect("sender"));
        session.reported_stall_us()
    });
    assert!(async_stall > 0, "the async front counts its wait");

    // Blocking: batch 1 is sent by the check, which runs after a wait.
    let _enter = runtime.enter();
    let (mut consumer, tx, session) = consumer(3);
    tx.send(Event::Batch(batch(0), Credit::for_frame(&line)))
        .expect("send");
    assert_eq!(seq(consumer.next_blocking()), 0);
    assert_eq!(session.reported_stall_us(), 0, "a ready batch is no stall");
    let mut late = Some(Event::Batch(batch(1), Credit::for_frame(&line)));
    let item = consumer.next_blocking_checked(Some(Duration::from_millis(1)), || {
        if let Some(event) = late.take() {
            tx.send(event).expect("send");
        }
        Ok::<(), Infallible>(())
    });
    assert_eq!(seq(item.unwrap_or_else(|never| match never {})), 1);
    assert!(session.reported_stall_us() > 0, "the blocking front counts its wait");
}

#[tokio::test]
async fn a_fatal_event_is_yielded_once_then_the_end() {
    let (mut consumer, tx, _session) = consumer(4);
    tx.send(Event::Fatal(LoaderError::JobFailed(
        "sample 7: corrupt".into(),
    )))
    .expect("send");
    let e = consumer.next().await.expect("item").expect_err("fatal");
    assert_eq!(e.to_string(), "job failed: sample 7: corrupt");
    assert!(consumer.next().await.is_none());
}
