//! `synthetic`: generated samples for benchmarks and tests.
//!
//! The bytes are a function of the sample index alone, so a test can check
//! any batch without a reference copy: in `data`, the first `min(8, row)`
//! bytes are the index in little-endian and every other byte is
//! `index % 251`; `label` is the index as int64. `cost_ns` spins the CPU per
//! sample to stand in for decode and augmentation; `wait_ns_by_epoch` sleeps
//! per sample, by epoch, to stand in for storage latency that changes
//! during a job.

use std::time::{Duration, Instant};

use loader_proto::pb::{Dtype, SyntheticSpec};

use super::{Dataset, DatasetError, SampleKey, SampleTensor, check_rows, sample_bytes};

/// A generated dataset (see the module docs for its bytes).
#[derive(Debug, Clone)]
pub struct Synthetic {
    /// Samples in the dataset.
    len: u64,
    /// `data` and `label`, in that order.
    tensors: Vec<SampleTensor>,
    /// Bytes of each tensor's row, checked against the rows handed in.
    row_bytes: [usize; 2],
    /// Busy work per sample; spinning (not sleeping) so it costs real CPU.
    cost: Duration,
    /// Sleep per sample in each epoch (the last entry for later ones).
    waits: Vec<Duration>,
}

impl Synthetic {
    /// Builds the dataset a spec describes.
    pub fn new(spec: &SyntheticSpec) -> Result<Self, DatasetError> {
        let dtype = match Dtype::try_from(spec.dtype) {
            Ok(Dtype::Unspecified) | Err(_) => {
                return Err(DatasetError::Spec(format!(
                    "synthetic dataset: unknown dtype code {}",
                    spec.dtype
                )));
            }
            Ok(d) => d,
        };
        let data = SampleTensor { name: "data".into(), dtype, shape: spec.shape.clone() };
        let label = SampleTensor { name: "label".into(), dtype: Dtype::I64, shape: Vec::new() };
        let Some(data_bytes) = sample_bytes(&data) else {
            return Err(DatasetError::Spec(format!(
                "synthetic dataset: sample shape {:?} of {} is too large",
                spec.shape,
                dtype.short_name()
            )));
        };
        Ok(Self {
            len: spec.num_samples,
            tensors: vec![data, label],
            row_bytes: [data_bytes, 8],
            cost: Duration::from_nanos(spec.cost_ns),
            waits: spec.wait_ns_by_epoch.iter().map(|&ns| Duration::from_nanos(ns)).collect(),
        })
    }
}

impl Dataset for Synthetic {
    fn tensors(&self) -> &[SampleTensor] {
        &self.tensors
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn writes_whole_rows(&self) -> bool {
        // `data` is filled and `label` copied whole.
        true
    }

    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        let index = key.index;
        if index >= self.len {
            return Err(DatasetError::IndexOutOfRange { index, len: self.len });
        }
        check_rows(index, rows, &self.row_bytes)?;
        let epoch = usize::try_from(key.epoch).unwrap_or(usize::MAX);
        if let Some(&wait) = self.waits.get(epoch).or(self.waits.last())
            && !wait.is_zero()
        {
            std::thread::sleep(wait);
        }
        if !self.cost.is_zero() {
            let start = Instant::now();
            while start.elapsed() < self.cost {
                std::hint::spin_loop();
            }
        }
        let [data, label] = rows else {
            return Err(DatasetError::RowMismatch { index });
        };
        data.fill((index % 251) as u8);
        let head = data.len().min(8);
        data[..head].copy_from_slice(&index.to_le_bytes()[..head]);
        label.copy_from_slice(&index.to_le_bytes());
        Ok(())
    }
}

/// The `data` row of sample `index`, as the dataset writes it; for tests.
#[cfg(test)]
pub(crate) fn expected_data(index: u64, row_len: usize) -> Vec<u8> {
    let mut row = vec![(index % 251) as u8; row_len];
    let head = row_len.min(8);
    row[..head].copy_from_slice(&index.to_le_bytes()[..head]);
    row
}
