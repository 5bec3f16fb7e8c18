//! DLPack (the legacy, unversioned ABI that every consumer reads: torch,
//! numpy, jax, cupy) for a tensor of a batch: the C structures, and the
//! `"dltensor"` capsule that hands one to a consumer without copying.
//!
//! Ownership: the capsule owns a boxed [`Export`], which holds the batch
//! (so its ring slot, or for a batch on a GPU its device buffer, stays
//! held: the buffer returns to the loader's pool when the tensor is freed) and the shape and strides the C structure
//! points into. A consumer that takes the tensor renames the capsule to
//! `"used_dltensor"` and calls the deleter when its own tensor dies (from
//! any thread, with or without the GIL: the deleter touches no Python
//! object); a capsule nobody took frees it in its own destructor.

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use loader_client::{Batch, Dtype};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use pyo3::{PyErr, ffi};

/// Capsule name of an untaken tensor, from the DLPack specification.
const DLTENSOR: &CStr = c"dltensor";
/// `kDLCPU`.
pub(crate) const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`.
pub(crate) const DEVICE_CUDA: i32 = 2;

/// `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor`.
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// What one exported tensor owns. `managed` comes first so that a pointer
/// to it is a pointer to the whole export.
#[repr(C)]
struct Export {
    /// What the consumer reads.
    managed: DlManagedTensor,
    /// `managed.dl_tensor.shape` points here.
    shape: Box<[i64]>,
    /// `managed.dl_tensor.strides` points here (in elements, C order).
    strides: Box<[i64]>,
    /// Keeps the bytes (and the ring slot, or the device buffer) alive
    /// until the consumer is done.
    _batch: Arc<Batch>,
}

/// DLPack's type code for `dtype`.
fn data_type(dtype: Dtype) -> Option<DlDataType> {
    // kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6.
    let code = match dtype {
        Dtype::I8 | Dtype::I16 | Dtype::I32 | Dtype::I64 => 0,
        Dtype::U8 | Dtype::U16 | Dtype::U32 | Dtype::U64 => 1,
        Dtype::F16 | Dtype::F32 | Dtype::F64 => 2,
        Dtype::Bf16 => 4,
        Dtype::Bool => 6,
        Dtype::Unspecified => return None,
    };
    Some(DlDataType {
        code,
        bits: u8::try_from(dtype.size() * 8).ok()?,
        lanes: 1,
    })
}

/// One tensor of `batch` as a DLPack capsule: `len` bytes at `data`, of
/// `dtype` and `shape`, C-contiguous, on `device` (`(kDLCPU, 0)` or
/// `(kDLCUDA, ordinal)`; a device address then).
pub(crate) fn capsule<'py>(
    py: Python<'py>,
    batch: &Arc<Batch>,
    data: usize,
    dtype: Dtype,
    shape: &[isize],
    device: (i32, i32),
) -> PyResult<Bound<'py, PyCapsule>> {
    let dl_dtype = data_type(dtype).ok_or_else(|| {
        PyBufferError::new_err(format!("dtype {} has no DLPack type", dtype.short_name()))
    })?;
    let shape: Box<[i64]> = shape.iter().map(|&d| d as i64).collect();
    let mut strides = vec![1i64; shape.len()].into_boxed_slice();
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    let ndim = i32::try_from(shape.len())
        .map_err(|_| PyBufferError::new_err("too many dimensions for DLPack"))?;
    let mut export = Box::new(Export {
        managed: DlManagedTensor {
            dl_tensor: DlTensor {
                data: data as *mut c_void,
                device: DlDevice {
                    device_type: device.0,
                    device_id: device.1,
                },
                ndim,
                dtype: dl_dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_export),
        },
        shape,
        strides,
        _batch: Arc::clone(batch),
    });
    export.managed.dl_tensor.shape = export.shape.as_mut_ptr();
    export.managed.dl_tensor.strides = export.strides.as_mut_ptr();
    let raw = Box::into_raw(export);
    // SAFETY: `raw` is a live, uniquely owned `Export` from `Box::into_raw`;
    // its address is stored as the context so the deleter can rebuild the box.
    unsafe { (*raw).managed.manager_ctx = raw.cast() };
    // SAFETY: `raw` points to a valid `DlManagedTensor` (the first field of
    // a repr(C) `Export`) that stays valid until its deleter runs; the name
    // is a static C string as PyCapsule_New requires; on failure the box is
    // freed here and nothing else refers to it.
    unsafe {
        let capsule = ffi::PyCapsule_New(raw.cast(), DLTENSOR.as_ptr(), Some(drop_untaken));
        if capsule.is_null() {
            drop(Box::from_raw(raw));
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, capsule).cast_into_unchecked())
    }
}

/// The deleter DLPack consumers call once they no longer need the tensor.
unsafe extern "C" fn delete_export(managed: *mut DlManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` came from `capsule`, where it is the first field of
    // a boxed `Export` whose address `manager_ctx` holds; DLPack calls the
    // deleter exactly once (the capsule destructor only calls it for an
    // untaken capsule, and a consumer takes the capsule by renaming it).
    unsafe {
        let export = (*managed).manager_ctx.cast::<Export>();
        drop(Box::from_raw(export));
    }
}

/// Capsule destructor: frees the export if no consumer took it.
unsafe extern "C" fn drop_untaken(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the GIL held on the capsule being
    // destroyed. A capsule still named "dltensor" was never taken, so its
    // pointer is our `DlManagedTensor` and no one else will delete it; a
    // taken one is renamed and left to its consumer. PyCapsule_IsValid sets
    // no error.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr());
            delete_export(managed.cast());
        }
    }
}
