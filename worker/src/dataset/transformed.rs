//! The [`Transform`] trait: a per-sample step that a custom worker binary
//! adds after a dataset has written a sample, and [`Transformed`], the
//! dataset that runs a list of them.
//!
//! Steps work in place on the sample's rows, so a transformed dataset still
//! collates straight into the batch buffer (a shared-memory slot included)
//! with no per-sample copy. They keep the tensors' shapes and types, which
//! is what lets the coordinator plan a job without knowing a custom binary's
//! steps; a step that changes shapes belongs in the dataset itself. Like the
//! built-in image pipeline, a step draws any randomness from the
//! [`SampleKey`] alone, so a sample gets the same values on any worker.

use std::sync::Arc;

use super::{Dataset, DatasetError, SampleKey, SampleTensor};

/// One in-place step over a sample's tensors.
pub trait Transform: Send + Sync + std::fmt::Debug {
    /// Checks, once when the job's dataset is opened, that the step can work
    /// on these tensors (names, types, shapes); the error is one line.
    fn check(&self, tensors: &[SampleTensor]) -> Result<(), DatasetError>;

    /// Rewrites sample `key`'s rows in place: one row per tensor of
    /// `tensors`, each exactly that tensor's sample size in bytes.
    fn apply(&self, key: SampleKey, tensors: &[SampleTensor], rows: &mut [&mut [u8]]) -> Result<(), DatasetError>;
}

/// A dataset whose samples go through `steps`, in order, after `inner`
/// wrote them.
#[derive(Debug)]
pub struct Transformed {
    /// Where samples come from.
    inner: Arc<dyn Dataset>,
    /// Applied in order to every sample.
    steps: Vec<Arc<dyn Transform>>,
    /// Bytes of one sample of each tensor, computed once so a sample's rows
    /// are checked without allocating.
    row_bytes: Vec<usize>,
}

impl Transformed {
    /// Wraps `inner`, checking every step against its tensors.
    pub fn new(inner: Arc<dyn Dataset>, steps: Vec<Arc<dyn Transform>>) -> Result<Self, DatasetError> {
        for step in &steps {
            step.check(inner.tensors())?;
        }
        let row_bytes = inner
            .tensors()
            .iter()
            .map(|t| {
                super::sample_bytes(t)
                    .ok_or_else(|| DatasetError::Spec(format!("tensor {}: shape {:?} is too large", t.name, t.shape)))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { inner, steps, row_bytes })
    }
}

impl Dataset for Transformed {
    fn tensors(&self) -> &[SampleTensor] {
        self.inner.tensors()
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        self.inner.read_into(key, rows)?;
        // Steps index rows by the tensors they checked: hold the rows to them.
        super::check_rows(key.index, rows, &self.row_bytes)?;
        for step in &self.steps {
            step.apply(key, self.tensors(), rows)?;
        }
        Ok(())
    }

    fn fetches_ahead(&self) -> bool {
        self.inner.fetches_ahead()
    }

    fn prefetch_batch(&self, keys: &[SampleKey]) {
        self.inner.prefetch_batch(keys);
    }

    fn writes_whole_rows(&self) -> bool {
        // Steps only rewrite what the inner dataset wrote.
        self.inner.writes_whole_rows()
    }
}

#[cfg(test)]
mod tests {
    use loader_proto::pb::{Dtype, SyntheticSpec};

    use super::*;
    use crate::dataset::Synthetic;

    /// Adds `key.epoch + 1` to every byte of the tensor `data`.
    #[derive(Debug)]
    struct AddEpoch;

    impl Transform for AddEpoch {
        fn check(&self, tensors: &[SampleTensor]) -> Result<(), DatasetError> {
            match tensors.first() {
                Some(t) if t.name == "data" && t.dtype == Dtype::U8 => Ok(()),
                _ => Err(DatasetError::Spec("add_epoch: needs a uint8 tensor `data` first".into())),
            }
        }

        fn apply(&self, key: SampleKey, _: &[SampleTensor], rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
            let add = u8::try_from(key.epoch % 256).unwrap_or(0).wrapping_add(1);
            for b in rows[0].iter_mut() {
                *b = b.wrapping_add(add);
            }
            Ok(())
        }
    }

    fn synthetic(dtype: Dtype) -> Arc<dyn Dataset> {
        let spec = SyntheticSpec { num_samples: 10, shape: vec![8], dtype: dtype as i32, cost_ns: 0, wait_ns_by_epoch: Vec::new() };
        Arc::new(Synthetic::new(&spec).expect("synthetic"))
    }

    fn read(d: &dyn Dataset, key: SampleKey) -> Vec<Vec<u8>> {
        let mut bufs: Vec<Vec<u8>> =
            d.tensors().iter().map(|t| vec![0; crate::dataset::sample_bytes(t).expect("size")]).collect();
        let mut rows: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
        d.read_into(key, &mut rows).expect("read");
        bufs
    }

    #[test]
    fn steps_run_in_order_on_what_the_dataset_wrote() {
        let plain = synthetic(Dtype::U8);
        let twice = Transformed::new(plain.clone(), vec![Arc::new(AddEpoch), Arc::new(AddEpoch)]).expect("checked");
        let key = SampleKey { seed: 1, epoch: 2, index: 7 };
        let (before, after) = (read(&*plain, key), read(&twice, key));
        assert_eq!(before.len(), after.len());
        let expected: Vec<u8> = before[0].iter().map(|b| b.wrapping_add(6)).collect();
        assert_eq!(after[0], expected, "two steps of +3 on epoch 2");
        assert_eq!(before[1..], after[1..], "other tensors untouched");
        assert_eq!(twice.len(), plain.len());
    }

    #[test]
    fn a_step_that_does_not_fit_the_tensors_is_refused_when_opened() {
        let e = Transformed::new(synthetic(Dtype::F32), vec![Arc::new(AddEpoch)]).expect_err("f32 data");
        assert_eq!(e.to_string(), "add_epoch: needs a uint8 tensor `data` first");
    }
}
