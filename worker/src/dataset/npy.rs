//! `npy`: sample `i` is row `i` of each of one or more `.npy` arrays, each
//! array a tensor named by the spec.
//!
//! Every file is memory-mapped once per job; a row is one `memcpy` from the
//! page cache into the batch buffer. Headers are read with
//! `loader_listing::npy`, the code the submitter counted the rows with.

use std::path::Path;
use std::sync::Arc;

use loader_listing::source::Source;
use loader_proto::pb::NpySpec;

use super::data_file::DataFile;
use super::{Dataset, DatasetError, SampleKey, SampleTensor, check_rows};

const KIND: &str = "npy";

/// One array: a mapped file or an object (`data_file`).
#[derive(Debug)]
struct Column {
    file: DataFile,
    /// Offset of row 0 in the file.
    data_offset: usize,
    /// Bytes per row.
    row: usize,
}

impl Column {
    /// Where row `index` starts, if the file holds it.
    fn row_start(&self, index: u64) -> Option<u64> {
        let start = u64::try_from(self.row).ok()?.checked_mul(index)?.checked_add(self.data_offset as u64)?;
        self.file.holds(start, self.row as u64).then_some(start)
    }
}

/// Rows of mapped `.npy` arrays.
#[derive(Debug)]
pub struct Npy {
    /// One per array, in spec order (the order of `tensors`).
    columns: Vec<Column>,
    /// One tensor per array: its name, dtype and row shape.
    tensors: Vec<SampleTensor>,
    /// Bytes of each tensor's row, checked against the rows handed in.
    row_bytes: Vec<usize>,
    /// Rows in every array.
    len: u64,
}

impl Npy {
    /// Maps every array a spec names and checks that each holds the rows
    /// the job was planned for.
    pub fn open(spec: &NpySpec) -> Result<Self, DatasetError> {
        let mut columns = Vec::with_capacity(spec.arrays.len());
        let mut tensors = Vec::with_capacity(spec.arrays.len());
        for array in &spec.arrays {
            let mismatch = |problem: String| DatasetError::Mismatch { kind: KIND, path: array.path.clone(), problem };
            let (file, header) = with_header(&array.path)?;
            if header.data_end().is_none_or(|end| end > file.len()) {
                let holds = format!(
                    "file holds {} bytes, its header's shape {:?} of {} needs {}",
                    file.len(),
                    header.shape,
                    header.dtype.short_name(),
                    header.data_end().map_or_else(|| "too many".to_owned(), |e| e.to_string()),
                );
                return Err(DatasetError::resized(KIND, &array.path, holds));
            }
            if header.rows() != spec.num_samples {
                return Err(mismatch(format!(
                    "holds {} rows, the job was planned for {}",
                    header.rows(),
                    spec.num_samples
                )));
            }
            let (Some(row), Ok(data_offset)) = (
                header.row_bytes().and_then(|r| usize::try_from(r).ok()),
                usize::try_from(header.data_offset),
            ) else {
                return Err(mismatch(format!("rows of shape {:?} are too large", header.row_shape())));
            };
            tensors.push(SampleTensor {
                name: array.name.clone(),
                dtype: header.dtype,
                shape: header.row_shape().to_vec(),
            });
            columns.push(Column { file, data_offset, row });
        }
        let row_bytes = columns.iter().map(|c| c.row).collect();
        Ok(Self { columns, tensors, row_bytes, len: spec.num_samples })
    }
}

impl Dataset for Npy {
    fn tensors(&self) -> &[SampleTensor] {
        &self.tensors
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn writes_whole_rows(&self) -> bool {
        // Each row is copied whole.
        true
    }

    fn prefetch(&self, key: SampleKey) {
        if key.index < self.len {
            for column in &self.columns {
                if let Some(start) = column.row_start(key.index) {
                    column.file.prefetch(start, column.row);
                }
            }
        }
    }

    fn fetches_ahead(&self) -> bool {
        self.columns.iter().any(|c| c.file.may_fetch())
    }

    fn prefetch_batch(&self, keys: &[SampleKey]) {
        if self.fetches_ahead() {
            for column in &self.columns {
                column.file.read_in_batches_of(keys.len());
            }
            for &key in keys {
                self.prefetch(key);
            }
        }
    }

    fn read_batch(&self, keys: &[SampleKey], batch: &mut super::BatchRows<'_>) -> Result<(), DatasetError> {
        // Every chunk the batch needs is asked for at once.
        self.prefetch_batch(keys);
        super::read_each(self, keys, batch)
    }

    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        let index = key.index;
        check_rows(index, rows, &self.row_bytes)?;
        if index >= self.len {
            return Err(DatasetError::IndexOutOfRange { index, len: self.len });
        }
        for (column, row) in self.columns.iter().zip(rows.iter_mut()) {
            // Checked at open: the file holds `len` rows after data_offset.
            let Some(start) = column.row_start(index) else {
                return Err(DatasetError::IndexOutOfRange { index, len: self.len });
            };
            column.file.read_at(KIND, start, row)?;
        }
        Ok(())
    }
}

/// The npy file at `path`, opened, and its header. The file is opened
/// first: its length is what `Npy::open` checks the header's data against
/// (the length every read will see), and an object's header is read
/// through the chunks its rows are read from, so the first chunk is
/// fetched once.
fn with_header(path: &str) -> Result<(DataFile, loader_listing::npy::NpyHeader), DatasetError> {
    let file = DataFile::open(KIND, path)?;
    let header = match file.object() {
        Some(object) => loader_listing::npy::read_header_of(Source::object(Arc::clone(object)), file.len(), Path::new(path)),
        None => loader_listing::npy::read_header_only(Path::new(path)),
    };
    Ok((file, header.map_err(|e| DatasetError::listing(KIND, e))?))
}
