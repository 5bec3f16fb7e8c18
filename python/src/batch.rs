//! [`Batch`]: what iterating a loader yields in Python — a read-only mapping
//! of tensor name to numpy array (`batch["data"]`, `batch["label"]`), each
//! array a view of the batch's own memory (the shared-memory slot a worker
//! wrote, or the gRPC frame), plus where the batch sits in the job.
//!
//! The slot is held while the batch or any array, memoryview or DLPack
//! tensor made from it lives; it returns to the workers when the last one is
//! freed. Arrays are made on first access and cached, so `batch["data"]`
//! is the same array each time.
//!
//! A batch from a loader with `device="cuda:N"` lives on that GPU: its
//! tensors export through DLPack only (`batch.torch()`), as CUDA tensors
//! whose consumer stream waits on the batch's copy; the slot went back to
//! the workers when the copy completed, and the device buffer returns to
//! the loader's pool when the last tensor is freed.

use std::sync::Arc;

use loader_client::{Batch as ClientBatch, Device, Transport};
use pyo3::exceptions::{PyBufferError, PyKeyError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList};

use crate::tensor::TensorView;

/// numpy, imported once, when the first array is made (so that worker
/// processes, which import this module too, never load it).
static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// One batch: a read-only mapping of tensor name to numpy array.
#[pyclass(frozen, mapping, module = "loader._native")]
pub(crate) struct Batch {
    /// The validated batch; shared with every view of its tensors.
    inner: Arc<ClientBatch>,
    /// Name -> numpy array, made on first access.
    arrays: PyOnceLock<Py<PyDict>>,
}

impl Batch {
    /// Wraps a batch the loader yielded.
    pub(crate) fn new(inner: ClientBatch) -> Self {
        // On the host backend the "device" is host memory: readable as
        // numpy once its copy completed (a GPU batch is waited for on the
        // consumer's stream instead, through DLPack).
        if inner.device() == Device::Host
            && let Some(copy) = inner.on_device()
        {
            let _ = copy.wait();
        }
        Self {
            inner: Arc::new(inner),
            arrays: PyOnceLock::new(),
        }
    }

    /// One view per tensor, in the worker's order: over the batch's host
    /// bytes, or over its device copy.
    fn each_view(&self) -> PyResult<Vec<(String, TensorView)>> {
        if self.inner.on_device().is_some() {
            self.inner
                .device_tensors()
                .map(|t| Ok((t.name.to_owned(), TensorView::on_device(&self.inner, &t)?)))
                .collect()
        } else {
            self.inner
                .tensors()
                .map(|t| Ok((t.name.to_owned(), TensorView::new(&self.inner, &t)?)))
                .collect()
        }
    }

    /// The arrays, made on first call.
    fn arrays<'py>(&self, py: Python<'py>) -> PyResult<&Bound<'py, PyDict>> {
        let dict = self.arrays.get_or_try_init(py, || -> PyResult<Py<PyDict>> {
            let numpy = NUMPY.get_or_try_init(py, || py.import("numpy").map(Bound::unbind))?;
            let asarray = numpy.bind(py).getattr("asarray")?;
            if let Device::Cuda(_) = self.inner.device() {
                return Err(PyBufferError::new_err(format!(
                    "the batch lives on {}: use batch.torch() (DLPack), not numpy",
                    self.inner.device()
                )));
            }
            let dict = PyDict::new(py);
            for (name, view) in self.each_view()? {
                let view = Bound::new(py, view)?;
                dict.set_item(name, asarray.call1((view,))?)?;
            }
            Ok(dict.unbind())
        })?;
        Ok(dict.bind(py))
    }
}

#[pymethods]
impl Batch {
    /// The array of tensor `name`; KeyError when the batch has none.
    fn __getitem__<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        self.arrays(py)?
            .get_item(name)?
            .ok_or_else(|| PyKeyError::new_err(name.to_owned()))
    }

    fn __len__(&self) -> usize {
        self.inner.tensors().len()
    }

    fn __contains__(&self, name: &str) -> bool {
        self.inner.tensor(name).is_some()
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.keys(py)?.try_iter().map(Bound::into_any)
    }

    /// Tensor names, in the order the worker wrote them.
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.inner.tensors().map(|t| t.name))
    }

    /// The arrays, in key order.
    fn values<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        Ok(self.arrays(py)?.values())
    }

    /// `(name, array)` pairs, in key order.
    fn items<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        Ok(self.arrays(py)?.items())
    }

    /// The array of `name`, or `default`.
    #[pyo3(signature = (name, default=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        Ok(self.arrays(py)?.get_item(name)?.or(default))
    }

    /// A plain dict of name -> numpy array (the same zero-copy arrays).
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.arrays(py)?.copy()
    }

    /// A dict of name -> `torch.Tensor` over the same memory (DLPack, no
    /// copy). Needs torch. The tensors keep the slot held like the arrays.
    fn torch<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let from_dlpack = py.import("torch")?.getattr("from_dlpack")?;
        let dict = PyDict::new(py);
        for view in self.views(py)?.values() {
            let name = view.getattr("name")?;
            dict.set_item(name, from_dlpack.call1((view,))?)?;
        }
        Ok(dict)
    }

    /// A dict of name -> [`TensorView`]: the raw zero-copy views, for any
    /// DLPack or buffer-protocol consumer.
    fn views<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (name, view) in self.each_view()? {
            dict.set_item(name, view)?;
        }
        Ok(dict)
    }

    /// Where the tensors live: "cpu", "cuda:N", or "host" (the device
    /// path's host backend).
    #[getter]
    fn device(&self) -> String {
        self.inner.device().to_string()
    }

    /// Epoch of the batch.
    #[getter]
    fn epoch(&self) -> u32 {
        self.inner.epoch()
    }

    /// Sequence number over the whole job: `epoch * len(loader) + index`.
    #[getter]
    fn seq(&self) -> u64 {
        self.inner.seq()
    }

    /// Position within its epoch (what `enumerate(loader)` counts).
    #[getter]
    fn index_in_epoch(&self) -> u64 {
        self.inner.index_in_epoch()
    }

    /// Dataset indices of the samples, in batch order.
    #[getter]
    fn indices(&self) -> Vec<u64> {
        self.inner.indices().to_vec()
    }

    /// Number of samples in the batch.
    #[getter]
    fn num_samples(&self) -> usize {
        self.inner.len()
    }

    /// How the batch arrived: "shared_memory" or "grpc".
    #[getter]
    fn transport(&self) -> &'static str {
        match self.inner.transport() {
            Transport::SharedMemory => "shared_memory",
            _ => "grpc",
        }
    }

    fn __repr__(&self) -> String {
        let tensors: Vec<String> = self
            .inner
            .tensors()
            .map(|t| format!("{}: {}{:?}", t.name, t.dtype.short_name(), t.shape))
            .collect();
        format!(
            "Batch(epoch={}, index_in_epoch={}, {{{}}})",
            self.inner.epoch(),
            self.inner.index_in_epoch(),
            tensors.join(", ")
        )
    }
}
