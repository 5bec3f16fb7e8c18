//! The `ring_messages` driver.
//!
//! Input: `[slots u8][prefetch u8][flags u8][cut u8]`, then the stream.
//! The trainer's ring has `slots % 8 + 1` one-page slots, each holding a
//! valid batch of sequence number = slot for job 1, consumer 0; its first
//! grants are (slot, generation 1) for slots `0..prefetch % 4 + 1`.

use std::fs::File;

use bytes::BytesMut;
use loader_client::Batch;
use loader_client::fuzzing::{Session, parse_slot};
use loader_proto::batch::{BatchLayout, BatchMeta, TensorDesc};
use loader_proto::pb::{Dtype, RingAttach, RingToTrainer, RingToWorker, ring_to_worker};
use loader_ring::frame::{RingGeometry, decode, encode};
use loader_ring::fuzzing::{MAX_MEMFD, TrainerRing, WorkerRing};
use nix::sys::memfd::{MFdFlags, memfd_create};
use prost::Message;

/// The session of the trainer's ring: 16 batches, 4 per epoch.
pub const SESSION: Session = Session { job_id: 1, consumer: 0, batches_per_epoch: 4, total: 16 };

/// The batch a worker would have written into `slot` (sequence number =
/// slot): 2 samples of a 2x3 uint8 tensor `x`.
pub fn slot_batch(slot: u32) -> Vec<u8> {
    let seq = u64::from(slot);
    let layout = BatchLayout::new(2, vec![TensorDesc { name: "x".into(), dtype: Dtype::U8, shape: vec![2, 3] }])
        .expect("layout");
    let meta = BatchMeta { job_id: SESSION.job_id, epoch: (seq / SESSION.batches_per_epoch) as u32, consumer: 0, seq };
    let mut buf = vec![0u8; layout.total_len()];
    layout.write(&meta, &[seq * 2, seq * 2 + 1], &mut buf).expect("write");
    buf
}

/// Every frame in `bytes`, fed whole or in two parts cut at `cut`: the
/// messages, and whether the stream ended in an error.
fn frames<M: Message + Default + PartialEq + std::fmt::Debug>(bytes: &[u8], cut: usize) -> (Vec<M>, bool) {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for part in [&bytes[..cut], &bytes[cut..]] {
        buf.extend_from_slice(part);
        loop {
            match decode::<M>(&mut buf) {
                Ok(Some(m)) => {
                    // What decodes, encodes to a frame that decodes the same.
                    let mut again = BytesMut::from(&encode(&m)[..]);
                    assert_eq!(decode::<M>(&mut again).ok().flatten().as_ref(), Some(&m));
                    assert!(again.is_empty());
                    out.push(m);
                }
                Ok(None) => break,
                Err(_) => return (out, true),
            }
        }
    }
    (out, false)
}

fn geometry(bytes: &[u8]) {
    let mut raw = [0u8; 12];
    let n = bytes.len().min(12);
    raw[..n].copy_from_slice(&bytes[..n]);
    let g = RingGeometry {
        slot_size: u64::from_le_bytes(raw[..8].try_into().expect("8 bytes")),
        slot_count: u32::from_le_bytes(raw[8..].try_into().expect("4 bytes")),
    };
    let total = g.total_len();
    if let (Some(t), Some(f)) = (total, g.file_len_with_doorbell()) {
        assert!(f > t);
    }
    let last = g.slot_count.checked_sub(1);
    for slot in [Some(0), Some(1), last, Some(g.slot_count), Some(u32::MAX)].into_iter().flatten() {
        match g.slot_range(slot) {
            Some(r) => {
                assert!(slot < g.slot_count);
                assert_eq!(r.len() as u64, g.slot_size);
                if let Some(t) = total {
                    assert!(r.end as u64 <= t, "a slot past the ring");
                }
            }
            None => assert!(slot >= g.slot_count || total.is_none() || g.slot_size > usize::MAX as u64),
        }
    }
    if total.is_none()
        && let Some(last) = last
    {
        assert_eq!(g.slot_range(last), None, "the last slot of a ring too large to exist");
    }
}

fn memfd(len: u64) -> Option<File> {
    let file = File::from(memfd_create("loader-fuzz-ring", MFdFlags::MFD_CLOEXEC).ok()?);
    file.set_len(len.min(MAX_MEMFD)).ok()?;
    Some(file)
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let [slots, prefetch, flags, cut, stream @ ..] = data else { return };
    let cut = usize::from(*cut).min(stream.len());

    // Framing, both directions.
    let whole = frames::<RingToTrainer>(stream, 0);
    assert_eq!(frames::<RingToTrainer>(stream, cut), whole, "a frame cut in two decoded differently");
    let (to_worker, _) = frames::<RingToWorker>(stream, cut);
    geometry(stream);

    // The trainer's inbox, reading the stream as a worker's reports.
    let slots = u32::from(*slots % 8) + 1;
    if let Ok(ring) = TrainerRing::<Batch>::new(slots, u32::from(*prefetch % 4) + 1) {
        for slot in 0..slots {
            ring.write_slot(slot, &slot_batch(slot));
        }
        let hold = *flags & 0x10 != 0;
        let _ = ring.feed(stream, |filled| parse_slot(filled, &SESSION), |batch| hold && batch.seq() % 2 == 0);
        let (free, granted, held) = ring.census();
        assert_eq!((free + granted + held) as u32, slots);
        ring.release_all();
        let (_, _, held) = ring.census();
        assert_eq!(held, 0, "a slot stayed held after every batch was dropped");
    }

    // The worker's book, taking the stream as a trainer's messages: an
    // attach first (the stream's own, or one of the trainer's ring).
    let mut msgs = to_worker.into_iter().peekable();
    let attach = match msgs.peek().and_then(|m| m.msg.as_ref()) {
        Some(ring_to_worker::Msg::Attach(a)) => {
            let a = a.clone();
            msgs.next();
            a
        }
        _ => RingAttach { slot_size: 4096, slot_count: slots, doorbell: *flags & 1 != 0, ..Default::default() },
    };
    let g = RingGeometry { slot_size: attach.slot_size, slot_count: attach.slot_count };
    let need = if attach.doorbell { g.file_len_with_doorbell() } else { g.total_len() };
    // A memfd as long as the geometry needs, or (flag 2) a short one.
    let len = need.unwrap_or(4096).saturating_sub(u64::from(*flags & 2 != 0));
    let Some(file) = memfd(len) else { return };
    let Ok(mut worker) = WorkerRing::attach(&attach, file) else { return };
    for msg in msgs {
        let write = |n: u64| (n % 3 != 2).then_some(n.wrapping_mul(u64::from(*flags)) % 8192);
        if worker.on_message(msg, write).is_err() {
            break;
        }
    }
    worker.stop();
}
