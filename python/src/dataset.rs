//! [`PythonDataset`]: a user's map-style Python dataset served by the
//! worker compiled into this module (`python -m loader._worker`), registered
//! as the `custom` dataset `python` (the spec-file entry `python: {...}`).
//!
//! The Python half (`loader._source.Source`) unpickles or imports the
//! dataset, seeds the RNGs from (seed, epoch, index), calls `__getitem__`
//! for every sample of a batch in one call (`read_batch`: one GIL hold and
//! one interpreter call per batch, not per sample) and flattens each sample
//! into C-contiguous byte views; this half copies each view straight into
//! its row of the batch buffer (a ring slot or a
//! gRPC frame). The schema (names, dtypes, shapes) comes from the first
//! sample that reads (`Source.tensors`).
//!
//! Errors: an exception raised by the user's `__getitem__` is a corrupt
//! sample ([`DatasetError::Corrupt`] naming the index and the exception's
//! last line), so the job's `on_corrupt` policy fails the job or skips the
//! sample; the worker itself never dies of it. A sample whose shapes differ
//! from the schema fails the job with a one-line message.

use loader_proto::pb::{CorruptPolicy, CustomSpec, Dtype};
use loader_worker::dataset::{BatchRows, MadeBatch, MadeTensor};
use loader_worker::{Dataset, DatasetError, SampleKey, SampleTensor};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::sample_plan::SamplePlan;

/// The Python module that holds the dataset's Python half.
const MODULE: &str = "loader._source";

/// A Python dataset opened in this worker.
#[derive(Debug)]
pub(crate) struct PythonDataset {
    /// `loader._source.Source` over the user's dataset.
    source: Py<PyAny>,
    /// `SampleError` (a sample that cannot be batched), which fails the job
    /// whatever its corrupt policy.
    sample_error: Py<PyAny>,
    /// The tensors of every sample, from the first sample that reads.
    tensors: Vec<SampleTensor>,
    /// How samples shaped like that one are written without Python's help
    /// (None: that sample holds parts only the Python half converts).
    plan: Option<SamplePlan>,
    /// The user gave a `collate_fn`: batches are made whole by it.
    collates: bool,
    /// `Source.read_batch`'s marker for "the batch again from the start".
    restart: Py<PyAny>,
    /// `Raised`, what `Source.read_batch` yields for a sample that raised.
    raised: Py<PyAny>,
    /// `len(dataset)`, as the job was planned.
    len: u64,
}

impl PythonDataset {
    /// Opens the dataset a `python` spec describes (unpickles it or calls
    /// its factory) and reads a first sample for the schema.
    pub(crate) fn open(spec: &CustomSpec) -> Result<Self, DatasetError> {
        Python::attach(|py| Self::open_in(py, spec))
            .map_err(|e| Python::attach(|py| DatasetError::Spec(format!("dataset.python: {}", last_line(py, &e)))))
    }

    fn open_in(py: Python<'_>, spec: &CustomSpec) -> PyResult<Self> {
        let module = py.import(MODULE)?;
        let params = PyDict::new(py);
        for (k, v) in &spec.params {
            params.set_item(k, v)?;
        }
        let source = module.getattr("Source")?.call1((params, spec.num_samples))?;
        let described = source.call_method0("tensors")?;
        let mut tensors = Vec::new();
        for item in described.cast::<PyList>()?.iter() {
            let (name, dtype, shape): (String, String, Vec<u64>) = item.extract()?;
            let dtype = Dtype::parse(&dtype).ok_or_else(|| {
                pyo3::exceptions::PyTypeError::new_err(format!("{name}: dtype {dtype} cannot be batched"))
            })?;
            tensors.push(SampleTensor { name, dtype, shape });
        }
        let plan = SamplePlan::of(&source.call_method0("schema_sample")?).filter(|p| p.leaves() == tensors.len());
        let collates = source.getattr("collates")?.extract()?;
        Ok(Self {
            restart: module.getattr("RESTART")?.unbind(),
            raised: module.getattr("Raised")?.unbind(),
            collates,
            plan,
            sample_error: module.getattr("SampleError")?.unbind(),
            source: source.unbind(),
            tensors,
            len: spec.num_samples,
        })
    }

    /// Reads sample `key.index` into `rows`, with the GIL held.
    fn read_in(&self, py: Python<'_>, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        let leaves = match self.source.bind(py).call_method1("read", (key.index, sample_seed(key), key.epoch)) {
            Ok(leaves) => leaves,
            Err(e) => return Err(self.failed(py, &e, key.index)),
        };
        copy_leaves(py, key.index, &leaves, rows)
    }

    /// Reads the samples `keys` into `batch` with the GIL held: one Python
    /// call gets every sample of the batch; each is written into its rows by
    /// the plan, or, when it does not follow it, converted by the Python
    /// half (which also words the error of a sample that cannot be batched).
    fn read_batch_in(&self, py: Python<'_>, keys: &[SampleKey], batch: &mut BatchRows<'_>) -> Result<(), DatasetError> {
        self.read_samples(py, keys, |read| match read {
            Read::Restart => {
                batch.reset();
                Ok(())
            }
            Read::Sample(key, sample) => {
                let written = sample.and_then(|s| self.write_sample(py, key.index, &s, &mut batch.next_rows()));
                batch.settle(key.index, written)
            }
        })
    }

    /// Writes sample `index` into `rows`: by the plan, else through the
    /// Python half's full conversion and checks.
    fn write_sample(&self, py: Python<'_>, index: u64, sample: &Bound<'_, PyAny>, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        if let Some(plan) = &self.plan
            && plan.write(sample, rows).is_ok()
        {
            return Ok(());
        }
        match self.source.bind(py).call_method1("convert", (index, sample)) {
            Ok(leaves) => copy_leaves(py, index, &leaves, rows),
            Err(e) => Err(self.failed(py, &e, index)),
        }
    }

    /// Makes the batch of samples `keys` whole with the GIL held: one call
    /// reads them, the corrupt policy applies to those that raised, and the
    /// user's `collate_fn` makes the batch of the others.
    fn make_batch_in(&self, py: Python<'_>, keys: &[SampleKey], on_corrupt: CorruptPolicy) -> Result<MadeBatch, DatasetError> {
        let first = keys.first().map_or(0, |k| k.index);
        let mut settled = BatchRows::new(Vec::new(), keys.len(), on_corrupt, true);
        let mut samples = Vec::with_capacity(keys.len());
        self.read_samples(py, keys, |read| match read {
            Read::Restart => {
                settled.reset();
                samples.clear();
                Ok(())
            }
            Read::Sample(key, sample) => {
                let kept = sample.map(|s| samples.push(s));
                settled.settle(key.index, kept)
            }
        })?;
        let kept_samples = PyList::new(py, samples).map_err(|e| self.failed(py, &e, first))?;
        let (kept, skipped) = settled.finish();
        if kept.is_empty() {
            // Every sample was left out: the schema's tensors, none held.
            let tensors = self
                .tensors
                .iter()
                .map(|t| MadeTensor {
                    name: t.name.clone(),
                    dtype: t.dtype,
                    shape: std::iter::once(0).chain(t.shape.iter().copied()).collect(),
                    bytes: Vec::new(),
                })
                .collect();
            return Ok(MadeBatch { tensors, kept, skipped });
        }
        let leaves = self
            .source
            .bind(py)
            .call_method1("collate", (kept_samples,))
            .map_err(|e| self.failed(py, &e, first))?;
        let leaves = leaves.cast::<PyList>().map_err(|_| DatasetError::RowMismatch { index: first })?;
        let mut tensors = Vec::with_capacity(leaves.len());
        for leaf in leaves.iter() {
            let (name, dtype, shape, buf): (String, String, Vec<u64>, Bound<'_, PyAny>) =
                leaf.extract().map_err(|_| DatasetError::RowMismatch { index: first })?;
            let dtype = Dtype::parse(&dtype)
                .ok_or_else(|| DatasetError::Spec(format!("collate_fn returned {name} of dtype {dtype}, which cannot be batched")))?;
            let bytes = PyBuffer::<u8>::get(&buf)
                .and_then(|b| b.to_vec(py))
                .map_err(|_| DatasetError::RowMismatch { index: first })?;
            tensors.push(MadeTensor { name, dtype, shape, bytes });
        }
        Ok(MadeBatch { tensors, kept, skipped })
    }

    /// Reads the samples `keys` in one Python call (`Source.read_batch`, a
    /// generator), handing each to `each` as it comes: a sample is written
    /// before the next is made. `Read::Restart` means the batch comes again
    /// from its first sample (it had to be read with more generators
    /// seeded).
    fn read_samples<'py>(
        &self,
        py: Python<'py>,
        keys: &[SampleKey],
        mut each: impl FnMut(Read<'py>) -> Result<(), DatasetError>,
    ) -> Result<(), DatasetError> {
        let first = keys.first().map_or(0, |k| k.index);
        let indices: Vec<u64> = keys.iter().map(|k| k.index).collect();
        let seeds: Vec<u64> = keys.iter().map(|&k| sample_seed(k)).collect();
        let epoch = keys.first().map_or(0, |k| k.epoch);
        let samples = self
            .source
            .bind(py)
            .call_method1("read_batch", (indices, seeds, epoch))
            .and_then(|r| r.try_iter())
            .map_err(|e| self.failed(py, &e, first))?;
        let mut pos = 0;
        for item in samples {
            let at = keys.get(pos).map_or(first, |k| k.index);
            let item = item.map_err(|e| self.failed(py, &e, at))?;
            if item.is(self.restart.bind(py)) {
                pos = 0;
                each(Read::Restart)?;
                continue;
            }
            let key = *keys.get(pos).ok_or(DatasetError::RowMismatch { index: first })?;
            pos += 1;
            let raised = item.is_instance(self.raised.bind(py)).map_err(|e| self.failed(py, &e, key.index))?;
            let sample = if raised {
                // `__getitem__` raised: the exception's last line.
                let reason = item.getattr("reason").map_err(|e| self.failed(py, &e, key.index))?;
                Err(corrupt(key.index, &reason))
            } else {
                Ok(item)
            };
            each(Read::Sample(key, sample))?;
        }
        if pos != keys.len() {
            return Err(DatasetError::RowMismatch { index: first });
        }
        Ok(())
    }

    /// Every index of `keys` is one of the dataset's.
    fn check_range(&self, keys: &[SampleKey]) -> Result<(), DatasetError> {
        match keys.iter().find(|k| k.index >= self.len) {
            Some(key) => Err(DatasetError::IndexOutOfRange {
                index: key.index,
                len: self.len,
            }),
            None => Ok(()),
        }
    }

    /// What an exception out of the Python half means: a sample that cannot
    /// be batched fails the job; one raised by `__getitem__` (sample
    /// `index`) is a corrupt sample.
    fn failed(&self, py: Python<'_>, e: &PyErr, index: u64) -> DatasetError {
        if e.is_instance(py, self.sample_error.bind(py)) {
            return DatasetError::Spec(e.value(py).to_string());
        }
        DatasetError::Corrupt {
            path: format!("index {index}"),
            reason: last_line(py, e),
        }
    }
}

/// What `Source.read_batch` yields, as the worker takes it.
enum Read<'py> {
    /// Every sample comes again, from the first.
    Restart,
    /// The next sample, or why `__getitem__` could not make it.
    Sample(SampleKey, Result<Bound<'py, PyAny>, DatasetError>),
}

/// Sample `index` could not be read: `reason` is the last line of the
/// exception `__getitem__` raised.
fn corrupt(index: u64, reason: &Bound<'_, PyAny>) -> DatasetError {
    DatasetError::Corrupt {
        path: format!("index {index}"),
        reason: reason.to_string(),
    }
}

/// Copies the leaves of sample `index` (a list of byte buffers, in the
/// order of the dataset's tensors) into its rows; each must be exactly its
/// row's size.
fn copy_leaves(py: Python<'_>, index: u64, leaves: &Bound<'_, PyAny>, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
    let leaves = leaves.cast::<PyList>().map_err(|_| DatasetError::RowMismatch { index })?;
    if leaves.len() != rows.len() {
        return Err(DatasetError::RowMismatch { index });
    }
    for (leaf, row) in leaves.iter().zip(rows.iter_mut()) {
        let copied = PyBuffer::<u8>::get(&leaf).and_then(|buf| buf.copy_to_slice(py, row));
        if copied.is_err() {
            return Err(DatasetError::RowMismatch { index });
        }
    }
    Ok(())
}

impl Dataset for PythonDataset {
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
            return Err(DatasetError::IndexOutOfRange {
                index: key.index,
                len: self.len,
            });
        }
        Python::attach(|py| self.read_in(py, key, rows))
    }

    fn read_batch(&self, keys: &[SampleKey], batch: &mut BatchRows<'_>) -> Result<(), DatasetError> {
        self.check_range(keys)?;
        Python::attach(|py| self.read_batch_in(py, keys, batch))
    }

    fn makes_whole_batches(&self) -> bool {
        self.collates
    }

    fn make_batch(&self, keys: &[SampleKey], on_corrupt: CorruptPolicy) -> Result<MadeBatch, DatasetError> {
        self.check_range(keys)?;
        Python::attach(|py| self.make_batch_in(py, keys, on_corrupt))
    }
}

/// The seed the RNGs get before `__getitem__(index)` in epoch `epoch` of a
/// job seeded `seed`: for reproducing a sample outside Loader
/// (`loader._dataset.seeded_sample`).
#[pyfunction(name = "sample_seed")]
pub(crate) fn py_sample_seed(seed: u64, epoch: u64, index: u64) -> u64 {
    sample_seed(SampleKey { seed, epoch, index })
}

/// The seed of one draw of a sample: SplitMix64 over (seed, epoch, index),
/// so it depends on nothing but the sample's key.
fn sample_seed(key: SampleKey) -> u64 {
    let mut z = key.seed ^ key.epoch.rotate_left(21) ^ key.index.rotate_left(42);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The last line of a Python exception's traceback: `ValueError: boom`.
fn last_line(py: Python<'_>, e: &PyErr) -> String {
    let kind = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    let text = e.value(py).str().map(|s| s.to_string()).unwrap_or_default();
    match text.trim().lines().last() {
        Some(line) if !line.is_empty() => format!("{kind}: {line}"),
        _ => kind,
    }
}
