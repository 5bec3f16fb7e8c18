//! A custom worker binary: the stock `loader-worker` plus a dataset of its
//! own, written against the [`Dataset`] trait.
//!
//! The dataset here, `squares`, computes its samples (`x` = index as
//! float32, `y` = index squared as int64) so the example needs no files;
//! a real one would open its files or database in its constructor, from the
//! job's `params`. Jobs reach it with a `custom` dataset:
//!
//! ```yaml
//! dataset: {custom: {name: squares, num_samples: 1000, params: {offset: 5}}}
//! batch_size: 32
//! ```
//!
//! Run it like `loader-worker` (same flags):
//! `custom-worker --coordinator http://127.0.0.1:5000 --listen 127.0.0.1:0`.
//! Batching, shuffling, the shared-memory and gRPC transports, leases and
//! corrupt-sample handling all come from the worker library unchanged.

use std::process::ExitCode;
use std::sync::Arc;

use loader_worker::{Dataset, DatasetError, Datasets, SampleKey, SampleTensor};
use loader_proto::pb::{CustomSpec, Dtype};

/// `x[i] = i + offset` (float32), `y[i] = (i + offset)^2` (int64).
#[derive(Debug)]
struct Squares {
    /// Samples in the dataset, from the job spec.
    len: u64,
    /// Added to every index, from the job's `params`.
    offset: u64,
    /// `x` and `y`, one element each per sample.
    tensors: Vec<SampleTensor>,
}

impl Squares {
    /// Builds the dataset a `custom` spec describes; a bad parameter is a
    /// one-line error naming it.
    fn open(spec: &CustomSpec) -> Result<Self, DatasetError> {
        let offset = match spec.params.get("offset") {
            None => 0,
            Some(v) => v.parse().map_err(|_| {
                DatasetError::Spec(format!("dataset.custom.params.offset: {v:?} is not a non-negative integer"))
            })?,
        };
        let scalar = |name: &str, dtype| SampleTensor { name: name.into(), dtype, shape: Vec::new() };
        Ok(Self { len: spec.num_samples, offset, tensors: vec![scalar("x", Dtype::F32), scalar("y", Dtype::I64)] })
    }
}

impl Dataset for Squares {
    fn tensors(&self) -> &[SampleTensor] {
        &self.tensors
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn writes_whole_rows(&self) -> bool {
        true
    }

    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        if key.index >= self.len {
            return Err(DatasetError::IndexOutOfRange { index: key.index, len: self.len });
        }
        let [x, y] = rows else {
            return Err(DatasetError::RowMismatch { index: key.index });
        };
        let v = key.index + self.offset;
        x.copy_from_slice(&(v as f32).to_le_bytes());
        y.copy_from_slice(&(v as i64).wrapping_mul(v as i64).to_le_bytes());
        Ok(())
    }
}

fn main() -> ExitCode {
    let datasets = Datasets::new().register("squares", |spec: &CustomSpec| -> Result<Arc<dyn Dataset>, DatasetError> {
        Ok(Arc::new(Squares::open(spec)?))
    });
    loader_worker::main_with_datasets(std::env::args_os(), datasets)
}
