//! The CUDA backend (feature `cuda`): cudarc's driver API, loaded at run
//! time. The ring is registered with the driver once (`cuMemHostRegister`),
//! so a batch in a slot is DMA'd straight to the device with no staging
//! copy; a batch that is not in the ring (a gRPC frame), or any batch when
//! registration was refused, goes through a pinned buffer of its own
//! (`cuMemHostAlloc` without write-combining: the CPU writes it, and
//! write-combined memory is slow for anything else). One non-blocking
//! stream carries every copy; each copy records one event.
//!
//! Every driver handle here is used only while its owner (an `Arc` of
//! [`Context`]) lives, and the context is made current on the calling
//! thread before each call, so calls may come from any thread (the
//! trainer's, the stage's reaper, a DLPack deleter).

use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cudarc::driver::result;
use cudarc::driver::sys;
use loader_ring::trainer::SlotRing;

use crate::error::LoaderError;

/// The device's primary context and the stream every copy goes on.
pub(crate) struct Context {
    /// Ordinal, for messages.
    ordinal: u32,
    /// The device, for releasing the primary context.
    device: sys::CUdevice,
    /// The device's primary context (shared with torch and every other
    /// runtime-API user in the process, so pointers mean the same to all).
    ctx: sys::CUcontext,
    /// The copy stream: non-blocking, so it never waits for the legacy
    /// default stream's work.
    stream: sys::CUstream,
}

// SAFETY: driver API handles may be used from any thread; each call below
// first makes `ctx` current on the calling thread.
unsafe impl Send for Context {}
// SAFETY: as above; the driver serializes calls on one stream itself.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cuda:{}", self.ordinal)
    }
}

impl Context {
    /// Makes the primary context current on this thread.
    fn bind(&self) -> Result<(), LoaderError> {
        // SAFETY: `ctx` was retained in `open` and is released only in
        // `drop`, after every user of this `Context` is gone.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(|e| self.error("cuCtxSetCurrent", e))
    }

    /// A new event in this context (current on the calling thread), that a
    /// thread can sleep on (`BLOCKING_SYNC`; [`CudaEvent::wait`] polls
    /// first). The primary context's default is to spin, and the reaper
    /// waits on every copy: spinning through a large batch's copy cost the
    /// trainer 1.5 ms of CPU per 38.5 MB batch on an H200
    /// (docs/benchmarks.md). Stream waits (a consumer's, the next copy's)
    /// are the same either way.
    fn event(&self) -> Result<sys::CUevent, LoaderError> {
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
            | sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
        let mut event = std::mem::MaybeUninit::uninit();
        // SAFETY: `event` is written by the call before it is read, and
        // only read when the call succeeded.
        unsafe { sys::cuEventCreate(event.as_mut_ptr(), flags) }
            .result()
            .map_err(|e| self.error("cuEventCreate", e))?;
        // SAFETY: initialized by the successful call above.
        Ok(unsafe { event.assume_init() })
    }

    fn error(&self, call: &str, e: result::DriverError) -> LoaderError {
        LoaderError::Device(format!("device cuda:{}: {call} failed: {e}", self.ordinal))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            // SAFETY: the stream was created in this context and nothing
            // uses it any more (every owner of an `Arc<Context>` is gone).
            let _ = unsafe { result::stream::destroy(self.stream) };
        }
        // SAFETY: `device` is the device `ctx` was retained for, once.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}

/// The ring's mapping, registered with the driver; unregistered on drop,
/// before the mapping can go (this holds the ring).
struct Registration {
    /// Address of the mapping.
    ptr: usize,
    /// Holds the mapping while registered; tells ring bytes apart.
    ring: Arc<SlotRing>,
    /// To unregister in the right context.
    context: Arc<Context>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.context.bind().is_ok() {
            // SAFETY: `ptr` was registered by `register` and the mapping is
            // still alive (`ring` holds it); no copy from it is in flight:
            // the stage waits for every event before it drops its backend.
            let _ = unsafe { sys::cuMemHostUnregister(self.ptr as *mut c_void).result() };
        }
    }
}

/// Device memory, with the pinned staging buffer that goes with it once a
/// batch needed one.
pub(crate) struct CudaMemory {
    /// Device address.
    ptr: sys::CUdeviceptr,
    /// Bytes.
    len: usize,
    /// Pinned host memory of `len` bytes, for batches that are not in the
    /// registered ring; allocated on first need.
    staging: Mutex<Option<usize>>,
    /// The event of the last copy into this buffer: a staging buffer is
    /// rewritten only after the DMA that read it finished.
    last: Mutex<Option<Arc<CudaEvent>>>,
    /// Frees in the right context.
    context: Arc<Context>,
}

// SAFETY: a device address and a pinned host address are plain numbers to
// this process; the stage lends the buffer to one copy at a time.
unsafe impl Send for CudaMemory {}
// SAFETY: as above; the mutable parts are behind mutexes.
unsafe impl Sync for CudaMemory {}

impl std::fmt::Debug for CudaMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaMemory")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl CudaMemory {
    /// Capacity in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The device address.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The first `len` bytes, copied back to the host (synchronously, after
    /// the last copy into the buffer): for checks, not for training.
    pub(crate) fn read(&self, len: usize) -> Result<Vec<u8>, LoaderError> {
        self.context.bind()?;
        let last = self.last.lock().ok().and_then(|l| l.clone());
        if let Some(event) = last {
            event.wait()?;
        }
        let mut out = vec![0u8; len.min(self.len)];
        // SAFETY: `ptr` holds `self.len` bytes and `out` is no longer; the
        // last copy into it completed (waited for above).
        unsafe { result::memcpy_dtoh_sync(&mut out, self.ptr) }
            .map_err(|e| self.context.error("cuMemcpyDtoH", e))?;
        Ok(out)
    }
}

impl CudaMemory {
    /// An event recorded on the consumer's `stream` now: everything the
    /// consumer queued there (its reads of this buffer) comes before it.
    pub(crate) fn record_on(&self, stream: u64) -> Result<Arc<CudaEvent>, LoaderError> {
        self.context.bind()?;
        let event = Arc::new(CudaEvent {
            event: self.context.event()?,
            context: Arc::clone(&self.context),
        });
        // SAFETY: the event is alive; `stream` is the consumer's stream of
        // this device as it told us through DLPack, and it is still in use
        // (the consumer is freeing the tensor it read on it right now).
        unsafe { result::event::record(event.event, stream as sys::CUstream) }
            .map_err(|e| self.context.error("cuEventRecord", e))?;
        Ok(event)
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        if self.context.bind().is_err() {
            return;
        }
        if let Ok(Some(event)) = self.last.get_mut().map(Option::take) {
            let _ = event.wait();
        }
        if let Ok(Some(staging)) = self.staging.get_mut().map(Option::take) {
            // SAFETY: allocated by `malloc_host` below; the last DMA from it
            // completed (waited for above).
            let _ = unsafe { result::free_host(staging as *mut c_void) };
        }
        // SAFETY: allocated by `malloc_sync` in this context; the stage
        // drops device memory only when no batch or copy uses it.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// How long [`CudaEvent::wait`] polls before it sleeps: longer than a
/// small batch's copy takes (a 262 KB batch: about 10 us from launch to
/// done), far shorter than a large one's (38.5 MB: 0.7 ms).
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// One copy's event.
pub(crate) struct CudaEvent {
    /// Recorded on the copy stream right after the copy.
    event: sys::CUevent,
    /// Destroys it in the right context.
    context: Arc<Context>,
}

// SAFETY: an event handle may be queried, waited on and destroyed from any
// thread (each call binds the context first).
unsafe impl Send for CudaEvent {}
// SAFETY: as above.
unsafe impl Sync for CudaEvent {}

impl std::fmt::Debug for CudaEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaEvent")
            .field("event", &self.event)
            .finish()
    }
}

impl CudaEvent {
    /// The `CUevent` handle, for code that waits on it itself.
    pub(crate) fn raw(&self) -> u64 {
        self.event as u64
    }

    /// True once the copy completed (false also when the query fails; the
    /// wait then reports the error).
    pub(crate) fn is_done(&self) -> bool {
        // SAFETY: the event lives until `self` drops.
        self.context.bind().is_ok() && unsafe { result::event::query(self.event) }.is_ok()
    }

    /// Blocks this thread until the copy completed: polls for up to
    /// [`SPIN_BEFORE_SLEEP`], then sleeps on the event (`BLOCKING_SYNC`).
    /// A small batch's copy is done within the poll, so it pays no wake-up
    /// (sleeping on every 262 KB tokens batch read 0.91-0.97x their rate on
    /// an H200); a large one's is not, and sleeping through it spares the
    /// core a spin would burn (docs/benchmarks.md).
    pub(crate) fn wait(&self) -> Result<(), LoaderError> {
        self.context.bind()?;
        let until = Instant::now() + SPIN_BEFORE_SLEEP;
        loop {
            // SAFETY: the event lives until `self` drops.
            match unsafe { sys::cuEventQuery(self.event) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY if Instant::now() < until => {
                    std::hint::spin_loop();
                }
                sys::CUresult::CUDA_ERROR_NOT_READY => break,
                e => return Err(self.context.error("cuEventQuery", result::DriverError(e))),
            }
        }
        // SAFETY: the event lives until `self` drops.
        unsafe { result::event::synchronize(self.event) }
            .map_err(|e| self.context.error("cuEventSynchronize", e))
    }

    /// Makes `stream` (a `CUstream`, or 1 for the legacy default stream, 2
    /// for the per-thread one: the driver takes both as handles) wait for
    /// the copy, without blocking this thread.
    pub(crate) fn order_before(&self, stream: u64) -> Result<(), LoaderError> {
        self.context.bind()?;
        // SAFETY: the event lives until `self` drops; `stream` is the
        // caller's, valid by the DLPack contract (a stream of this device).
        unsafe {
            result::stream::wait_event(
                stream as sys::CUstream,
                self.event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| self.context.error("cuStreamWaitEvent", e))
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if self.context.bind().is_ok() {
            // SAFETY: created by `event::create`; a pending event may be
            // destroyed (the driver frees it once it completes).
            let _ = unsafe { result::event::destroy(self.event) };
        }
    }
}

/// The CUDA backend of the stage.
pub(crate) struct CudaBackend {
    /// Context and copy stream.
    context: Arc<Context>,
    /// The ring, registered; None when there is no ring or the driver
    /// refused (then every batch is staged).
    registration: Option<Registration>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.context)
            .field("ring_registered", &self.registration.is_some())
            .finish()
    }
}

impl CudaBackend {
    /// Opens GPU `ordinal` and registers `ring` with it. Errors are one line
    /// saying why the GPU cannot be used (no driver library, no such device,
    /// a driver call that failed).
    pub(crate) fn open(ordinal: u32, ring: Option<Arc<SlotRing>>) -> Result<Self, LoaderError> {
        probe(ordinal)?;
        let name = format!("device cuda:{ordinal}");
        let fail = |call: &str, e: result::DriverError| {
            LoaderError::Device(format!("{name}: {call} failed: {e}"))
        };
        let device = result::device::get(ordinal as i32).map_err(|e| fail("cuDeviceGet", e))?;
        // SAFETY: `device` came from `device::get`.
        let ctx = unsafe { result::primary_ctx::retain(device) }
            .map_err(|e| fail("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: just retained.
        if let Err(e) = unsafe { result::ctx::set_current(ctx) } {
            // SAFETY: retained once above.
            let _ = unsafe { result::primary_ctx::release(device) };
            return Err(fail("cuCtxSetCurrent", e));
        }
        let stream = match result::stream::create(result::stream::StreamKind::NonBlocking) {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: retained once above.
                let _ = unsafe { result::primary_ctx::release(device) };
                return Err(fail("cuStreamCreate", e));
            }
        };
        let context = Arc::new(Context {
            ordinal,
            device,
            ctx,
            stream,
        });
        let registration = ring.and_then(|ring| register(&context, ring));
        Ok(Self {
            context,
            registration,
        })
    }

    /// Whether ring batches are copied with no staging copy.
    pub(crate) fn ring_registered(&self) -> bool {
        self.registration.is_some()
    }

    /// Device memory of `len` bytes.
    pub(crate) fn alloc(&self, len: usize) -> Result<Arc<CudaMemory>, LoaderError> {
        self.context.bind()?;
        // SAFETY: the context is current; the memory is freed by `CudaMemory`.
        let ptr = unsafe { result::malloc_sync(len.max(1)) }
            .map_err(|e| self.context.error("cuMemAlloc", e))?;
        Ok(Arc::new(CudaMemory {
            ptr,
            len,
            staging: Mutex::new(None),
            last: Mutex::new(None),
            context: Arc::clone(&self.context),
        }))
    }

    /// Makes the copy stream wait for `event` (recorded on a consumer's
    /// stream when it let go of a buffer), so the next copy into that
    /// buffer cannot overtake the consumer's reads of it.
    pub(crate) fn after(&self, event: &CudaEvent) -> Result<(), LoaderError> {
        event.order_before(self.context.stream as u64)
    }

    /// Queues the copy of `src` into `dst` on the copy stream and records
    /// its event. The caller keeps `src` untouched and alive until the event
    /// completes, and lends `dst` to this copy alone.
    pub(crate) fn copy(
        &self,
        src: &Bytes,
        dst: &CudaMemory,
    ) -> Result<Arc<CudaEvent>, LoaderError> {
        self.context.bind()?;
        if src.len() > dst.len {
            return Err(LoaderError::Device(format!(
                "device cuda:{}: a {}-byte batch does not fit a {}-byte buffer",
                self.context.ordinal,
                src.len(),
                dst.len
            )));
        }
        let in_ring = self
            .registration
            .as_ref()
            .is_some_and(|r| r.ring.holds(src));
        let host: *const u8 = if in_ring {
            src.as_ptr()
        } else {
            // Staged: the previous DMA out of this staging buffer must be
            // done before the CPU rewrites it.
            let last = dst.last.lock().ok().and_then(|l| l.clone());
            if let Some(event) = last {
                event.wait()?;
            }
            let mut staging = dst
                .staging
                .lock()
                .map_err(|_| LoaderError::Device("a staging buffer's lock was poisoned".into()))?;
            let base = match *staging {
                Some(p) => p,
                None => {
                    // SAFETY: the context is current; flags 0: pinned,
                    // not write-combined; freed by `CudaMemory::drop`.
                    let p = unsafe { result::malloc_host(dst.len.max(1), 0) }
                        .map_err(|e| self.context.error("cuMemHostAlloc", e))?;
                    *staging = Some(p as usize);
                    p as usize
                }
            };
            // SAFETY: the staging buffer holds `dst.len >= src.len()` bytes,
            // and no DMA reads it (waited for above).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), base as *mut u8, src.len()) };
            base as *const u8
        };
        // SAFETY: `host` points at `src.len()` readable bytes that stay
        // untouched until the event (the stage holds the batch; the staging
        // buffer is rewritten only after it); `dst` holds at least as many.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst.ptr,
                host.cast::<c_void>(),
                src.len(),
                self.context.stream,
            )
        }
        .result()
        .map_err(|e| self.context.error("cuMemcpyHtoDAsync", e))?;
        let event = Arc::new(CudaEvent {
            event: self.context.event()?,
            context: Arc::clone(&self.context),
        });
        // SAFETY: both handles are alive and belong to this context.
        unsafe { result::event::record(event.event, self.context.stream) }
            .map_err(|e| self.context.error("cuEventRecord", e))?;
        if let Ok(mut last) = dst.last.lock() {
            *last = Some(Arc::clone(&event));
        }
        Ok(event)
    }
}

/// Fails, in one line, unless GPU `ordinal` can be used: the driver library
/// loads, the driver initializes and sees that many GPUs. Opens no context.
pub(crate) fn probe(ordinal: u32) -> Result<(), LoaderError> {
    let name = format!("device cuda:{ordinal}");
    // SAFETY: only tries to load the library; without this check the first
    // driver call would panic on a machine with no libcuda.
    if !unsafe { sys::is_culib_present() } {
        return Err(LoaderError::Device(format!(
            "{name}: no CUDA driver library (libcuda.so) on this machine; use device \"cpu\" (or \"auto\")"
        )));
    }
    let fail = |call: &str, e: result::DriverError| {
        LoaderError::Device(format!("{name}: {call} failed: {e}"))
    };
    result::init().map_err(|e| match e.0 {
        sys::CUresult::CUDA_ERROR_NO_DEVICE => LoaderError::Device(format!(
            "{name}: the CUDA driver sees no GPU on this machine"
        )),
        _ => fail("cuInit", e),
    })?;
    let count = result::device::get_count().map_err(|e| fail("cuDeviceGetCount", e))?;
    if i64::from(ordinal) >= i64::from(count) {
        return Err(LoaderError::Device(format!(
            "{name}: no such GPU, this machine has {count}{}",
            if count > 0 {
                format!(" (cuda:0 to cuda:{})", count - 1)
            } else {
                String::new()
            }
        )));
    }
    Ok(())
}

/// Registers the ring's mapping, or says once why not (then batches are
/// staged through pinned buffers).
fn register(context: &Arc<Context>, ring: Arc<SlotRing>) -> Option<Registration> {
    // SAFETY: `device` came from `device::get`.
    let supported = unsafe {
        result::device::get_attribute(
            context.device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED,
        )
    };
    if !matches!(supported, Ok(v) if v != 0) {
        tracing::warn!(
            "cuda:{}: this device cannot register host memory; batches are copied through a pinned staging buffer",
            context.ordinal
        );
        return None;
    }
    let range = ring.address_range();
    // SAFETY: the range is the ring's whole mapping (page-aligned, sealed
    // against shrinking, so the pages stay while registered); `ring` keeps
    // it mapped until `Registration::drop` unregisters it.
    let registered = unsafe {
        sys::cuMemHostRegister_v2(
            range.start as *mut c_void,
            range.len(),
            sys::CU_MEMHOSTREGISTER_PORTABLE,
        )
    }
    .result();
    match registered {
        Ok(()) => Some(Registration {
            ptr: range.start,
            ring,
            context: Arc::clone(context),
        }),
        Err(e) => {
            tracing::warn!(
                "cuda:{}: the driver refused to register the shared-memory ring ({e}); batches are copied through a pinned staging buffer",
                context.ordinal
            );
            None
        }
    }
}
