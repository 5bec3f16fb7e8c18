//! Collate: one batch, written in place into one contiguous buffer in the
//! wire format of `loader_proto::batch`.
//!
//! The layout is computed first, so the caller can pick a destination that
//! fits: a buffer allocated once at its final size, whose frozen `Bytes` then
//! travels to the gRPC stream without another copy, or a shared-memory slot.
//! Either way the layout writes the header and tensor table, and the dataset
//! writes each sample straight into its row of each tensor.
//!
//! Corrupt samples: under the `fail` policy the first one fails the batch
//! (and so the job). Under `skip` it is left out: the next sample is written
//! into the same rows, and at the end the header, index list and tensor
//! table are written again for the samples actually held
//! ([`BatchLayout::truncated`]), so the batch is one row shorter per skipped
//! sample and its index list says exactly which samples it holds. The caller
//! logs and counts what was skipped.

use std::time::{Duration, Instant};

use bytes::Bytes;
use loader_proto::batch::{BatchError, BatchLayout, BatchMeta, TensorDesc};
use loader_proto::pb::CorruptPolicy;

pub use crate::dataset::Skipped;
use crate::batch_buffers::BatchBuffer;
use crate::dataset::{BatchRows, Dataset, DatasetError, MadeBatch, SampleKey};

/// Why a batch could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CollateError {
    /// A sample could not be read.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// The batch cannot be laid out (too many samples, too large).
    #[error(transparent)]
    Layout(#[from] BatchError),
}

/// What a job says about every sample of its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchRules {
    /// The job's sampler seed, part of every [`SampleKey`].
    pub seed: u64,
    /// Fail the batch on a corrupt sample, or leave the sample out.
    pub on_corrupt: CorruptPolicy,
}

impl Default for BatchRules {
    fn default() -> Self {
        Self { seed: 0, on_corrupt: CorruptPolicy::Fail }
    }
}

/// A batch written into a buffer.
#[derive(Debug)]
pub struct Collated {
    /// Bytes of the batch at the front of the buffer.
    pub len: usize,
    /// Samples left out, in batch order.
    pub skipped: Vec<Skipped>,
    /// Time spent reading (and transforming) the samples, of the whole
    /// time the batch took: the worker's per-stage timings.
    pub read: Duration,
}

/// The layout of a batch of `samples` samples of `dataset`.
pub fn layout(dataset: &dyn Dataset, samples: usize) -> Result<BatchLayout, BatchError> {
    let tensors = dataset
        .tensors()
        .iter()
        .map(|t| {
            let mut shape = Vec::with_capacity(t.shape.len() + 1);
            shape.push(samples as u64);
            shape.extend_from_slice(&t.shape);
            TensorDesc { name: t.name.clone(), dtype: t.dtype, shape }
        })
        .collect();
    BatchLayout::new(samples, tensors)
}

/// Builds the batch `meta` holding the samples `indices` of `dataset`.
pub fn collate(
    dataset: &dyn Dataset,
    meta: &BatchMeta,
    indices: &[u64],
    rules: BatchRules,
) -> Result<(Bytes, Vec<Skipped>), CollateError> {
    let layout = layout(dataset, indices.len())?;
    let (bytes, collated) = collate_bytes(dataset, &layout, meta, indices, rules)?;
    Ok((bytes, collated.skipped))
}

/// Builds the batch `meta` with a `layout` already computed, in a buffer of
/// its own (for a gRPC stream).
pub fn collate_bytes(
    dataset: &dyn Dataset,
    layout: &BatchLayout,
    meta: &BatchMeta,
    indices: &[u64],
    rules: BatchRules,
) -> Result<(Bytes, Collated), CollateError> {
    let mut buf = BatchBuffer::take(layout.total_len());
    let zeroed = buf.is_zeroed();
    let collated = fill(dataset, layout, meta, indices, rules, buf.bytes_mut(), zeroed)?;
    Ok((buf.freeze(collated.len), collated))
}

/// Writes the batch `meta` at the front of `buf` (a shared-memory slot),
/// which may hold stale bytes and be longer than the batch.
pub fn collate_into(
    dataset: &dyn Dataset,
    layout: &BatchLayout,
    meta: &BatchMeta,
    indices: &[u64],
    rules: BatchRules,
    buf: &mut [u8],
) -> Result<Collated, CollateError> {
    fill(dataset, layout, meta, indices, rules, buf, false)
}

/// Makes the batch `meta` of samples `indices` whole, for a dataset that
/// [makes whole batches](Dataset::makes_whole_batches), and lays it out.
pub fn make(
    dataset: &dyn Dataset,
    meta: &BatchMeta,
    indices: &[u64],
    rules: BatchRules,
) -> Result<(MadeBatch, BatchLayout, Duration), CollateError> {
    let keys: Vec<SampleKey> =
        indices.iter().map(|&index| SampleKey { seed: rules.seed, epoch: u64::from(meta.epoch), index }).collect();
    let reading = Instant::now();
    let made = dataset.make_batch(&keys, rules.on_corrupt)?;
    let read = reading.elapsed();
    if made.kept.len() + made.skipped.len() != indices.len() {
        return Err(DatasetError::Spec(format!(
            "the dataset made a batch of {} samples and skipped {}, of the batch's {}",
            made.kept.len(),
            made.skipped.len(),
            indices.len()
        ))
        .into());
    }
    let tensors = made
        .tensors
        .iter()
        .map(|t| TensorDesc { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone() })
        .collect();
    let layout = BatchLayout::new(made.kept.len(), tensors)?;
    Ok((made, layout, read))
}

/// Writes a made batch, laid out by [`make`], at the front of `buf`.
pub fn write_made(
    made: MadeBatch,
    layout: &BatchLayout,
    meta: &BatchMeta,
    read: Duration,
    buf: &mut [u8],
) -> Result<Collated, CollateError> {
    let mut payloads = layout.write(meta, &made.kept, buf)?;
    for (payload, tensor) in payloads.iter_mut().zip(&made.tensors) {
        if payload.len() != tensor.bytes.len() {
            return Err(DatasetError::Spec(format!(
                "tensor {:?} of shape {:?} holds {} bytes, its shape and dtype say {}",
                tensor.name,
                tensor.shape,
                tensor.bytes.len(),
                payload.len()
            ))
            .into());
        }
        payload.copy_from_slice(&tensor.bytes);
    }
    Ok(Collated { len: layout.total_len(), skipped: made.skipped, read })
}

/// [`write_made`] into a buffer of its own (for a gRPC stream).
pub fn made_bytes(
    made: MadeBatch,
    layout: &BatchLayout,
    meta: &BatchMeta,
    read: Duration,
) -> Result<(Bytes, Collated), CollateError> {
    let mut buf = BatchBuffer::take(layout.total_len());
    let collated = write_made(made, layout, meta, read, buf.bytes_mut())?;
    Ok((buf.freeze(collated.len), collated))
}

fn fill(
    dataset: &dyn Dataset,
    layout: &BatchLayout,
    meta: &BatchMeta,
    indices: &[u64],
    rules: BatchRules,
    buf: &mut [u8],
    zeroed: bool,
) -> Result<Collated, CollateError> {
    let mut payloads = layout.write(meta, indices, buf)?;
    let whole_rows = dataset.writes_whole_rows();
    if !zeroed && !whole_rows {
        // `Dataset::read_into` is promised zeroed rows.
        for p in &mut payloads {
            p.fill(0);
        }
    }
    let keys: Vec<SampleKey> =
        indices.iter().map(|&index| SampleKey { seed: rules.seed, epoch: u64::from(meta.epoch), index }).collect();
    let mut rows = BatchRows::new(payloads, indices.len(), rules.on_corrupt, whole_rows);
    let reading = Instant::now();
    dataset.read_batch(&keys, &mut rows)?;
    let (kept, skipped) = rows.finish();
    let read = reading.elapsed();
    if kept.len() + skipped.len() != indices.len() {
        // A dataset's own `read_batch` that lost count: never a short batch
        // that silently misses samples.
        return Err(DatasetError::Spec(format!(
            "the dataset settled {} of the batch's {} samples",
            kept.len() + skipped.len(),
            indices.len()
        ))
        .into());
    }
    if skipped.is_empty() {
        return Ok(Collated { len: layout.total_len(), skipped, read });
    }
    let short = layout.truncated(kept.len())?;
    short.write(meta, &kept, buf)?;
    Ok(Collated { len: short.total_len(), skipped, read })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use loader_proto::batch::BatchView;
    use loader_proto::pb::{CorruptPolicy, Dtype, SyntheticSpec, TokensSpec};

    use super::*;
    use crate::dataset::{Synthetic, Tokens, synthetic::expected_data};

    fn meta(seq: u64) -> BatchMeta {
        BatchMeta { job_id: 7, epoch: 1, consumer: 2, seq }
    }

    #[test]
    fn synthetic_batch_parses_and_holds_the_pattern() {
        for (shape, dtype) in [(vec![3u64, 5], Dtype::U8), (vec![1], Dtype::U16), (vec![4, 4], Dtype::F32)] {
            let ds = Synthetic::new(&SyntheticSpec {
                num_samples: 1000,
                shape: shape.clone(),
                dtype: dtype as i32,
                cost_ns: 0,
                wait_ns_by_epoch: Vec::new(),
            })
            .expect("dataset");
            let indices = [0u64, 999, 251, 300, 7];
            let bytes = collate(&ds, &meta(11), &indices, BatchRules::default()).expect("collate").0;
            let view = BatchView::parse(&bytes).expect("parse");
            let h = view.header();
            assert_eq!(h.meta, meta(11));
            assert_eq!(h.indices, indices);
            assert_eq!(h.total_len, bytes.len());
            let row = shape.iter().product::<u64>() as usize * dtype.size();
            let data = view.payload_by_name("data").expect("data");
            assert_eq!(h.tensors[0].shape[0], 5);
            assert_eq!(&h.tensors[0].shape[1..], &shape[..]);
            assert_eq!(h.tensors[0].dtype, dtype);
            let label = view.payload_by_name("label").expect("label");
            assert_eq!(h.tensors[1].shape, vec![5]);
            assert_eq!(h.tensors[1].dtype, Dtype::I64);
            for (k, &i) in indices.iter().enumerate() {
                assert_eq!(&data[k * row..(k + 1) * row], expected_data(i, row).as_slice(), "sample {i}");
                assert_eq!(&label[k * 8..(k + 1) * 8], &(i as i64).to_le_bytes());
            }
        }
    }

    #[test]
    fn synthetic_index_out_of_range_fails() {
        let ds = Synthetic::new(&SyntheticSpec { num_samples: 4, shape: vec![2], dtype: Dtype::U8 as i32, cost_ns: 0, wait_ns_by_epoch: Vec::new() })
            .expect("dataset");
        let e = collate(&ds, &meta(0), &[1, 4], BatchRules::default()).expect_err("out of range");
        assert_eq!(e.to_string(), "sample index 4 is out of range for a dataset of 4 samples");
    }

    /// Synthetic samples, except that every index divisible by 3 is corrupt
    /// (after scribbling over its rows, as a half-decoded image would).
    #[derive(Debug)]
    struct EveryThirdCorrupt(Synthetic);

    impl Dataset for EveryThirdCorrupt {
        fn tensors(&self) -> &[crate::dataset::SampleTensor] {
            self.0.tensors()
        }
        fn len(&self) -> u64 {
            self.0.len()
        }
        fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
            if key.index.is_multiple_of(3) {
                rows.iter_mut().for_each(|r| r.fill(0xEE));
                return Err(DatasetError::Corrupt { path: format!("/data/{}.jpg", key.index), reason: "bad huffman code".into() });
            }
            self.0.read_into(key, rows)
        }
    }

    #[test]
    fn skip_leaves_corrupt_samples_out_and_the_batch_still_parses() {
        let ds = EveryThirdCorrupt(
            Synthetic::new(&SyntheticSpec { num_samples: 100, shape: vec![5, 3], dtype: Dtype::U16 as i32, cost_ns: 0, wait_ns_by_epoch: Vec::new() })
                .expect("dataset"),
        );
        let skip = BatchRules { seed: 1, on_corrupt: CorruptPolicy::Skip };
        let indices = [1u64, 3, 4, 9, 10, 6];
        let layout = layout(&ds, indices.len()).expect("layout");
        // A stale slot, as a shared-memory ring hands out.
        let mut slot = vec![0xABu8; layout.total_len() + 100];
        let collated = collate_into(&ds, &layout, &meta(5), &indices, skip, &mut slot).expect("collate");
        let (bytes, skipped) = collate(&ds, &meta(5), &indices, skip).expect("collate");
        // The same batch (padding aside, which a stale slot leaves as it was).
        let (in_slot, in_buf) = (BatchView::parse(&slot[..collated.len]).expect("slot"), BatchView::parse(&bytes).expect("buf"));
        assert_eq!(in_slot.header(), in_buf.header());
        for i in 0..2 {
            assert_eq!(in_slot.payload(i), in_buf.payload(i));
        }
        for s in [&collated.skipped, &skipped] {
            let got: Vec<(u64, String)> = s.iter().map(|s| (s.index, s.error.to_string())).collect();
            assert_eq!(got, [3u64, 9, 6].map(|i| (i, format!("corrupt sample /data/{i}.jpg: bad huffman code"))).to_vec());
        }
        let view = BatchView::parse(&bytes).expect("parse");
        let h = view.header();
        assert_eq!(h.indices, vec![1, 4, 10]);
        assert_eq!(h.tensors[0].shape, vec![3, 5, 3]);
        assert_eq!(h.tensors[1].shape, vec![3]);
        let data = view.payload_by_name("data").expect("data");
        let label = view.payload_by_name("label").expect("label");
        for (k, i) in [1u64, 4, 10].into_iter().enumerate() {
            assert_eq!(&data[k * 30..(k + 1) * 30], expected_data(i, 30).as_slice(), "sample {i}");
            assert_eq!(&label[k * 8..(k + 1) * 8], &(i as i64).to_le_bytes());
        }

        let all_bad = collate(&ds, &meta(5), &[3, 6], skip).expect("collate").0;
        let view = BatchView::parse(&all_bad).expect("an empty batch parses");
        assert_eq!((view.header().indices.len(), view.header().tensors[0].shape[0]), (0, 0));

        let e = collate(&ds, &meta(5), &indices, BatchRules::default()).expect_err("fail policy");
        assert_eq!(e.to_string(), "corrupt sample /data/3.jpg: bad huffman code");
    }

    fn token_file(tokens: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("tempfile");
        f.write_all(tokens).expect("write");
        f.flush().expect("flush");
        f
    }

    fn tokens_spec(path: &str, dtype: Dtype, ctx: u64, num_tokens: u64) -> TokensSpec {
        TokensSpec { path: path.into(), dtype: dtype as i32, context_length: ctx, num_tokens }
    }

    #[test]
    fn tokens_batches_copy_windows_verbatim() {
        for (dtype, size) in [(Dtype::U16, 2usize), (Dtype::U32, 4)] {
            let num_tokens = 1001u64;
            let raw: Vec<u8> = (0..num_tokens as usize * size).map(|b| (b * 7 + b / 13) as u8).collect();
            let file = token_file(&raw);
            let path = file.path().to_str().expect("utf-8 path");
            let ctx = 16u64;
            let ds = Tokens::open(&tokens_spec(path, dtype, ctx, num_tokens)).expect("open");
            assert_eq!(ds.len(), (num_tokens - 1) / ctx);
            let last = ds.len() - 1;
            let indices = [0, 3, last, 1, last];
            let bytes = collate(&ds, &meta(3), &indices, BatchRules::default()).expect("collate").0;
            let view = BatchView::parse(&bytes).expect("parse");
            let t = &view.header().tensors[0];
            assert_eq!((t.name.as_str(), t.dtype), ("tokens", dtype));
            assert_eq!(t.shape, vec![indices.len() as u64, ctx + 1]);
            let payload = view.payload(0).expect("payload");
            let window = (ctx as usize + 1) * size;
            for (k, &i) in indices.iter().enumerate() {
                let start = i as usize * ctx as usize * size;
                assert_eq!(&payload[k * window..(k + 1) * window], &raw[start..start + window], "window {i}");
            }
            let e = collate(&ds, &meta(3), &[ds.len()], BatchRules::default()).expect_err("past the end");
            assert!(matches!(e, CollateError::Dataset(DatasetError::IndexOutOfRange { .. })));
        }
    }

    #[test]
    fn tokens_errors_are_one_line_and_name_the_path() {
        let missing = "/nonexistent/loader-test/y.bin";
        let e = Tokens::open(&tokens_spec(missing, Dtype::U16, 4, 2048)).expect_err("missing");
        assert_eq!(
            e.to_string(),
            format!("tokens dataset: cannot open {missing}: No such file or directory (os error 2)")
        );

        let file = token_file(&[0u8; 1000]);
        let path = file.path().to_str().expect("utf-8 path");
        let e = Tokens::open(&tokens_spec(path, Dtype::U16, 4, 2048)).expect_err("wrong size");
        assert_eq!(
            e.to_string(),
            format!(
                "tokens dataset {path}: file holds 1000 bytes, spec says 2048 tokens of uint16 (4096 bytes): \
                 the file changed since the job was planned, or this host's copy differs; start a new job on the file as it is now"
            )
        );
    }
}
