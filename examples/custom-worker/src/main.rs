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
//! `noisy_squares` is the same dataset with a [`Transform`] step after it
//! (`Jitter`: `x` plus noise in [0, 1) drawn from the sample's key, so every
//! worker gives the same value): the way a custom binary adds its own
//! per-sample augmentation.
//!
//! Run it like `loader-worker` (same flags):
//! `custom-worker --coordinator http://127.0.0.1:5000 --listen 127.0.0.1:0`.
//! Batching, shuffling, the shared-memory and gRPC transports, leases and
//! corrupt-sample handling all come from the worker library unchanged.

use std::process::ExitCode;
use std::sync::Arc;

use loader_worker::{Dataset, DatasetError, Datasets, SampleKey, SampleTensor, Transform, Transformed};
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

/// Adds noise in [0, 1) to the float32 tensor `x`, drawn from the sample's
/// key alone (seed, epoch, index), so it is the same on every worker.
#[derive(Debug)]
struct Jitter;

impl Jitter {
    /// The noise of one sample: SplitMix64 over the key, top 24 bits.
    fn noise(key: SampleKey) -> f32 {
        let mut z = key.seed ^ key.epoch.rotate_left(21) ^ key.index.rotate_left(42);
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }
}

impl Transform for Jitter {
    fn check(&self, tensors: &[SampleTensor]) -> Result<(), DatasetError> {
        match tensors.first() {
            Some(t) if t.name == "x" && t.dtype == Dtype::F32 && t.shape.is_empty() => Ok(()),
            _ => Err(DatasetError::Spec("jitter: needs a float32 scalar `x` as the first tensor".into())),
        }
    }

    fn apply(&self, key: SampleKey, _: &[SampleTensor], rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        let Some(Ok(bytes)) = rows.first_mut().map(|r| <&mut [u8; 4]>::try_from(&mut **r)) else {
            return Err(DatasetError::RowMismatch { index: key.index });
        };
        *bytes = (f32::from_le_bytes(*bytes) + Self::noise(key)).to_le_bytes();
        Ok(())
    }
}

fn main() -> ExitCode {
    let datasets = Datasets::new()
        .register("squares", |spec: &CustomSpec| -> Result<Arc<dyn Dataset>, DatasetError> {
            Ok(Arc::new(Squares::open(spec)?))
        })
        .register("noisy_squares", |spec: &CustomSpec| -> Result<Arc<dyn Dataset>, DatasetError> {
            let squares: Arc<dyn Dataset> = Arc::new(Squares::open(spec)?);
            Ok(Arc::new(Transformed::new(squares, vec![Arc::new(Jitter)])?))
        });
    loader_worker::main_with_datasets(std::env::args_os(), datasets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_is_a_function_of_the_key() {
        let spec = CustomSpec { name: "noisy_squares".into(), num_samples: 10, ..Default::default() };
        let squares: Arc<dyn Dataset> = Arc::new(Squares::open(&spec).expect("open"));
        let noisy = Transformed::new(squares, vec![Arc::new(Jitter)]).expect("checked");
        let read = |key: SampleKey| {
            let (mut x, mut y) = ([0u8; 4], [0u8; 8]);
            noisy.read_into(key, &mut [&mut x[..], &mut y[..]]).expect("read");
            (f32::from_le_bytes(x), i64::from_le_bytes(y))
        };
        let key = SampleKey { seed: 3, epoch: 1, index: 4 };
        let (x, y) = read(key);
        assert!((4.0..5.0).contains(&x), "x = 4 + noise in [0, 1): {x}");
        assert_eq!(y, 16, "y untouched");
        assert_eq!(read(key), (x, y), "same key, same value");
        assert_ne!(read(SampleKey { epoch: 2, ..key }).0, x, "another epoch, other noise");
    }
}
