//! [`TensorView`]: one tensor of a batch as a Python object that owns (a
//! share of) the batch, so whatever views it — a numpy array through the
//! buffer protocol, a torch tensor through DLPack — keeps the bytes, and the
//! ring slot under them, alive; the slot goes back to the workers when the
//! last such view is freed.
//!
//! Through the buffer protocol (numpy, memoryview) the bytes are read-only:
//! they are the one copy a worker wrote, and a write through one array would
//! surprise every other array of the batch. `numpy.array(x)` makes a
//! writable copy. DLPack has no read-only flag that torch honours, so
//! tensors from `torch.from_dlpack` are writable; writes change only this
//! batch's own memory, which nothing else reads.

use std::ffi::{CStr, c_int, c_void};
use std::sync::Arc;

use loader_client::{Batch, Device, DeviceTensor, Dtype, Tensor};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyTuple};
use pyo3::ffi;

use crate::dlpack;

/// One tensor of a batch, viewable without copying by numpy (buffer
/// protocol) and torch (DLPack).
#[pyclass(frozen, module = "loader._native")]
pub(crate) struct TensorView {
    /// Holds the bytes: dropping the last owner of the batch frees its slot.
    batch: Arc<Batch>,
    /// The tensor's name in the batch.
    name: String,
    /// Element type.
    dtype: Dtype,
    /// Address of the first byte (inside `batch`'s bytes).
    data: usize,
    /// Payload length in bytes.
    len: usize,
    /// Shape, batch dimension first; the buffer protocol points into it.
    shape: Box<[isize]>,
    /// C-order strides in bytes; the buffer protocol points into it.
    strides: Box<[isize]>,
    /// Where `data` lies, as DLPack says it: `(kDLCPU, 0)` or
    /// `(kDLCUDA, ordinal)`.
    device: (i32, i32),
}

impl TensorView {
    /// A view of `tensor`, which must be a tensor of `batch`.
    pub(crate) fn new(batch: &Arc<Batch>, tensor: &Tensor<'_>) -> PyResult<Self> {
        let (name, dtype, shape, data, len) = (tensor.name, tensor.dtype, tensor.shape, tensor.bytes.as_ptr() as usize, tensor.bytes.len());
        Self::described(batch, name, dtype, shape, data, len, (dlpack::DEVICE_CPU, 0))
    }

    /// A view of `tensor`, a device tensor of `batch` (whose copy the host
    /// backend completed already: its memory is the host's).
    pub(crate) fn on_device(batch: &Arc<Batch>, tensor: &DeviceTensor<'_>) -> PyResult<Self> {
        let device = match batch.device() {
            Device::Cuda(n) => (dlpack::DEVICE_CUDA, i32::try_from(n).unwrap_or(i32::MAX)),
            _ => (dlpack::DEVICE_CPU, 0),
        };
        let data = usize::try_from(tensor.ptr)
            .map_err(|_| PyValueError::new_err(format!("tensor {}: device address too large", tensor.name)))?;
        Self::described(batch, tensor.name, tensor.dtype, tensor.shape, data, tensor.len, device)
    }

    fn described(
        batch: &Arc<Batch>,
        name: &str,
        dtype: Dtype,
        shape: &[u64],
        data: usize,
        len: usize,
        device: (i32, i32),
    ) -> PyResult<Self> {
        let tensor = Described { name, dtype, shape, len };
        let shape = tensor
            .shape
            .iter()
            .map(|&d| isize::try_from(d))
            .collect::<Result<Box<[isize]>, _>>()
            .map_err(|_| PyValueError::new_err(format!("tensor {}: shape too large", tensor.name)))?;
        let item = tensor.dtype.size() as isize;
        let mut strides = vec![item; shape.len()].into_boxed_slice();
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1].max(1);
        }
        let elements = shape.iter().try_fold(1isize, |n, &d| n.checked_mul(d));
        if elements.and_then(|n| n.checked_mul(item)) != Some(tensor.len as isize) {
            return Err(PyValueError::new_err(format!(
                "tensor {}: shape {:?} of {} does not match its {} bytes",
                tensor.name,
                tensor.shape,
                tensor.dtype.short_name(),
                tensor.len
            )));
        }
        Ok(Self {
            batch: Arc::clone(batch),
            name: tensor.name.to_owned(),
            dtype: tensor.dtype,
            data,
            len: tensor.len,
            shape,
            strides,
            device,
        })
    }
}

/// What a view is made from, host or device alike.
struct Described<'a> {
    name: &'a str,
    dtype: Dtype,
    shape: &'a [u64],
    len: usize,
}

/// The struct-module format of `dtype` for the buffer protocol. bfloat16
/// has none (numpy has no such type either): its bits show as uint16.
fn format(dtype: Dtype) -> &'static CStr {
    match dtype {
        Dtype::U8 | Dtype::Unspecified => c"B",
        Dtype::I8 => c"b",
        Dtype::U16 | Dtype::Bf16 => c"H",
        Dtype::I16 => c"h",
        Dtype::U32 => c"I",
        Dtype::I32 => c"i",
        Dtype::U64 => c"Q",
        Dtype::I64 => c"q",
        Dtype::F16 => c"e",
        Dtype::F32 => c"f",
        Dtype::F64 => c"d",
        Dtype::Bool => c"?",
    }
}

#[pymethods]
impl TensorView {
    /// The tensor's name in its batch.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Element type, as numpy spells it ("uint8", "float32", "bfloat16"...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.short_name()
    }

    /// Shape, batch dimension first.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.shape.iter())
    }

    /// Payload size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    /// Address of the first byte, for diagnostics (e.g. checking that the
    /// tensor lies inside the shared-memory ring).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.data
    }

    /// DLPack export (`torch.from_dlpack(view)`): a capsule over the same
    /// bytes, no copy; `copy=True` is refused (copy the tensor you get
    /// instead), as is a device other than the tensor's. For a tensor on a
    /// GPU, `stream` is the consumer's: the copy's event is waited on there
    /// (1: the legacy default stream, also for None; 2: the per-thread
    /// default stream; above 2: a `cudaStream_t`; -1: no wait, the consumer
    /// orders itself), and the buffer is reused only after that stream's
    /// work queued until the tensor is freed.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // The legacy capsule is what we return whatever version is asked
        // for, as the protocol allows.
        let _ = max_version;
        if let Some(asked) = dl_device
            && asked != self.device
        {
            return Err(PyBufferError::new_err(format!(
                "tensor {} lives on {}; it exports without copying, so only there",
                self.name,
                self.batch.device()
            )));
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "batch tensors export without copying; copy the tensor you get",
            ));
        }
        if self.device.0 == dlpack::DEVICE_CUDA {
            let stream = match stream {
                None => 1,
                Some(s) => s.extract::<i64>().map_err(|_| {
                    PyValueError::new_err("stream must be an integer (a CUDA stream handle, 1, 2 or -1)")
                })?,
            };
            match stream {
                -1 => {}
                0 => {
                    return Err(PyValueError::new_err(
                        "stream 0 is ambiguous for CUDA (DLPack): pass 1 (legacy default), 2 (per-thread default) or a stream",
                    ));
                }
                s if s > 0 => {
                    let copy = self
                        .batch
                        .on_device()
                        .ok_or_else(|| PyBufferError::new_err("the batch has no device copy"))?;
                    py.detach(|| copy.wait_on_stream(s as u64)).map_err(crate::errors::to_py)?;
                }
                s => return Err(PyValueError::new_err(format!("invalid stream {s} for CUDA (DLPack)"))),
            }
        } else {
            let _ = stream;
        }
        dlpack::capsule(py, &self.batch, self.data, self.dtype, &self.shape, self.device)
    }

    /// `(kDLCPU, 0)`, or `(kDLCUDA, ordinal)` for a batch on a GPU.
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.device
    }

    /// Where the tensor lives: "cpu", or "cuda:N".
    #[getter]
    fn device(&self) -> String {
        match self.device {
            (dlpack::DEVICE_CUDA, n) => format!("cuda:{n}"),
            _ => "cpu".into(),
        }
    }

    /// Buffer protocol: a read-only, C-contiguous view of the payload.
    ///
    /// # Safety
    /// Called by Python with a valid `view` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no buffer to fill"));
        }
        if slf.get().device.0 != dlpack::DEVICE_CPU {
            return Err(PyBufferError::new_err(format!(
                "tensor {} lives on {}: use batch.torch() (DLPack), not numpy",
                slf.get().name,
                slf.get().batch.device()
            )));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err(
                "batch arrays are read-only views of shared memory; copy one with numpy.array(x)",
            ));
        }
        let this = slf.get();
        let ndim = c_int::try_from(this.shape.len())
            .map_err(|_| PyBufferError::new_err("too many dimensions"))?;
        let (data, len, item) = (this.data, this.len, this.dtype.size());
        let shape = this.shape.as_ptr().cast_mut();
        let strides = this.strides.as_ptr().cast_mut();
        // SAFETY: `view` is non-null and Python's to fill. Every pointer
        // stored in it stays valid while `view.obj` (a new reference to
        // `slf`, released by PyBuffer_Release) lives: the bytes are owned by
        // `this.batch`, shape and strides by `this` (frozen, never changed),
        // and the format is static. The buffer is read-only, as promised by
        // refusing PyBUF_WRITABLE above.
        unsafe {
            (*view).buf = data as *mut c_void;
            (*view).len = len as isize;
            (*view).readonly = 1;
            (*view).itemsize = item as isize;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                format(this.dtype).as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = ndim;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                shape
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                strides
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "TensorView(name={:?}, dtype={}, shape={:?})",
            self.name,
            self.dtype.short_name(),
            self.shape
        )
    }
}
