//! The stage's ordering rules, on the host backend: copies that complete
//! out of order (or only when the test says), batches yielded in order, a
//! host batch (its slot) dropped only after its copy's event, and the
//! device pool's back-pressure.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use loader_proto::batch::{BatchLayout, BatchMeta, TableCache, TensorDesc};
use loader_proto::pb::Dtype;

use super::backend::Backend;
use super::host::HostBackend;
use super::*;
use crate::batch::{Batch, Expected};
use crate::error::LoaderError;

const EXPECTED: Expected = Expected {
    job_id: 1,
    consumer: 0,
    stream: 0,
    batches_per_epoch: 1000,
    total: 1000,
};

/// Long enough never to end a wait that should succeed.
const BOUND: Duration = Duration::from_secs(30);

/// Sends on drop: tells the test the batch's bytes (its "slot") were let go.
struct Slot {
    bytes: Vec<u8>,
    dropped: mpsc::Sender<u64>,
    seq: u64,
}

impl AsRef<[u8]> for Slot {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = self.dropped.send(self.seq);
    }
}

/// Batch `seq`: `data` [4, 1000] uint8 filled from `seq`; its bytes report
/// their drop on `dropped`.
fn batch(seq: u64, dropped: &mpsc::Sender<u64>) -> (Batch, Vec<u8>) {
    let indices: Vec<u64> = (0..4).map(|i| seq * 4 + i).collect();
    let layout = BatchLayout::new(
        4,
        vec![TensorDesc {
            name: "data".into(),
            dtype: Dtype::U8,
            shape: vec![4, 1000],
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
    let mut payloads = layout.write(&meta, &indices, &mut buf).expect("write");
    for (i, b) in payloads[0].iter_mut().enumerate() {
        *b = (i as u64 * 7 + seq) as u8;
    }
    let bytes = Bytes::from_owner(Slot {
        bytes: buf.clone(),
        dropped: dropped.clone(),
        seq,
    });
    let b = Batch::from_slot(bytes, &EXPECTED, "test", &mut TableCache::default()).expect("valid");
    (b, buf)
}

/// The loader's blocking front over a queue of batches.
fn next(stage: &mut PinStage, source: &mut VecDeque<Batch>) -> Option<Result<Batch, LoaderError>> {
    loop {
        match stage.plan() {
            Err(e) => return Some(Err(e)),
            Ok(Pull::Enough) => break,
            Ok(Pull::Must(lease)) => stage.accept(source.pop_front().map(Ok), lease),
            Ok(Pull::May(lease)) => match source.pop_front() {
                Some(b) => stage.accept(Some(Ok(b)), lease),
                None => break,
            },
        }
    }
    stage.pop()
}

fn manual_stage(depth: u32) -> PinStage {
    PinStage::new(
        Backend::Host(HostBackend::manual()),
        Device::Host,
        depth,
        Duration::from_millis(50),
    )
    .expect("stage")
}

/// The stage's host backend (the only backend without the `cuda` feature,
/// hence the allowance).
#[allow(irrefutable_let_patterns)]
fn host_of(stage: &PinStage) -> &HostBackend {
    let Backend::Host(host) = stage.backend_for_tests() else {
        panic!("host backend")
    };
    host
}

fn run_job(stage: &PinStage, index: usize) {
    assert!(host_of(stage).run_job(index), "job {index}");
}

#[test]
fn batches_come_out_in_order_whatever_order_copies_complete() {
    let (tx, _rx) = mpsc::channel();
    let mut expected = Vec::new();
    let mut source = VecDeque::new();
    for seq in 0..6 {
        let (b, bytes) = batch(seq, &tx);
        source.push_back(b);
        expected.push(bytes);
    }
    let mut stage = manual_stage(2);
    let mut seq = 0;
    while let Some(b) = next(&mut stage, &mut source) {
        let b = b.expect("ok");
        if seq == 0 {
            assert_eq!(source.len(), 3, "the yielded copy and two ahead");
        }
        // Every queued copy completes, the latest first.
        host_of(&stage).run_pending_reversed();
        assert_eq!(b.seq(), seq);
        assert_eq!(b.device(), Device::Host);
        assert!(b.bytes().is_empty(), "no host bytes on a device batch");
        let copy = b.on_device().expect("on device");
        assert_eq!(
            copy.read_back().expect("read"),
            expected[seq as usize],
            "batch {seq}"
        );
        let data = b.device_tensor("data").expect("data");
        assert_eq!(data.shape, &[4, 1000]);
        assert_eq!(data.ptr, copy.ptr() + b.header().tensors[0].offset as u64);
        seq += 1;
    }
    assert_eq!(seq, 6);
}

#[test]
fn a_slot_is_let_go_only_after_its_copy_completed() {
    let (tx, dropped) = mpsc::channel();
    let mut source: VecDeque<Batch> = (0..2).map(|s| batch(s, &tx).0).collect();
    let mut stage = manual_stage(1);
    let b0 = next(&mut stage, &mut source).expect("some").expect("ok");
    // Yielded, but its copy has not run: the slot is still held.
    assert!(!b0.on_device().expect("dev").is_ready());
    assert!(
        dropped.try_recv().is_err(),
        "a slot went back before its copy"
    );
    run_job(&stage, 1);
    // Copy 1 is done, but the reaper lets go in queue order: 0 first.
    assert!(
        dropped.try_recv().is_err(),
        "a slot went back before its copy"
    );
    run_job(&stage, 0);
    let mut back = vec![
        dropped.recv_timeout(BOUND).expect("slot 0 back"),
        dropped.recv_timeout(BOUND).expect("slot 1 back"),
    ];
    back.sort_unstable();
    assert_eq!(back, [0, 1]);
    assert!(b0.on_device().expect("dev").is_ready());
}

#[test]
fn a_full_device_pool_stops_the_pulls_until_a_batch_is_dropped() {
    let (tx, _rx) = mpsc::channel();
    let mut source: VecDeque<Batch> = (0..10).map(|s| batch(s, &tx).0).collect();
    // Depth 1: three buffers.
    let mut stage = manual_stage(1);
    let mut held = Vec::new();
    for job in 0..3 {
        held.push(next(&mut stage, &mut source).expect("some").expect("ok"));
        run_job(&stage, job);
    }
    assert_eq!(stage.buffers_held(), 3);
    assert_eq!(stage.buffers(), 3);
    assert_eq!(source.len(), 7, "no batch pulled beyond the pool");
    // Every buffer is held by the user and nothing is queued: after the
    // stage's wait, one line that says what to do, and still no pull.
    let e = next(&mut stage, &mut source)
        .expect("some")
        .expect_err("full");
    assert!(
        e.to_string().contains("all 3 device buffers are held"),
        "{e}"
    );
    assert_eq!(source.len(), 7);
    // A dropped batch gives its buffer back: the next pull goes ahead.
    held.remove(0);
    let b = next(&mut stage, &mut source).expect("some").expect("ok");
    assert_eq!(b.seq(), 3);
    run_job(&stage, 3);
    assert_eq!(
        b.on_device().expect("dev").read_back().expect("read").len(),
        b.on_device().expect("dev").len()
    );
}

#[test]
fn the_threaded_host_backend_delivers_every_batch_in_order_byte_for_byte() {
    let (tx, dropped) = mpsc::channel();
    let n = 40;
    let mut expected = Vec::new();
    let mut source = VecDeque::new();
    for seq in 0..n {
        let (b, bytes) = batch(seq, &tx);
        source.push_back(b);
        expected.push(bytes);
    }
    let mut stage = PinStage::new(
        Backend::Host(HostBackend::start().expect("start")),
        Device::Host,
        3,
        BOUND,
    )
    .expect("stage");
    let mut seq = 0;
    while let Some(b) = next(&mut stage, &mut source) {
        let b = b.expect("ok");
        assert_eq!(b.seq(), seq);
        assert_eq!(
            b.on_device().expect("dev").read_back().expect("read"),
            expected[seq as usize]
        );
        seq += 1;
    }
    assert_eq!(seq, n);
    drop(stage);
    drop(tx);
    // Every slot went back, once.
    let mut back: Vec<u64> = dropped.iter().collect();
    back.sort_unstable();
    assert_eq!(back, (0..n).collect::<Vec<_>>());
}

#[test]
fn a_saved_position_leaves_out_the_batches_the_stage_holds() {
    use std::collections::BTreeSet;
    let set = |v: &[u64]| v.iter().copied().collect::<BTreeSet<u64>>();
    // In order: 0..10 handed over, 8 and 9 still in the stage.
    assert_eq!(unyield(10, set(&[]), [8, 9]), (8, set(&[])));
    // Nothing held: unchanged.
    assert_eq!(unyield(10, set(&[12]), []), (10, set(&[12])));
    // Out of order: 12 and 14 handed over above the watermark, 14 held.
    assert_eq!(unyield(10, set(&[12, 14]), [14]), (10, set(&[12])));
    // Held below the watermark: the rest of the range moves above.
    assert_eq!(unyield(10, set(&[12]), [7, 9]), (7, set(&[8, 12])));
}
