//! The `batch_header` driver.

use bytes::Bytes;
use loader_client::fuzzing::{Session, check_frame};
use loader_proto::batch::{ALIGN, BatchLayout, BatchMeta, BatchView, TableCache, TensorDesc};
use loader_proto::pb::Dtype;

/// Largest batch [`write`] writes.
const MAX_WRITE: usize = 1 << 20;

/// `data` as a batch buffer.
pub fn parse(data: &[u8]) {
    let plain = BatchView::parse(data);
    if let Ok(view) = &plain {
        let h = view.header();
        assert!(h.total_len <= data.len());
        for (i, t) in h.tensors.iter().enumerate() {
            let p = view.payload(i).expect("a parsed tensor's payload lies in the batch");
            assert_eq!(p.len(), t.len);
            assert_eq!(t.offset % ALIGN, 0);
            assert!(t.offset + t.len <= h.total_len);
            assert_eq!(view.payload_by_name(&t.name).map(<[u8]>::len), Some(t.len));
        }
    }
    let plain = plain.map(BatchView::into_header);

    // A cache primed with another batch (this one with a byte changed, or a
    // valid one), then this one twice: each must parse as without a cache.
    let mut cache = TableCache::default();
    let mut other = data.to_vec();
    if let Some(b) = other.get_mut(data.len() / 2) {
        *b ^= 0x01;
    }
    let _ = BatchView::parse_cached(&other, &mut cache);
    for _ in 0..2 {
        let cached = BatchView::parse_cached(data, &mut cache).map(BatchView::into_header);
        assert_eq!(cached, plain, "the table cache changed what a batch parses to");
    }

    // The trainer's checks of a frame: the session the header names when it
    // parsed (so the seq/epoch checks run), else an arbitrary one.
    let tail = |i: usize| data.len().checked_sub(i + 1).map_or(0, |j| data[j]);
    let session = match &plain {
        Ok(h) => Session {
            job_id: h.meta.job_id,
            consumer: h.meta.consumer,
            batches_per_epoch: u64::from(tail(0) % 8),
            total: if tail(1) & 1 == 0 { h.meta.seq.saturating_add(1) } else { u64::from(tail(1)) },
        },
        Err(_) => Session { job_id: 1, consumer: 0, batches_per_epoch: 4, total: 8 },
    };
    let _ = check_frame(Bytes::copy_from_slice(data), &session, &mut TableCache::default());
}

/// Reads a layout from `data`: `[samples u8][tensors u8]`, then per tensor
/// `[dtype u8][ndim u8][name_len u8][dims: ndim x u8]`, names taken from a
/// fixed alphabet; `truncated` by the last byte.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
}

/// `data` as a batch to lay out and write; what is written must parse back.
pub fn write(data: &[u8]) {
    let mut input = Input(data);
    let samples = usize::from(input.byte());
    let count = usize::from(input.byte() % 8);
    let mut tensors = Vec::with_capacity(count);
    for i in 0..count {
        let dtype = Dtype::try_from(i32::from(input.byte() % 16)).unwrap_or(Dtype::U8);
        let ndim = usize::from(input.byte() % 10);
        let name_len = usize::from(input.byte());
        let name: String = (0..name_len).map(|j| char::from(b'a' + ((i + j) % 26) as u8)).collect();
        let mut shape = vec![samples as u64];
        shape.extend((1..ndim).map(|_| u64::from(input.byte() % 9)));
        shape.truncate(ndim.max(1));
        tensors.push(TensorDesc { name, dtype, shape });
    }
    let Ok(layout) = BatchLayout::new(samples, tensors.clone()) else { return };
    if layout.total_len() > MAX_WRITE {
        return;
    }
    let meta = BatchMeta { job_id: 7, epoch: 1, consumer: 2, seq: 9 };
    let indices: Vec<u64> = (0..samples as u64).map(|i| i * 3).collect();
    let mut buf = vec![0u8; layout.total_len() + usize::from(input.byte())];
    let payloads = layout.write(&meta, &indices, &mut buf).expect("a laid-out batch fits its own length");
    assert_eq!(payloads.len(), tensors.len());
    let view = BatchView::parse(&buf).expect("a written batch parses");
    let h = view.header();
    assert_eq!((h.meta, &h.indices[..]), (meta, &indices[..]));
    for (t, d) in h.tensors.iter().zip(&tensors) {
        assert_eq!((&t.name, t.dtype, &t.shape), (&d.name, d.dtype, &d.shape));
    }
    // A batch that lost samples while it was written.
    let keep = usize::from(input.byte()) % (samples + 1);
    if let Ok(short) = layout.truncated(keep) {
        let mut again = buf.clone();
        short.write(&meta, &indices[..keep], &mut again).expect("a truncated layout fits the buffer");
        let view = BatchView::parse(&again).expect("a truncated batch parses");
        assert_eq!(view.header().indices.len(), keep);
    }
}
