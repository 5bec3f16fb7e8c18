//! `tokens`: a flat little-endian file of uint16/uint32 token ids, cut into
//! overlapping windows of `context_length + 1` ids (inputs plus the shifted
//! target), window `i` starting at token `i * context_length`.
//!
//! The file is memory-mapped once per job; a window is one `memcpy` from the
//! page cache into the batch buffer. The mapping is guarded
//! (`crate::mapped`): a file truncated while a job reads it fails (or skips)
//! the job's samples, naming the file, instead of killing the worker.

use std::fs::File;

use loader_proto::pb::{Dtype, TokensSpec};
use crate::mapped::MappedFile;

use super::{Dataset, DatasetError, SampleKey, SampleTensor, check_rows};

const KIND: &str = "tokens";

/// A mapped token file.
#[derive(Debug)]
pub struct Tokens {
    /// The whole file, read-only.
    map: MappedFile,
    /// The file as the spec names it, for errors.
    path: String,
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
        let open_err = |source| DatasetError::Open { kind: KIND, path: path.clone(), source };
        let file = File::open(&spec.path).map_err(open_err)?;
        let actual = file.metadata().map_err(open_err)?.len();
        let expected = spec.num_tokens.checked_mul(size);
        if expected != Some(actual) {
            return Err(mismatch(format!(
                "file holds {actual} bytes, spec says {} tokens of {} ({} bytes)",
                spec.num_tokens,
                dtype.short_name(),
                expected.map_or_else(|| "too many".to_owned(), |e| e.to_string()),
            )));
        }
        let (Ok(stride), Some(window)) = (
            usize::try_from(ctx * size),
            (ctx + 1).checked_mul(size).and_then(|w| usize::try_from(w).ok()),
        ) else {
            return Err(mismatch(format!("context length {ctx} is too large")));
        };
        let map = MappedFile::map(&file).map_err(open_err)?;
        Ok(Self {
            map,
            path,
            tensors: vec![SampleTensor { name: "tokens".into(), dtype, shape: vec![ctx + 1] }],
            stride,
            window,
            len: (spec.num_tokens - 1) / ctx,
        })
    }
}

impl Tokens {
    /// The bytes of window `index`, if the file holds it.
    fn window(&self, index: u64) -> Option<&[u8]> {
        usize::try_from(index)
            .ok()
            .filter(|_| index < self.len)
            .and_then(|i| i.checked_mul(self.stride))
            .and_then(|start| self.map.bytes().get(start..start.checked_add(self.window)?))
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
        if let Some(bytes) = self.window(key.index) {
            super::prefetch::bytes(bytes);
        }
    }

    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        let index = key.index;
        check_rows(index, rows, &[self.window])?;
        let bytes = self.window(index);
        let (Some(bytes), [row]) = (bytes, rows) else {
            return Err(DatasetError::IndexOutOfRange { index, len: self.len });
        };
        row.copy_from_slice(bytes);
        self.map.intact().map_err(|c| DatasetError::changed(&self.path, c))
    }
}
