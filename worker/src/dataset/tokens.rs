//! `tokens`: a flat little-endian file of uint16/uint32 token ids, cut into
//! overlapping windows of `context_length + 1` ids (inputs plus the shifted
//! target), window `i` starting at token `i * context_length`.
//!
//! A local file is memory-mapped once per job; a window is one `memcpy`
//! from the page cache into the batch buffer. The mapping is guarded
//! (`crate::mapped`): a file truncated while a job reads it fails (or skips)
//! the job's samples, naming the file, instead of killing the worker.
//!
//! An object in a store (`s3://...`) is read in chunks of a few MB
//! (`loader_storage::object`): a window is a copy out of the chunk that
//! holds it, and `prefetch` starts fetching the chunks of the windows the
//! worker reads next.

use loader_proto::pb::{Dtype, TokensSpec};

use super::data_file::DataFile;
use super::{Dataset, DatasetError, SampleKey, SampleTensor, check_rows};

const KIND: &str = "tokens";

/// A token file or object.
#[derive(Debug)]
pub struct Tokens {
    file: DataFile,
    /// The single tensor `tokens` [context_length + 1].
    tensors: Vec<SampleTensor>,
    /// Bytes between the starts of consecutive windows.
    stride: usize,
    /// Bytes of one window.
    window: usize,
    /// Windows in the file.
    len: u64,
}

impl Tokens {
    /// Maps the file a spec names and checks its size against the spec, so a
    /// truncated or mislabelled file fails at open, naming the file.
    pub fn open(spec: &TokensSpec) -> Result<Self, DatasetError> {
        let path = spec.path.clone();
        let mismatch = |problem: String| DatasetError::Mismatch { kind: KIND, path: path.clone(), problem };
        let dtype = match Dtype::try_from(spec.dtype) {
            Ok(d @ (Dtype::U16 | Dtype::U32)) => d,
            _ => return Err(mismatch(format!("dtype code {} is not uint16 or uint32", spec.dtype))),
        };
        let ctx = spec.context_length;
        if ctx == 0 || spec.num_tokens <= ctx {
            return Err(mismatch(format!(
                "{} tokens cannot fill one window of {ctx} + 1 ids",
                spec.num_tokens
            )));
        }
        let size = dtype.size() as u64;
        let file = DataFile::open(KIND, &spec.path)?;
        let actual = file.len();
        let expected = spec.num_tokens.checked_mul(size);
        if expected != Some(actual) {
            let holds = format!(
                "file holds {actual} bytes, spec says {} tokens of {} ({} bytes)",
                spec.num_tokens,
                dtype.short_name(),
                expected.map_or_else(|| "too many".to_owned(), |e| e.to_string()),
            );
            return Err(DatasetError::resized(KIND, &spec.path, holds));
        }
        let (Ok(stride), Some(window)) = (
            usize::try_from(ctx * size),
            (ctx + 1).checked_mul(size).and_then(|w| usize::try_from(w).ok()),
        ) else {
            return Err(mismatch(format!("context length {ctx} is too large")));
        };
        Ok(Self {
            file,
            tensors: vec![SampleTensor { name: "tokens".into(), dtype, shape: vec![ctx + 1] }],
            stride,
            window,
            len: (spec.num_tokens - 1) / ctx,
        })
    }
}

impl Tokens {
    /// Where window `index` starts, if the file holds it.
    fn start(&self, index: u64) -> Option<u64> {
        let start = u64::try_from(self.stride).ok()?.checked_mul(index).filter(|_| index < self.len)?;
        self.file.holds(start, self.window as u64).then_some(start)
    }
}

impl Dataset for Tokens {
    fn tensors(&self) -> &[SampleTensor] {
        &self.tensors
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn writes_whole_rows(&self) -> bool {
        // Each row is one window copied whole.
        true
    }

    fn prefetch(&self, key: SampleKey) {
        if let Some(start) = self.start(key.index) {
            self.file.prefetch(start, self.window);
        }
    }

    fn fetches_ahead(&self) -> bool {
        self.file.may_fetch()
    }

    fn prefetch_batch(&self, keys: &[SampleKey]) {
        if self.file.may_fetch() {
            self.file.read_in_batches_of(keys.len());
            for &key in keys {
                self.prefetch(key);
            }
        }
    }

    fn read_batch(&self, keys: &[SampleKey], batch: &mut super::BatchRows<'_>) -> Result<(), DatasetError> {
        // Every chunk the batch needs is asked for at once: one round
        // trip's wait for the batch, not one per chunk.
        self.prefetch_batch(keys);
        super::read_each(self, keys, batch)
    }

    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        let index = key.index;
        check_rows(index, rows, &[self.window])?;
        let in_range = (index < self.len).then(|| (self.stride as u64).checked_mul(index)).flatten();
        let (Some(start), [row]) = (in_range, rows) else {
            return Err(DatasetError::IndexOutOfRange { index, len: self.len });
        };
        // A local file, the common case: one copy out of the mapping, with
        // nothing of an object's path on the way (3% of a batch of 8
        // windows, in a same-run A/B).
        if let Some(bytes) = self.file.mapped(start, self.window as u64) {
            row.copy_from_slice(bytes);
            return self.file.intact();
        }
        self.file.read_at(KIND, start, row)
    }
}
