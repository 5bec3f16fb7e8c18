//! Collate: one batch, written in place into one contiguous buffer in the
//! wire format of `loader_proto::batch`.
//!
//! The layout is computed first, so the caller can pick a destination that
//! fits: a buffer allocated once at its final size, whose frozen `Bytes` then
//! travels to the gRPC stream without another copy, or a shared-memory slot.
//! Either way the layout writes the header and tensor table, and the dataset
//! writes each sample straight into its row of each tensor.

use bytes::{Bytes, BytesMut};
use loader_proto::batch::{BatchError, BatchLayout, BatchMeta, TensorDesc};

use crate::dataset::{Dataset, DatasetError};

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

/// The layout of a batch of `indices.len()` samples of `dataset`.
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
pub fn collate(dataset: &dyn Dataset, meta: &BatchMeta, indices: &[u64]) -> Result<Bytes, CollateError> {
    let layout = layout(dataset, indices.len())?;
    collate_bytes(dataset, &layout, meta, indices)
}

/// Builds the batch `meta` with a `layout` already computed, in a buffer of
/// its own (for a gRPC stream).
pub fn collate_bytes(
    dataset: &dyn Dataset,
    layout: &BatchLayout,
    meta: &BatchMeta,
    indices: &[u64],
) -> Result<Bytes, CollateError> {
    let mut buf = BytesMut::zeroed(layout.total_len());
    fill(dataset, layout, meta, indices, &mut buf, true)?;
    Ok(buf.freeze())
}

/// Writes the batch `meta` at the front of `buf` (a shared-memory slot),
/// which may hold stale bytes and be longer than the batch. Returns the
/// batch's length.
pub fn collate_into(
    dataset: &dyn Dataset,
    layout: &BatchLayout,
    meta: &BatchMeta,
    indices: &[u64],
    buf: &mut [u8],
) -> Result<usize, CollateError> {
    fill(dataset, layout, meta, indices, buf, false)?;
    Ok(layout.total_len())
}

fn fill(
    dataset: &dyn Dataset,
    layout: &BatchLayout,
    meta: &BatchMeta,
    indices: &[u64],
    buf: &mut [u8],
    zeroed: bool,
) -> Result<(), CollateError> {
    let mut payloads = layout.write(meta, indices, buf)?;
    if !zeroed && !dataset.writes_whole_rows() {
        // `Dataset::read_into` is promised zeroed rows.
        for p in &mut payloads {
            p.fill(0);
        }
    }
    if !indices.is_empty() {
        // Each payload splits into one equal row per sample; walking the rows
        // with iterators hands out disjoint `&mut` rows without copying.
        let mut tensors: Vec<_> = payloads
            .into_iter()
            .map(|p| {
                let row = p.len() / indices.len();
                p.chunks_exact_mut(row.max(1))
            })
            .collect();
        let mut rows = Vec::with_capacity(tensors.len());
        for &index in indices {
            rows.clear();
            rows.extend(tensors.iter_mut().filter_map(Iterator::next));
            dataset.read_into(index, &mut rows)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use loader_proto::batch::BatchView;
    use loader_proto::pb::{Dtype, SyntheticSpec, TokensSpec};

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
            })
            .expect("dataset");
            let indices = [0u64, 999, 251, 300, 7];
            let bytes = collate(&ds, &meta(11), &indices).expect("collate");
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
        let ds = Synthetic::new(&SyntheticSpec { num_samples: 4, shape: vec![2], dtype: Dtype::U8 as i32, cost_ns: 0 })
            .expect("dataset");
        let e = collate(&ds, &meta(0), &[1, 4]).expect_err("out of range");
        assert_eq!(e.to_string(), "sample index 4 is out of range for a dataset of 4 samples");
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
            let bytes = collate(&ds, &meta(3), &indices).expect("collate");
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
            let e = collate(&ds, &meta(3), &[ds.len()]).expect_err("past the end");
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
            format!("tokens dataset {path}: file holds 1000 bytes, spec says 2048 tokens of uint16 (4096 bytes)")
        );
    }
}
