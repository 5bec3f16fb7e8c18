//! The file-backed datasets on files written here: what they read, and that
//! every problem is one line naming the file.

use std::path::Path;

use loader_proto::pb::{
    Decode, Dtype, ImageFolderSpec, NpyArray, NpySpec, Resize, Transform, WebDatasetSpec, transform::Op,
};

use super::*;

fn key(index: u64) -> SampleKey {
    SampleKey { seed: 1, epoch: 0, index }
}

/// A version 1 `.npy` file.
fn write_npy(path: &Path, descr: &str, shape: &str, data: &[u8]) {
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).expect("write npy");
}

fn npy_spec(dir: &Path, rows: u64) -> NpySpec {
    let arrays = ["a", "b"].map(|n| NpyArray { name: n.into(), path: dir.join(format!("{n}.npy")).display().to_string() });
    NpySpec { arrays: arrays.to_vec(), num_samples: rows }
}

#[test]
fn npy_rows_are_copied_from_each_array() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a: Vec<u8> = (0..10u16 * 2).flat_map(u16::to_le_bytes).collect();
    write_npy(&dir.path().join("a.npy"), "<u2", "(10, 2)", &a);
    write_npy(&dir.path().join("b.npy"), "|u1", "(10,)", &(100..110).collect::<Vec<u8>>());
    let ds = Npy::open(&npy_spec(dir.path(), 10)).expect("open");
    let t: Vec<(&str, Dtype, &[u64])> = ds.tensors().iter().map(|t| (t.name.as_str(), t.dtype, &t.shape[..])).collect();
    assert_eq!(t, vec![("a", Dtype::U16, &[2u64][..]), ("b", Dtype::U8, &[][..])]);
    let (mut ra, mut rb) = ([0u8; 4], [0u8; 1]);
    ds.read_into(key(7), &mut [&mut ra[..], &mut rb[..]]).expect("row 7");
    assert_eq!((ra, rb), ([14, 0, 15, 0], [107]));
    assert!(matches!(ds.read_into(key(10), &mut [&mut ra[..], &mut rb[..]]), Err(DatasetError::IndexOutOfRange { .. })));

    let e = Npy::open(&npy_spec(dir.path(), 12)).expect_err("planned for more rows");
    let a_path = dir.path().join("a.npy").display().to_string();
    assert_eq!(e.to_string(), format!("npy dataset {a_path}: holds 10 rows, the job was planned for 12"));

    // Truncated after the job was planned (the header still says 10 rows):
    // the open says the file changed, naming it.
    let b_path = dir.path().join("b.npy");
    let len = std::fs::metadata(&b_path).expect("stat").len();
    std::fs::OpenOptions::new().write(true).open(&b_path).expect("open").set_len(len - 4).expect("truncate");
    let e = Npy::open(&npy_spec(dir.path(), 10)).expect_err("truncated");
    assert_eq!(
        e.to_string(),
        format!(
            "npy dataset {}: file holds {} bytes, its header's shape [10] of uint8 needs {len}: the file changed since the job \
             was planned, or this host's copy differs; start a new job on the file as it is now",
            b_path.display(),
            len - 4
        )
    );
}

fn pipeline() -> Vec<Transform> {
    vec![
        Transform { op: Some(Op::Decode(Decode {})) },
        Transform { op: Some(Op::Resize(Resize { size: vec![4, 4], ..Default::default() })) },
    ]
}

/// A small JPEG.
fn jpeg() -> Vec<u8> {
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, 90)
        .encode(&[120u8; 8 * 6 * 3], 8, 6, jpeg_encoder::ColorType::Rgb)
        .expect("encode");
    out
}

#[test]
fn an_image_folder_that_changed_since_submission_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("a")).expect("mkdir");
    std::fs::write(dir.path().join("a/x.jpg"), jpeg()).expect("write");
    std::fs::write(dir.path().join("a/y.jpg"), b"garbage").expect("write");
    let listing = loader_listing::image_folder::list(dir.path(), None).expect("list");
    let spec = ImageFolderSpec {
        path: dir.path().display().to_string(),
        manifest: String::new(),
        num_samples: 2,
        fingerprint: listing.fingerprint(),
        listing: String::new(),
    };
    let ds = ImageFolder::open(&spec, &pipeline()).expect("open");
    let (mut image, mut label) = (vec![0u8; ds.tensors()[0].shape.iter().product::<u64>() as usize], [0u8; 8]);
    ds.read_into(key(0), &mut [&mut image[..], &mut label[..]]).expect("decodes");
    assert_eq!(label, 0i64.to_le_bytes());
    let e = ds.read_into(key(1), &mut [&mut image[..], &mut label[..]]).expect_err("corrupt");
    let bad = dir.path().join("a/y.jpg").display().to_string();
    assert!(matches!(&e, DatasetError::Corrupt { path, .. } if *path == bad), "{e}");

    std::fs::write(dir.path().join("a/z.png"), b"new").expect("write");
    let e = ImageFolder::open(&spec, &pipeline()).expect_err("changed").to_string();
    assert!(e.starts_with(&format!("image_folder dataset {}: this worker lists 3 images", spec.path)), "{e}");
    assert!(!e.contains('\n'));
}

#[test]
fn webdataset_samples_without_an_image_or_label_are_corrupt_and_named_by_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.tar");
    let mut b = tar::Builder::new(Vec::new());
    let members: [(&str, Vec<u8>); 5] = [
        ("k0.jpg", jpeg()),
        ("k0.cls", b"4".to_vec()),
        ("k1.cls", b"1".to_vec()),
        ("k2.jpg", jpeg()),
        ("k2.cls", b"dog".to_vec()),
    ];
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, data.as_slice()).expect("append");
    }
    std::fs::write(&path, b.into_inner().expect("tar")).expect("write");
    let shard = path.display().to_string();
    let spec = WebDatasetSpec { shards: vec![shard.clone()], shard_samples: vec![3] };
    let ds = WebDataset::open(&spec, &pipeline()).expect("open");
    assert_eq!(ds.len(), 3);
    let (mut image, mut label) = (vec![0u8; 3 * 4 * 4], [0u8; 8]);
    ds.read_into(key(0), &mut [&mut image[..], &mut label[..]]).expect("sample 0");
    assert_eq!(label, 4i64.to_le_bytes());
    let mut corrupt = |i| ds.read_into(key(i), &mut [&mut image[..], &mut label[..]]).expect_err("corrupt").to_string();
    assert_eq!(corrupt(1), format!("corrupt sample {shard}:k1: no .jpg, .jpeg or .png member"));
    assert_eq!(corrupt(2), format!("corrupt sample {shard}:k2: label \"dog\" is not an integer"));

    let e = WebDataset::open(&WebDatasetSpec { shard_samples: vec![4], ..spec }, &pipeline()).expect_err("count");
    assert_eq!(e.to_string(), format!("webdataset dataset {shard}: holds 3 samples, the job was submitted with 4; the shard changed since"));
}

#[test]
fn a_custom_dataset_needs_a_worker_that_registered_it() {
    use loader_proto::pb::{CustomSpec, DatasetSpec, JobSpec, dataset_spec::Kind};
    let spec = JobSpec {
        dataset: Some(DatasetSpec {
            kind: Some(Kind::Custom(CustomSpec { name: "mine".into(), num_samples: 5, ..Default::default() })),
        }),
        ..Default::default()
    };
    let e = open(&spec).expect_err("stock worker");
    assert_eq!(e.to_string(), "dataset.custom.name: this worker has no dataset `mine`; run a worker binary that registers it");
    let datasets = Datasets::new().register("mine", |c: &CustomSpec| {
        let s = loader_proto::pb::SyntheticSpec { num_samples: c.num_samples, shape: vec![1], dtype: Dtype::U8 as i32, cost_ns: 0, wait_ns_by_epoch: Vec::new() };
        Ok(std::sync::Arc::new(Synthetic::new(&s)?) as std::sync::Arc<dyn Dataset>)
    });
    assert_eq!(datasets.open(&spec).expect("registered").len(), 5);
}

/// A token file of `windows` windows of 4 + 1 u16 ids counting up from `first`.
fn write_tokens(path: &Path, first: u16, windows: u16) -> loader_proto::pb::TokensSpec {
    let ids: Vec<u8> = (first..first + windows * 4 + 1).flat_map(u16::to_le_bytes).collect();
    std::fs::write(path, ids).expect("write tokens");
    loader_proto::pb::TokensSpec {
        path: path.display().to_string(),
        dtype: Dtype::U16 as i32,
        context_length: 4,
        num_tokens: u64::from(windows) * 4 + 1,
    }
}

fn mix_job(dir: &Path) -> loader_proto::pb::JobSpec {
    use loader_proto::pb::{DatasetSpec, JobSpec, MixSource, MixSpec, SamplerSpec, dataset_spec::Kind};
    let source = |name: &str, weight, tokens| MixSource {
        name: name.into(),
        weight,
        dataset: Some(DatasetSpec { kind: Some(Kind::Tokens(tokens)) }),
    };
    let mix = MixSpec {
        sources: vec![
            source("a", 0.6, write_tokens(&dir.join("a.bin"), 0, 6)),
            source("b", 0.4, write_tokens(&dir.join("b.bin"), 1000, 9)),
        ],
        samples_per_epoch: 10,
        block: 5,
        source_field: "source".into(),
        ..Default::default()
    };
    JobSpec {
        dataset: Some(DatasetSpec { kind: Some(Kind::Mix(mix)) }),
        sampler: Some(SamplerSpec { shuffle: true, seed: 3, ..Default::default() }),
        batch_size: 5,
        epochs: 4,
        ..Default::default()
    }
}

/// One mixture sample read on its own: (first token, source field).
fn mix_sample(ds: &dyn Dataset, key: SampleKey) -> (u16, i64) {
    let (mut tokens, mut source) = ([0u8; 10], [0u8; 8]);
    ds.read_into(key, &mut [&mut tokens[..], &mut source[..]]).expect("read a sample");
    (u16::from_le_bytes([tokens[0], tokens[1]]), i64::from_le_bytes(source))
}

#[test]
fn a_mixture_reads_a_batch_as_its_samples_one_by_one() {
    // read_batch draws the whole batch first, prefetches and reads: the
    // rows must be what read_into gives sample by sample, in key order.
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = open(&mix_job(dir.path())).expect("open the mixture");
    for epoch in 0..4 {
        let keys: Vec<SampleKey> = (0..10).map(|index| SampleKey { seed: 3, epoch, index }).collect();
        let (mut tokens, mut source) = (vec![0u8; 10 * 10], vec![0u8; 10 * 8]);
        let mut rows = BatchRows::new(vec![&mut tokens[..], &mut source[..]], 10, CorruptPolicy::Fail, true);
        ds.read_batch(&keys, &mut rows).expect("read the batch");
        assert_eq!(rows.finish().0, (0..10).collect::<Vec<u64>>());
        for (i, &key) in keys.iter().enumerate() {
            let first = u16::from_le_bytes([tokens[i * 10], tokens[i * 10 + 1]]);
            let field = i64::from_le_bytes(source[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            assert_eq!((first, field), mix_sample(ds.as_ref(), key), "epoch {epoch}, sample {i}");
            // Each window is its source's: a's ids count from 0, b's from 1000.
            assert_eq!(field, i64::from(first >= 1000));
        }
    }
}

#[test]
fn a_mixture_batch_with_a_sample_past_the_epoch_fails_after_reading_those_before() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ds = open(&mix_job(dir.path())).expect("open the mixture");
    let keys: Vec<SampleKey> = [0, 1, 10, 2].map(|index| SampleKey { seed: 3, epoch: 0, index }).to_vec();
    let (mut tokens, mut source) = (vec![0u8; 4 * 10], vec![0u8; 4 * 8]);
    let mut rows = BatchRows::new(vec![&mut tokens[..], &mut source[..]], 4, CorruptPolicy::Skip, true);
    let e = ds.read_batch(&keys, &mut rows).expect_err("index 10 is past an epoch of 10");
    assert!(matches!(e, DatasetError::IndexOutOfRange { index: 10, len: 10 }), "{e}");
    assert_eq!(rows.finish().0, vec![0, 1]);
}

#[test]
fn a_prefetch_hint_past_a_file_does_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = Tokens::open(&write_tokens(&dir.path().join("a.bin"), 0, 6)).expect("open tokens");
    for index in [5, 6, u64::MAX / 4, u64::MAX] {
        tokens.prefetch(key(index));
    }
    let mut a = [0u8; 4];
    write_npy(&dir.path().join("a.npy"), "<u2", "(3, 2)", &[0; 12]);
    write_npy(&dir.path().join("b.npy"), "|u1", "(3,)", &[0; 3]);
    let npy = Npy::open(&npy_spec(dir.path(), 3)).expect("open npy");
    for index in [2, 3, u64::MAX] {
        npy.prefetch(key(index));
    }
    let mut b = [0u8; 1];
    npy.read_into(key(2), &mut [&mut a[..], &mut b[..]]).expect("the last row still reads");
}
