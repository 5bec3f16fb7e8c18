//! [`SamplePlan`]: what every sample of a Python dataset looks like, taken
//! from its schema sample, so the worker writes a sample into its rows
//! without a Python call per leaf.
//!
//! A plan exists for samples made of tuples, lists and dicts (exactly those
//! types) of numpy arrays (anything with the buffer protocol), torch CPU
//! tensors, and Python `int`/`float`/`bool`. Writing a sample walks it
//! against the plan: the same containers and dict keys in the same order,
//! each array C-contiguous with the schema's element format and shape, each
//! tensor contiguous on the CPU with the schema's dtype and shape (its bytes
//! copied straight from its storage: a torchvision pipeline's
//! `ToTensor()`/`PILToTensor()` output costs a memcpy, not a conversion to
//! numpy in Python), each number of the schema's type (ints as int64,
//! floats as float64, bools as one byte, as `loader._source` flattens
//! them). Anything else — a numpy scalar, a strided view, a tensor on a GPU,
//! a different shape — is a [`Miss`]: the caller hands that sample to the
//! Python half, which converts what it can and words the error for what it
//! cannot.

use std::ffi::CString;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

/// The sample does not follow the plan; the Python half reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Miss;

/// The shape of every sample, or of one part of it.
#[derive(Debug)]
pub(crate) enum SamplePlan {
    /// A tuple (or a list) of exactly these parts.
    Seq {
        /// A tuple, not a list.
        tuple: bool,
        /// Its parts, in order.
        items: Vec<SamplePlan>,
    },
    /// A dict with exactly these keys, in this order.
    Dict {
        /// Keys, in insertion order.
        keys: Vec<Py<PyString>>,
        /// The value of each key.
        values: Vec<SamplePlan>,
    },
    /// An array: its buffer's element format and shape.
    Array {
        /// The buffer protocol's format string (`"f"`, `"<f"`, `"B"`...).
        format: CString,
        /// Shape of the array.
        shape: Vec<usize>,
    },
    /// A torch tensor (`torch.Tensor` or a subclass) on the CPU.
    Tensor {
        /// `torch.Tensor`, for the instance check.
        class: Py<PyType>,
        /// Its `torch.dtype` (compared by identity: dtypes are singletons).
        dtype: Py<PyAny>,
        /// Shape of the tensor.
        shape: Vec<usize>,
    },
    /// A Python `int`, written as little-endian int64.
    Int,
    /// A Python `float`, written as little-endian float64.
    Float,
    /// A Python `bool`, written as one byte.
    Bool,
}

impl SamplePlan {
    /// The plan `sample` follows; None when some part of it is not one the
    /// plan knows (every sample then goes through the Python half).
    pub(crate) fn of(sample: &Bound<'_, PyAny>) -> Option<Self> {
        if sample.is_exact_instance_of::<PyBool>() {
            return Some(Self::Bool);
        }
        if sample.is_exact_instance_of::<PyInt>() {
            return Some(Self::Int);
        }
        if sample.is_exact_instance_of::<PyFloat>() {
            return Some(Self::Float);
        }
        if let Ok(t) = sample.cast_exact::<PyTuple>() {
            let items = t.iter().map(|v| Self::of(&v)).collect::<Option<_>>()?;
            return Some(Self::Seq { tuple: true, items });
        }
        if let Ok(l) = sample.cast_exact::<PyList>() {
            let items = l.iter().map(|v| Self::of(&v)).collect::<Option<_>>()?;
            return Some(Self::Seq { tuple: false, items });
        }
        if let Ok(d) = sample.cast_exact::<PyDict>() {
            let mut keys = Vec::with_capacity(d.len());
            let mut values = Vec::with_capacity(d.len());
            for (k, v) in d.iter() {
                keys.push(k.cast_exact::<PyString>().ok()?.clone().unbind());
                values.push(Self::of(&v)?);
            }
            return Some(Self::Dict { keys, values });
        }
        if let Some(class) = torch_tensor_class(sample.py())
            && sample.is_instance(&class).unwrap_or(false)
        {
            let py = sample.py();
            if !tensor_is_plain(sample) {
                return None;
            }
            return Some(Self::Tensor {
                dtype: sample.getattr(intern!(py, "dtype")).ok()?.unbind(),
                shape: sample.getattr(intern!(py, "shape")).ok()?.extract().ok()?,
                class: class.unbind(),
            });
        }
        let buf = PyUntypedBuffer::get(sample).ok()?;
        if !buf.is_c_contiguous() {
            return None;
        }
        Some(Self::Array {
            format: buf.format().to_owned(),
            shape: buf.shape().to_vec(),
        })
    }

    /// Leaves (rows) a sample of this plan has.
    pub(crate) fn leaves(&self) -> usize {
        match self {
            Self::Seq { items, .. } => items.iter().map(Self::leaves).sum(),
            Self::Dict { values, .. } => values.iter().map(Self::leaves).sum(),
            Self::Array { .. } | Self::Tensor { .. } | Self::Int | Self::Float | Self::Bool => 1,
        }
    }

    /// Writes `sample`'s leaves into `rows` (one per leaf, in order, each
    /// exactly its leaf's size). On a [`Miss`] some rows may be written:
    /// the caller writes them all again.
    pub(crate) fn write(&self, sample: &Bound<'_, PyAny>, rows: &mut [&mut [u8]]) -> Result<(), Miss> {
        let mut next = 0;
        self.walk(sample, rows, &mut next)?;
        if next == rows.len() { Ok(()) } else { Err(Miss) }
    }

    fn walk(&self, v: &Bound<'_, PyAny>, rows: &mut [&mut [u8]], next: &mut usize) -> Result<(), Miss> {
        match self {
            Self::Seq { tuple: true, items } => {
                let t = v.cast_exact::<PyTuple>().map_err(|_| Miss)?;
                if t.len() != items.len() {
                    return Err(Miss);
                }
                for (item, plan) in t.iter().zip(items) {
                    plan.walk(&item, rows, next)?;
                }
                Ok(())
            }
            Self::Seq { tuple: false, items } => {
                let l = v.cast_exact::<PyList>().map_err(|_| Miss)?;
                if l.len() != items.len() {
                    return Err(Miss);
                }
                for (item, plan) in l.iter().zip(items) {
                    plan.walk(&item, rows, next)?;
                }
                Ok(())
            }
            Self::Dict { keys, values } => {
                let d = v.cast_exact::<PyDict>().map_err(|_| Miss)?;
                if d.len() != keys.len() {
                    return Err(Miss);
                }
                for ((k, value), (key, plan)) in d.iter().zip(keys.iter().zip(values)) {
                    let key = key.bind(v.py());
                    if !(k.is(key) || k.eq(key).unwrap_or(false)) {
                        return Err(Miss);
                    }
                    plan.walk(&value, rows, next)?;
                }
                Ok(())
            }
            Self::Int => {
                if !v.is_exact_instance_of::<PyInt>() {
                    return Err(Miss);
                }
                let n: i64 = v.extract().map_err(|_| Miss)?;
                put(leaf(rows, next)?, &n.to_le_bytes())
            }
            Self::Float => {
                if !v.is_exact_instance_of::<PyFloat>() {
                    return Err(Miss);
                }
                let x: f64 = v.extract().map_err(|_| Miss)?;
                put(leaf(rows, next)?, &x.to_le_bytes())
            }
            Self::Bool => {
                if !v.is_exact_instance_of::<PyBool>() {
                    return Err(Miss);
                }
                put(leaf(rows, next)?, &[u8::from(v.is_truthy().map_err(|_| Miss)?)])
            }
            Self::Tensor { class, dtype, shape } => tensor_row(v, class, dtype, shape, leaf(rows, next)?),
            Self::Array { format, shape } => {
                // A number where an array was: the Python half says so.
                if v.is_instance_of::<PyInt>() || v.is_instance_of::<PyFloat>() {
                    return Err(Miss);
                }
                let row = leaf(rows, next)?;
                let buf = PyUntypedBuffer::get(v).map_err(|_| Miss)?;
                if !buf.is_c_contiguous()
                    || buf.format() != format.as_c_str()
                    || buf.shape() != shape.as_slice()
                    || buf.len_bytes() != row.len()
                {
                    return Err(Miss);
                }
                // SAFETY: the buffer is held (and so its memory kept alive
                // and unmoved by its exporter) until `buf` drops at the end
                // of this block; it is C-contiguous, so its `len_bytes()`
                // bytes start at `buf_ptr()`; that length was just checked
                // to equal the row's. Read only, with the GIL held (no
                // Python code runs while the bytes are copied).
                let bytes = unsafe { std::slice::from_raw_parts(buf.buf_ptr().cast::<u8>(), buf.len_bytes()) };
                put(row, bytes)
            }
        }
    }
}

/// The row of the next leaf.
fn tensor_row(v: &Bound<'_, PyAny>, class: &Py<PyType>, dtype: &Py<PyAny>, shape: &[usize], row: &mut [u8]) -> Result<(), Miss> {
    let py = v.py();
    if !v.is_instance(class.bind(py)).map_err(|_| Miss)? || !tensor_is_plain(v) {
        return Err(Miss);
    }
    if !v.getattr(intern!(py, "dtype")).map_err(|_| Miss)?.is(dtype.bind(py)) {
        return Err(Miss);
    }
    let got: Vec<usize> = v.getattr(intern!(py, "shape")).and_then(|s| s.extract()).map_err(|_| Miss)?;
    let nbytes: usize = v.getattr(intern!(py, "nbytes")).and_then(|n| n.extract()).map_err(|_| Miss)?;
    if got != shape || nbytes != row.len() {
        return Err(Miss);
    }
    if nbytes == 0 {
        return Ok(());
    }
    let ptr: usize = v.call_method0(intern!(py, "data_ptr")).and_then(|p| p.extract()).map_err(|_| Miss)?;
    if ptr == 0 {
        return Err(Miss);
    }
    // SAFETY: `v` is a strided, contiguous CPU tensor (checked just above,
    // with the GIL held since): its `nbytes` bytes lie contiguously from
    // `data_ptr()` (which already includes its storage offset), in its
    // storage, which `v` keeps alive; `nbytes` was checked to equal the
    // row's length. No Python code runs while the bytes are copied (the GIL
    // is held), so nothing resizes or frees the storage meanwhile.
    let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, nbytes) };
    put(row, bytes)
}

/// A tensor whose bytes are its elements in order: dense (strided),
/// contiguous, on the CPU, not a lazily conjugated or negated view.
fn tensor_is_plain(v: &Bound<'_, PyAny>) -> bool {
    let py = v.py();
    let truthy = |name: &Bound<'_, PyString>, call: bool| {
        let got = if call { v.call_method0(name) } else { v.getattr(name) };
        got.and_then(|x| x.is_truthy()).unwrap_or(false)
    };
    truthy(intern!(py, "is_cpu"), false)
        && truthy(intern!(py, "is_contiguous"), true)
        && !truthy(intern!(py, "is_sparse"), false)
        && !truthy(intern!(py, "is_conj"), true)
        && !truthy(intern!(py, "is_neg"), true)
        && !truthy(intern!(py, "is_quantized"), false)
}

/// `torch.Tensor`, when torch is loaded (never imported here).
fn torch_tensor_class(py: Python<'_>) -> Option<Bound<'_, PyType>> {
    let modules = py.import(intern!(py, "sys")).ok()?.getattr(intern!(py, "modules")).ok()?;
    let torch = modules.get_item(intern!(py, "torch")).ok()?;
    torch.getattr(intern!(py, "Tensor")).ok()?.cast_into::<PyType>().ok()
}

/// The row of the next leaf.
fn leaf<'r>(rows: &'r mut [&mut [u8]], next: &mut usize) -> Result<&'r mut [u8], Miss> {
    let row = rows.get_mut(*next).ok_or(Miss)?;
    *next += 1;
    Ok(&mut **row)
}

/// Copies a leaf's bytes into its row, which must be exactly as long.
fn put(row: &mut [u8], bytes: &[u8]) -> Result<(), Miss> {
    if row.len() != bytes.len() {
        return Err(Miss);
    }
    row.copy_from_slice(bytes);
    Ok(())
}
