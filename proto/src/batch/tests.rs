use super::*;
use proptest::prelude::*;

fn sample_layout() -> BatchLayout {
    BatchLayout::new(
        3,
        vec![
            TensorDesc { name: "data".into(), dtype: Dtype::U8, shape: vec![3, 2, 5] },
            TensorDesc { name: "label".into(), dtype: Dtype::I64, shape: vec![3] },
        ],
    )
    .expect("layout")
}

fn sample_batch() -> Vec<u8> {
    let layout = sample_layout();
    let mut buf = vec![0u8; layout.total_len()];
    let meta = BatchMeta { job_id: 7, epoch: 1, consumer: 2, seq: 42 };
    let mut payloads = layout.write(&meta, &[5, 9, 11], &mut buf).expect("write");
    payloads[0].iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    payloads[1].copy_from_slice(&[1i64, 2, 3].map(i64::to_le_bytes).concat());
    buf
}

#[test]
fn round_trip() {
    let buf = sample_batch();
    let view = BatchView::parse(&buf).expect("parse");
    let h = view.header();
    assert_eq!(h.meta, BatchMeta { job_id: 7, epoch: 1, consumer: 2, seq: 42 });
    assert_eq!(h.indices, vec![5, 9, 11]);
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.tensors[0].shape, vec![3, 2, 5]);
    assert!(h.tensors.iter().all(|t| t.offset % ALIGN == 0));
    assert_eq!(view.payload_by_name("data").expect("data"), (0..30).map(|i| i as u8).collect::<Vec<_>>());
    assert_eq!(view.payload(1).expect("label")[8..16], 2i64.to_le_bytes());
}

#[test]
fn a_reused_buffer_gives_the_same_bytes_as_a_fresh_one() {
    // The padding before each payload is zeroed, so what a slot held
    // before never shows in the batch (the device path's check found the
    // last, partial tokens batch differing between two runs).
    let fresh = sample_batch();
    let layout = sample_layout();
    let mut reused = vec![0xAAu8; layout.total_len()];
    let meta = BatchMeta { job_id: 7, epoch: 1, consumer: 2, seq: 42 };
    let mut payloads = layout.write(&meta, &[5, 9, 11], &mut reused).expect("write");
    payloads[0].iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    payloads[1].copy_from_slice(&[1i64, 2, 3].map(i64::to_le_bytes).concat());
    assert!(layout.tensors.iter().any(|t| t.offset > 0), "the layout has padding");
    assert_eq!(reused, fresh);
    // A truncated rewrite leaves nothing of the dropped rows either.
    let short = layout.truncated(1).expect("truncate");
    let mut a = fresh.clone();
    short.write(&meta, &[5], &mut a).expect("rewrite");
    let ends: Vec<usize> = short.tensors.iter().map(|t| t.offset + t.len).collect();
    let gap = ends[0]..short.tensors[1].offset;
    assert!(!gap.is_empty() && a[gap].iter().all(|&x| x == 0), "the dropped rows are zeroed");
}

#[test]
fn a_truncated_batch_keeps_its_rows_and_parses() {
    let layout = sample_layout();
    let mut buf = sample_batch();
    let meta = BatchMeta { job_id: 7, epoch: 1, consumer: 2, seq: 42 };
    for keep in [2usize, 1, 0] {
        let short = layout.truncated(keep).expect("truncate");
        short.write(&meta, &[5, 11][..keep], &mut buf).expect("rewrite");
        let view = BatchView::parse(&buf[..short.total_len()]).expect("parse");
        let h = view.header();
        assert_eq!(h.indices, [5, 11][..keep].to_vec());
        assert_eq!(h.tensors[0].shape, vec![keep as u64, 2, 5]);
        assert_eq!(h.tensors[1].shape, vec![keep as u64]);
        assert_eq!(view.payload(0).expect("data"), (0..10 * keep).map(|i| i as u8).collect::<Vec<_>>());
        assert_eq!(view.payload(1).expect("label"), [1i64, 2].map(i64::to_le_bytes).concat()[..8 * keep].to_vec());
    }
    assert!(layout.truncated(4).is_err());
    let scalar = BatchLayout::new(2, vec![TensorDesc { name: "x".into(), dtype: Dtype::U8, shape: vec![] }]).expect("layout");
    assert!(scalar.truncated(1).is_err(), "no batch dimension to shorten");
}

#[test]
fn slot_larger_than_batch_is_fine() {
    let mut buf = sample_batch();
    let len = buf.len();
    buf.resize(len + 1000, 0xAB);
    let view = BatchView::parse(&buf).expect("parse");
    assert_eq!(view.header().total_len, len);
}

#[test]
fn write_rejects_small_buffer_and_wrong_index_count() {
    let layout = sample_layout();
    let meta = BatchMeta { job_id: 1, epoch: 0, consumer: 0, seq: 0 };
    let mut small = vec![0u8; layout.total_len() - 1];
    assert!(matches!(layout.write(&meta, &[1, 2, 3], &mut small), Err(BatchError::Layout(_))));
    let mut buf = vec![0u8; layout.total_len()];
    assert!(matches!(layout.write(&meta, &[1, 2], &mut buf), Err(BatchError::Layout(_))));
}

fn table_entry(buf: &[u8], i: usize) -> usize {
    // Entries of the sample layout: "data" (3 dims, name 4) then "label".
    let table = FIXED_HEADER_LEN + 8 * 3;
    if i == 0 { table } else { table + entry_len(3, 4) }
        .min(buf.len())
}

#[test]
fn truncated_buffers_are_rejected() {
    let buf = sample_batch();
    for cut in 0..buf.len() {
        let err = BatchView::parse(&buf[..cut]).expect_err("truncated must fail");
        // One line, says what is wrong.
        assert!(!err.to_string().contains('\n'));
    }
}

#[test]
fn lying_headers_are_rejected() {
    let good = sample_batch();
    let e1 = table_entry(&good, 1);
    type Mutation = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Mutation)> = vec![
        ("magic", Box::new(|b| b[0] = b'X')),
        ("version", Box::new(|b| b[4] = 9)),
        ("total_len past buffer", Box::new(|b| b[8..16].copy_from_slice(&u64::MAX.to_le_bytes()))),
        ("sample_count", Box::new(|b| b[40..44].copy_from_slice(&1000u32.to_le_bytes()))),
        ("tensor_count", Box::new(|b| b[44..48].copy_from_slice(&3u32.to_le_bytes()))),
        ("table_offset", Box::new(|b| b[48..56].copy_from_slice(&8u64.to_le_bytes()))),
        ("offset past end", Box::new(move |b| b[e1..e1 + 8].copy_from_slice(&(1u64 << 40).to_le_bytes()))),
        ("offset overflow", Box::new(move |b| b[e1..e1 + 8].copy_from_slice(&(u64::MAX - 63).to_le_bytes()))),
        ("length lies", Box::new(move |b| b[e1 + 8..e1 + 16].copy_from_slice(&4096u64.to_le_bytes()))),
        ("dtype", Box::new(move |b| b[e1 + 16] = 200)),
        ("ndim", Box::new(move |b| b[e1 + 17] = 40)),
        ("misaligned", Box::new(move |b| {
            let off = u64::from_le_bytes(b[e1..e1 + 8].try_into().expect("8 bytes"));
            b[e1..e1 + 8].copy_from_slice(&(off + 1).to_le_bytes());
        })),
        ("overlap", Box::new(move |b| {
            let first = table_entry(b, 0);
            let off0 = b[first..first + 8].to_vec();
            b[e1..e1 + 8].copy_from_slice(&off0);
        })),
    ];
    for (what, mutate) in cases {
        let mut buf = good.clone();
        mutate(&mut buf);
        let err = BatchView::parse(&buf).expect_err(what);
        assert!(!err.to_string().contains('\n'), "{what}: {err}");
        // A stream that just saw a good batch rejects the lie just the same.
        let mut cache = TableCache::default();
        BatchView::parse_cached(&good, &mut cache).expect("good");
        let cached = BatchView::parse_cached(&buf, &mut cache).expect_err(what);
        assert_eq!(cached.to_string(), err.to_string(), "{what}");
    }
}

#[test]
fn a_stream_with_one_table_parses_it_once() {
    let mut cache = TableCache::default();
    let first = BatchView::parse_cached(&sample_batch(), &mut cache).expect("first").into_header();
    let layout = sample_layout();
    let mut buf = sample_batch();
    let meta = BatchMeta { job_id: 7, epoch: 1, consumer: 2, seq: 43 };
    layout.write(&meta, &[1, 2, 3], &mut buf).expect("write");
    let second = BatchView::parse_cached(&buf, &mut cache).expect("second").into_header();
    assert!(Arc::ptr_eq(&first.tensors, &second.tensors), "the table was parsed again");
    assert_eq!((second.meta.seq, &second.indices[..]), (43, &[1, 2, 3][..]));
    assert_eq!(second, BatchView::parse(&buf).expect("uncached").into_header());
    // A short last batch has another table: parsed, and cached from then on.
    let short = layout.truncated(1).expect("truncate");
    short.write(&meta, &[8], &mut buf).expect("rewrite");
    let third = BatchView::parse_cached(&buf[..short.total_len()], &mut cache).expect("short").into_header();
    assert_eq!(third.tensors[0].shape, vec![1, 2, 5]);
    assert_eq!(third, BatchView::parse(&buf[..short.total_len()]).expect("uncached").into_header());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = BatchView::parse(&bytes);
    }

    #[test]
    fn random_bytes_after_valid_magic_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.extend_from_slice(&tail);
        if let Ok(view) = BatchView::parse(&bytes) {
            for (i, t) in view.header().tensors.iter().enumerate() {
                prop_assert_eq!(view.payload(i).map(<[u8]>::len), Some(t.len));
            }
        }
    }

    #[test]
    fn mutated_valid_batches_parse_within_bounds(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)
    ) {
        let mut buf = sample_batch();
        for (at, v) in flips {
            let i = at.index(buf.len());
            buf[i] = v;
        }
        if let Ok(view) = BatchView::parse(&buf) {
            let total = view.header().total_len;
            prop_assert!(total <= buf.len());
            for t in view.header().tensors.iter() {
                prop_assert!(t.offset + t.len <= total);
                prop_assert_eq!(t.offset % ALIGN, 0);
            }
        }
    }

    #[test]
    fn a_cached_parse_agrees_with_a_fresh_one(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
    ) {
        // The cache holds the table of a good batch; whatever comes next,
        // mutated or cut, must parse exactly as it would without the cache.
        let good = sample_batch();
        let mut cache = TableCache::default();
        BatchView::parse_cached(&good, &mut cache).expect("good");
        let mut buf = good.clone();
        for (at, v) in flips {
            let i = at.index(buf.len());
            buf[i] = v;
        }
        let buf = &buf[..buf.len() - cut.index(buf.len() / 8 + 1)];
        let fresh = BatchView::parse(buf).map(BatchView::into_header).map_err(|e| e.to_string());
        let cached = BatchView::parse_cached(buf, &mut cache).map(BatchView::into_header).map_err(|e| e.to_string());
        prop_assert_eq!(cached, fresh);
    }

    #[test]
    fn any_layout_round_trips(
        samples in 0usize..40,
        dims in proptest::collection::vec(proptest::collection::vec(0u64..6, 0..4), 1..5),
    ) {
        let tensors: Vec<TensorDesc> = dims.iter().enumerate().map(|(i, d)| {
            let mut shape = vec![samples as u64];
            shape.extend(d);
            TensorDesc { name: format!("t{i}"), dtype: Dtype::F32, shape }
        }).collect();
        let layout = BatchLayout::new(samples, tensors.clone()).expect("layout");
        let mut buf = vec![0u8; layout.total_len()];
        let idx: Vec<u64> = (0..samples as u64).map(|i| i * 3).collect();
        let meta = BatchMeta { job_id: 1, epoch: 2, consumer: 3, seq: 4 };
        let payloads = layout.write(&meta, &idx, &mut buf).expect("write");
        for p in payloads { p.fill(0x5A); }
        let view = BatchView::parse(&buf).expect("parse");
        prop_assert_eq!(&view.header().indices, &idx);
        for (i, t) in tensors.iter().enumerate() {
            prop_assert_eq!(&view.header().tensors[i].shape, &t.shape);
            prop_assert!(view.payload(i).expect("payload").iter().all(|&b| b == 0x5A));
        }
    }
}
