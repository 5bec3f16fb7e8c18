//! [`PySampleCache`]: `loader_worker::sample_cache::SampleCache` for the
//! Python half. The trainer creates one per `Loader.local(cache=...)` and
//! hands its descriptor to the workers the template forks; each worker's
//! `loader._cache` reads and stores samples through it; the trainer reads
//! its counters (`Loader.cache_stats()`).

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;

use loader_worker::dataset::CachePayoff;
use loader_worker::sample_cache::{Off, Put, SampleCache};
use std::ffi::{c_int, c_void};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyOSError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A sample cache mapped in this process.
#[pyclass(name = "SampleCache", module = "loader._native", frozen)]
#[derive(Debug)]
pub(crate) struct PySampleCache {
    cache: SampleCache,
}

#[pymethods]
impl PySampleCache {
    /// A new cache of `entries` samples and up to `capacity` bytes: in
    /// memory (a memfd), or in an unnamed file in `dir`.
    #[staticmethod]
    #[pyo3(signature = (entries, capacity, dir=None))]
    fn create(py: Python<'_>, entries: u64, capacity: u64, dir: Option<PathBuf>) -> PyResult<Self> {
        py.detach(|| SampleCache::create(entries, capacity, dir.as_deref()))
            .map(|cache| Self { cache })
            .map_err(|e| PyOSError::new_err(e.to_string()))
    }

    /// The cache of `entries` samples whose descriptor `fd` this process
    /// inherited (reopened, so `fd` stays the caller's).
    #[staticmethod]
    fn open(fd: RawFd, entries: u64) -> PyResult<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{fd}"))
            .map_err(|e| PyOSError::new_err(format!("sample cache: descriptor {fd}: {e}")))?;
        Self::adopt(file, entries)
    }

    /// The descriptor to hand to a worker.
    fn fd(&self) -> RawFd {
        self.cache.fd().as_raw_fd()
    }

    /// The entry of `index` as a read-only buffer over the cache's memory
    /// (no copy), or None.
    fn get(slf: Bound<'_, Self>, index: u64) -> PyResult<Option<CacheEntry>> {
        let Some(entry) = slf.get().cache.get(index) else {
            return Ok(None);
        };
        let (data, len) = (entry.as_ptr() as usize, entry.len());
        Ok(Some(CacheEntry { _cache: slf.unbind(), data, len }))
    }

    /// Stores the concatenation of `parts` (C-contiguous byte buffers) as
    /// the entry of `index`; True if it was stored (False: another worker
    /// has it, the space ran out, or the cache is off).
    fn put(&self, index: u64, parts: Vec<PyBuffer<u8>>) -> PyResult<bool> {
        if let Some(bad) = parts.iter().position(|p| !p.is_c_contiguous()) {
            return Err(PyValueError::new_err(format!("put: part {bad} is not C-contiguous")));
        }
        let slices: Vec<&[u8]> = parts
            .iter()
            .map(|p| {
                // SAFETY: a C-contiguous buffer of `len_bytes` bytes at
                // `buf_ptr`, held (PyBuffer keeps its exporter's buffer) and
                // read with the GIL held for the whole call, so no Python
                // code frees or resizes it meanwhile.
                unsafe { std::slice::from_raw_parts(p.buf_ptr().cast::<u8>(), p.len_bytes()) }
            })
            .collect();
        Ok(self.cache.put(index, &slices) == Put::Stored)
    }

    /// Counts a read that found its entry; `nanos`: what reading it back
    /// cost, when timed.
    #[pyo3(signature = (nanos=None))]
    fn record_hit(&self, nanos: Option<u64>) {
        self.cache.record_hit(nanos);
    }

    /// Counts what reading an entry back cost, for a trial read.
    fn time_hit(&self, nanos: u64) {
        self.cache.time_hit(Some(nanos));
    }

    /// Counts what storing an entry cost (encoding and writing it).
    fn time_store(&self, nanos: u64) {
        self.cache.time_store(nanos);
    }

    /// Counts a read that loaded its sample, in `nanos`.
    fn record_miss(&self, nanos: u64) {
        self.cache.record_miss(nanos);
    }

    /// Whether the cache is on.
    fn is_on(&self) -> bool {
        self.cache.is_on()
    }

    /// Turns it off for every worker: `why` is "does-not-pay", "failed" or
    /// "one-epoch".
    fn turn_off(&self, why: &str) -> PyResult<()> {
        let off = Off::named(why).ok_or_else(|| PyValueError::new_err(format!("turn_off: unknown reason {why:?}")))?;
        self.cache.turn_off(off);
        Ok(())
    }

    /// Whether the cache pays for a job of `epochs` epochs
    /// (`loader_worker::dataset::CachePayoff`, the worker's frame cache's
    /// rule too): `(pays, load_ns, store_ns, hit_ns)`, the costs averaged
    /// over every worker; None until enough is timed to say.
    fn payoff(&self, epochs: u32) -> Option<(bool, f64, f64, f64)> {
        CachePayoff::of(&self.cache.stats(), epochs).map(|p| (p.pays, p.load, p.store, p.hit))
    }

    /// The counters, summed over every worker.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.cache.stats();
        let out = PyDict::new(py);
        out.set_item("on", s.off.is_none())?;
        out.set_item("off_reason", s.off.map(Off::describe))?;
        out.set_item("entries", s.entries)?;
        out.set_item("capacity_bytes", s.capacity)?;
        out.set_item("hits", s.hits)?;
        out.set_item("misses", s.misses)?;
        out.set_item("stored", s.stored)?;
        out.set_item("stored_bytes", s.stored_bytes)?;
        out.set_item("refused_full", s.refused)?;
        out.set_item("load_ns", s.load_nanos)?;
        out.set_item("loads_timed", s.loads)?;
        out.set_item("hit_ns", s.hit_nanos)?;
        out.set_item("hits_timed", s.hits_timed)?;
        out.set_item("store_ns", s.store_nanos)?;
        out.set_item("stores_timed", s.stores_timed)?;
        Ok(out)
    }
}

/// One entry of a sample cache: a read-only buffer (`memoryview(entry)`)
/// over the cache's shared memory, which it keeps mapped.
#[pyclass(module = "loader._native", frozen)]
pub(crate) struct CacheEntry {
    /// Keeps the mapping (and so `data`) alive.
    _cache: Py<PySampleCache>,
    /// The entry's first byte, in that mapping.
    data: usize,
    len: usize,
}

#[pymethods]
impl CacheEntry {
    fn __len__(&self) -> usize {
        self.len
    }

    /// The buffer protocol, read-only.
    ///
    /// # Safety
    /// Called by Python with a view to fill.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no buffer to fill"));
        }
        let (data, len) = (slf.get().data, slf.get().len);
        let len = isize::try_from(len).map_err(|_| PyBufferError::new_err("entry too large"))?;
        // SAFETY: `view` is non-null and Python's to fill; PyBuffer_FillInfo
        // stores a new reference to `slf` in it, which keeps the cache and so
        // its mapping alive until the view is released. The entry's bytes
        // are never written again once published (`SampleCache::get`), and
        // the view is read-only (FillInfo refuses PyBUF_WRITABLE).
        let filled = unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), data as *mut c_void, len, 1, flags) };
        if filled != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

impl PySampleCache {
    fn adopt(file: File, entries: u64) -> PyResult<Self> {
        SampleCache::open(file, entries)
            .map(|cache| Self { cache })
            .map_err(|e| PyOSError::new_err(e.to_string()))
    }

    /// The cache's descriptor, for the template to pass on.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.cache.fd().as_raw_fd()
    }

    /// Indexes the cache has a slot for.
    pub(crate) fn entries(&self) -> u64 {
        self.cache.entries()
    }
}
