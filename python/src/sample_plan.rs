//! [`SamplePlan`]: what every sample of a Python dataset looks like, taken
//! from its schema sample, so the worker writes a sample into its rows
//! without a Python call per leaf.
//!
//! A plan exists for samples made of tuples, lists and dicts (exactly those
//! types) of numpy arrays (anything with the buffer protocol), torch CPU
//! tensors, and Python `int`/`float`/`bool`. Writing a sample walks it
//! against the plan: the same containers and dict keys in the same order,
//! each array C-contiguous with the schema's element format and shape, each
//! tensor dense on the CPU with the schema's dtype and shape, each number of
//! the schema's type (ints as int64, floats as float64, bools as one byte,
//! as `loader._source` flattens them). Anything else — a numpy scalar, a
//! strided numpy view, a tensor on a GPU, a different shape — is a
//! [`Miss`]: the caller hands that sample to the Python half, which
//! converts what it can and words the error for what it cannot.
//!
//! A tensor's elements are copied in C order straight from its storage,
//! whatever its strides: torchvision's `PILToTensor()` returns a permuted
//! (CHW over HWC) view, and copying it here costs one gather, not a
//! `.contiguous()` copy plus a conversion to numpy in Python. A strided
//! tensor's offset and strides are checked against its storage's size
//! before a byte is read (see [`TensorLayout`]); strides of 0 (`expand`)
//! read an element more than once, as `.contiguous()` does.

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
        /// Bytes per element: the dtype's (checked per sample) fixes it.
        elem: usize,
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
                elem: sample.call_method0(intern!(py, "element_size")).ok()?.extract().ok().filter(|&e| e > 0)?,
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
            Self::Tensor { class, dtype, shape, elem } => tensor_row(v, class, dtype, shape, *elem, leaf(rows, next)?),
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

/// Writes tensor `v` into `row`, its elements in C order, when it is a
/// plain tensor of the plan's class, dtype, shape and element size.
fn tensor_row(
    v: &Bound<'_, PyAny>,
    class: &Py<PyType>,
    dtype: &Py<PyAny>,
    shape: &[usize],
    elem: usize,
    row: &mut [u8],
) -> Result<(), Miss> {
    let py = v.py();
    // The plan's dtype (`SamplePlan::of` takes no complex or quantized one)
    // rules out a lazy conjugation and quantized values; a sparse or mkldnn
    // tensor has no storage (`data_ptr()` and `untyped_storage()` below
    // raise). Left to ask per sample: the device and a lazy negation
    // (`_neg_view`, of any dtype).
    if !v.is_instance(class.bind(py)).map_err(|_| Miss)?
        || !v.getattr(intern!(py, "dtype")).map_err(|_| Miss)?.is(dtype.bind(py))
        || !truthy(v, intern!(py, "is_cpu"), false)
        || truthy(v, intern!(py, "is_neg"), true)
    {
        return Err(Miss);
    }
    let got: Vec<usize> = v.getattr(intern!(py, "shape")).and_then(|s| s.extract()).map_err(|_| Miss)?;
    let nbytes = shape.iter().try_fold(elem, |n, &d| n.checked_mul(d)).ok_or(Miss)?;
    if got != shape || nbytes != row.len() {
        return Err(Miss);
    }
    if nbytes == 0 {
        return Ok(());
    }
    // Negative strides (torch has none today) fail to extract: a miss.
    let strides: Vec<usize> = v.call_method0(intern!(py, "stride")).and_then(|s| s.extract()).map_err(|_| Miss)?;
    let layout = TensorLayout::new(shape, &strides, elem).ok_or(Miss)?;
    let first = if layout.is_contiguous() {
        // Its `nbytes` from `data_ptr()` (which includes the storage
        // offset) lie in its storage by torch's own invariant, the one
        // `.numpy()` relies on. Not asked of the storage: a new storage
        // object per sample costs small tensors more than their copy.
        v.call_method0(intern!(py, "data_ptr")).and_then(|p| p.extract()).map_err(|_| Miss)?
    } else {
        // The bytes its strides reach, as `layout` computed them, must lie
        // in its storage.
        let offset: usize = v.call_method0(intern!(py, "storage_offset")).and_then(|o| o.extract()).map_err(|_| Miss)?;
        let storage = v.call_method0(intern!(py, "untyped_storage")).map_err(|_| Miss)?;
        let start: usize = storage.call_method0(intern!(py, "data_ptr")).and_then(|p| p.extract()).map_err(|_| Miss)?;
        let size: usize = storage.call_method0(intern!(py, "nbytes")).and_then(|n| n.extract()).map_err(|_| Miss)?;
        let skip = offset.checked_mul(elem).ok_or(Miss)?;
        if start == 0 || skip.checked_add(layout.extent).is_none_or(|end| end > size) {
            return Err(Miss);
        }
        start.checked_add(skip).ok_or(Miss)?
    };
    if first == 0 {
        return Err(Miss);
    }
    // SAFETY: `v` is a CPU tensor (checked above, with the GIL held since,
    // so no Python code runs to resize or free its storage while the bytes
    // are read) whose first element is at `first`. The `layout.extent`
    // bytes from there lie in its storage: for a contiguous tensor they are
    // its `nbytes` from `data_ptr()` (torch's invariant), for any other
    // they were just checked against the storage's own size. The storage
    // is torch's allocation, never the batch buffer `row`.
    let src = unsafe { std::slice::from_raw_parts(std::ptr::with_exposed_provenance::<u8>(first), layout.extent) };
    layout.copy(src, row);
    Ok(())
}

/// Where a tensor's elements lie, relative to its first one: its
/// dimensions of size 1 dropped and each dimension that steps over exactly
/// the next one merged with it, so a contiguous tensor is one `memcpy` and
/// `PILToTensor()`'s CHW view of HWC bytes is 3 planes gathered byte by byte.
#[derive(Debug)]
struct TensorLayout {
    /// (size, byte stride) of each dimension left, outermost first; every
    /// size is at least 2.
    dims: Vec<(usize, usize)>,
    /// Bytes copied at each position: one element, or the whole innermost
    /// dimension when its elements are adjacent.
    run: usize,
    /// Bytes from the first element to the end of the last one reached.
    extent: usize,
}

impl TensorLayout {
    /// The layout of a tensor of `shape`, `strides` (in elements) and
    /// `elem`-byte elements; None when it holds no element or a byte
    /// offset overflows.
    fn new(shape: &[usize], strides: &[usize], elem: usize) -> Option<Self> {
        if shape.len() != strides.len() || elem == 0 || shape.contains(&0) {
            return None;
        }
        let mut dims: Vec<(usize, usize)> = Vec::with_capacity(shape.len());
        for (&n, &stride) in shape.iter().zip(strides) {
            if n == 1 {
                continue;
            }
            let stride = stride.checked_mul(elem)?;
            let span = n.checked_mul(stride)?;
            match dims.last_mut() {
                Some((outer, outer_stride)) if *outer_stride == span => {
                    *outer = outer.checked_mul(n)?;
                    *outer_stride = stride;
                }
                _ => dims.push((n, stride)),
            }
        }
        let mut run = elem;
        if let Some(&(n, stride)) = dims.last()
            && stride == elem
        {
            run = n.checked_mul(elem)?;
            dims.pop();
        }
        let extent = dims.iter().try_fold(run, |end, &(n, stride)| end.checked_add((n - 1).checked_mul(stride)?))?;
        Some(Self { dims, run, extent })
    }

    /// Its elements are adjacent, in C order: one run.
    fn is_contiguous(&self) -> bool {
        self.dims.is_empty()
    }

    /// Writes the elements into `row` in C order, reading them from `src`,
    /// the `extent` bytes from the first one. `row` holds exactly every
    /// element.
    fn copy(&self, src: &[u8], row: &mut [u8]) {
        debug_assert_eq!(src.len(), self.extent);
        debug_assert_eq!(row.len(), self.dims.iter().fold(self.run, |n, &(d, _)| n * d));
        copy_dims(src, &self.dims, self.run, row);
    }
}

/// [`TensorLayout::copy`], one dimension at a time: each `run` of bytes
/// of the innermost one copied in a loop specialised for its size, as
/// element-sized runs are single loads and stores.
fn copy_dims(src: &[u8], dims: &[(usize, usize)], run: usize, row: &mut [u8]) {
    match *dims {
        [] => row.copy_from_slice(&src[..run]),
        [(_, stride)] => match run {
            1 => gather::<1>(src, stride, row),
            2 => gather::<2>(src, stride, row),
            4 => gather::<4>(src, stride, row),
            8 => gather::<8>(src, stride, row),
            _ => {
                for (i, out) in row.chunks_exact_mut(run).enumerate() {
                    out.copy_from_slice(&src[i * stride..][..run]);
                }
            }
        },
        [(n, stride), ref inner @ ..] => {
            for (i, out) in row.chunks_exact_mut(row.len() / n).enumerate() {
                copy_dims(&src[i * stride..], inner, run, out);
            }
        }
    }
}

/// Fills `row` with `N`-byte runs taken from `src` every `stride` bytes.
fn gather<const N: usize>(src: &[u8], stride: usize, row: &mut [u8]) {
    for (i, out) in row.chunks_exact_mut(N).enumerate() {
        out.copy_from_slice(&src[i * stride..][..N]);
    }
}

/// A tensor a plan is made of: dense (strided) on the CPU, real or integer
/// (so never lazily conjugated), not quantized, not a lazily negated view:
/// its elements are its values.
fn tensor_is_plain(v: &Bound<'_, PyAny>) -> bool {
    let py = v.py();
    truthy(v, intern!(py, "is_cpu"), false)
        && !truthy(v, intern!(py, "is_sparse"), false)
        && !truthy(v, intern!(py, "is_complex"), true)
        && !truthy(v, intern!(py, "is_quantized"), false)
        && !truthy(v, intern!(py, "is_neg"), true)
}

/// `v.name` (or `v.name()` when `call`) is true; false when it raises.
fn truthy(v: &Bound<'_, PyAny>, name: &Bound<'_, PyString>, call: bool) -> bool {
    let got = if call { v.call_method0(name) } else { v.getattr(name) };
    got.and_then(|x| x.is_truthy()).unwrap_or(false)
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
