//! `npy`: sample `i` is row `i` of each of one or more `.npy` arrays, each
//! array a tensor named by the spec.
//!
//! Every file is memory-mapped once per job; a row is one `memcpy` from the
//! page cache into the batch buffer. Headers are read with
//! `loader_listing::npy`, the code the submitter counted the rows with.

use std::fs::File;
use std::path::Path;

use loader_proto::pb::NpySpec;
use crate::mapped::MappedFile;

use super::{Dataset, DatasetError, SampleKey, SampleTensor, check_rows};

const KIND: &str = "npy";

/// One mapped array.
#[derive(Debug)]
struct Column {
    /// The whole file, read-only, guarded (`crate::mapped`).
    map: MappedFile,
    /// The file as the spec names it, for errors.
    path: String,
    /// Offset of row 0 in the file.
    data_offset: usize,
    /// Bytes per row.
    row: usize,
}

impl Column {
    /// The bytes of row `index`, if the file holds it.
    fn row_bytes(&self, index: u64) -> Option<&[u8]> {
        usize::try_from(index)
            .ok()
            .and_then(|i| i.checked_mul(self.row))
            .and_then(|at| at.checked_add(self.data_offset))
            .and_then(|start| self.map.bytes().get(start..start.checked_add(self.row)?))
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
            let path = Path::new(&array.path);
            let mismatch = |problem: String| DatasetError::Mismatch { kind: KIND, path: array.path.clone(), problem };
            let header = loader_listing::npy::read_header(path).map_err(|e| DatasetError::listing(KIND, e))?;
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
            let open_err = |source| DatasetError::Open { kind: KIND, path: array.path.clone(), source };
            let file = File::open(path).map_err(open_err)?;
            let map = MappedFile::map(&file).map_err(open_err)?;
            tensors.push(SampleTensor {
                name: array.name.clone(),
                dtype: header.dtype,
                shape: header.row_shape().to_vec(),
            });
            columns.push(Column { map, path: array.path.clone(), data_offset, row });
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
                if let Some(bytes) = column.row_bytes(key.index) {
                    super::prefetch::bytes(bytes);
                }
            }
        }
    }

    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        let index = key.index;
        check_rows(index, rows, &self.row_bytes)?;
        if index >= self.len {
            return Err(DatasetError::IndexOutOfRange { index, len: self.len });
        }
        for (column, row) in self.columns.iter().zip(rows.iter_mut()) {
            // Checked at open: the file holds `len` rows after data_offset.
            let Some(bytes) = column.row_bytes(index) else {
                return Err(DatasetError::IndexOutOfRange { index, len: self.len });
            };
            row.copy_from_slice(bytes);
            column.map.intact().map_err(|c| DatasetError::changed(&column.path, c))?;
        }
        Ok(())
    }
}
