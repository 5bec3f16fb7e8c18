//! What the stage asks of a device, whichever it is: allocate, queue a
//! copy and get its event, read back. Dispatched by hand over the two
//! backends (host, CUDA) so each keeps its own memory and event types.

use std::sync::Arc;

use bytes::Bytes;
use loader_ring::trainer::SlotRing;

#[cfg(feature = "cuda")]
use super::cuda::{CudaBackend, CudaEvent, CudaMemory};
use super::device::Device;
use super::host::{HostBackend, HostEvent, HostMemory};
use crate::error::LoaderError;

/// A device the stage copies batches to.
#[derive(Debug)]
pub(crate) enum Backend {
    /// Host memory standing in for a device (tests, `device="host"`).
    Host(HostBackend),
    /// An NVIDIA GPU.
    #[cfg(feature = "cuda")]
    Cuda(CudaBackend),
}

/// Memory on a backend's device; freed when the last owner drops.
#[derive(Debug, Clone)]
pub(crate) enum Memory {
    /// Host memory.
    Host(Arc<HostMemory>),
    /// GPU memory.
    #[cfg(feature = "cuda")]
    Cuda(Arc<CudaMemory>),
}

/// The completion of one copy.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    /// Set by a host copy thread.
    Host(Arc<HostEvent>),
    /// A CUDA event on the copy stream.
    #[cfg(feature = "cuda")]
    Cuda(Arc<CudaEvent>),
}

/// Which device a loader's stage ended up on.
#[derive(Debug)]
pub(crate) struct Opened {
    /// The backend.
    pub(crate) backend: Backend,
    /// The device batches land on.
    pub(crate) device: Device,
}

/// What [`Backend::open`] found.
#[derive(Debug)]
pub(crate) enum Opening {
    /// A stage on this backend.
    Staged(Opened),
    /// No stage: the device is the host (`cpu`).
    Host,
    /// No stage: `auto` found no usable GPU, for this reason.
    FellBack(String),
}

impl Backend {
    /// Opens the backend for `device`; `ring` is registered with a GPU.
    /// `auto` falls back to the host (no stage) with one log line.
    pub(crate) fn open(
        device: Device,
        ring: Option<Arc<SlotRing>>,
    ) -> Result<Opening, LoaderError> {
        match device {
            Device::Cpu => Ok(Opening::Host),
            Device::Host => Ok(Opening::Staged(Opened {
                backend: Backend::Host(HostBackend::start()?),
                device,
            })),
            Device::Cuda(n) => {
                cuda(n, ring).map(|backend| Opening::Staged(Opened { backend, device }))
            }
            Device::Auto => match cuda(0, ring) {
                Ok(backend) => {
                    tracing::info!("device auto: batches land on cuda:0");
                    Ok(Opening::Staged(Opened {
                        backend,
                        device: Device::Cuda(0),
                    }))
                }
                Err(e) => {
                    tracing::warn!("device auto: no usable GPU, batches stay on the host ({e})");
                    Ok(Opening::FellBack(e.to_string()))
                }
            },
        }
    }

    /// Device memory of `len` bytes.
    pub(crate) fn alloc(&self, len: usize) -> Result<Memory, LoaderError> {
        match self {
            Backend::Host(b) => Ok(Memory::Host(b.alloc(len))),
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.alloc(len).map(Memory::Cuda),
        }
    }

    /// Queues a copy of `src` into `dst` (memory of this backend). The
    /// caller keeps `src` alive and unchanged until the event completes and
    /// lends `dst` to this copy alone.
    pub(crate) fn copy(&self, src: &Bytes, dst: &Memory) -> Result<Event, LoaderError> {
        match (self, dst) {
            (Backend::Host(b), Memory::Host(m)) => b.copy(src, m).map(Event::Host),
            #[cfg(feature = "cuda")]
            (Backend::Cuda(b), Memory::Cuda(m)) => b.copy(src, m).map(Event::Cuda),
            #[cfg(feature = "cuda")]
            _ => Err(LoaderError::Device(
                "memory of another device was handed to a copy".into(),
            )),
        }
    }

    /// Orders the next copy after `fence` (recorded on the stream a
    /// consumer last read a buffer on; nothing to order on the host).
    pub(crate) fn after(&self, fence: &Event) -> Result<(), LoaderError> {
        match (self, fence) {
            (Backend::Host(_), _) => Ok(()),
            #[cfg(feature = "cuda")]
            (Backend::Cuda(b), Event::Cuda(e)) => b.after(e),
            #[cfg(feature = "cuda")]
            (Backend::Cuda(_), Event::Host(_)) => Ok(()),
        }
    }

    /// For a GPU: whether ring batches are DMA'd with no staging copy.
    pub(crate) fn ring_registered(&self) -> bool {
        match self {
            Backend::Host(_) => false,
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.ring_registered(),
        }
    }
}

/// Fails, in one line, when `device` names a GPU this process cannot use
/// (see [`Backend::open`] for the reasons); opens nothing, so a loader can
/// check before it starts processes.
pub(crate) fn preflight(device: Device) -> Result<(), LoaderError> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => super::cuda::probe(n),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(n) => cuda(n, None).map(|_| ()),
        Device::Cpu | Device::Auto | Device::Host => Ok(()),
    }
}

/// Opens GPU `ordinal`, or says in one line why it cannot.
#[cfg(feature = "cuda")]
fn cuda(ordinal: u32, ring: Option<Arc<SlotRing>>) -> Result<Backend, LoaderError> {
    CudaBackend::open(ordinal, ring).map(Backend::Cuda)
}

/// Without the feature, every GPU device is an error that says so.
#[cfg(not(feature = "cuda"))]
fn cuda(ordinal: u32, ring: Option<Arc<SlotRing>>) -> Result<Backend, LoaderError> {
    let _ = ring;
    Err(LoaderError::Device(format!(
        "device cuda:{ordinal}: this build of Loader has no CUDA support (rebuild with the cargo feature `cuda`)"
    )))
}

impl Memory {
    /// Capacity in bytes.
    pub(crate) fn len(&self) -> usize {
        match self {
            Memory::Host(m) => m.len(),
            #[cfg(feature = "cuda")]
            Memory::Cuda(m) => m.len(),
        }
    }

    /// Address of the first byte on the device.
    pub(crate) fn ptr(&self) -> u64 {
        match self {
            Memory::Host(m) => m.ptr(),
            #[cfg(feature = "cuda")]
            Memory::Cuda(m) => m.ptr(),
        }
    }

    /// An event recorded now on the consumer's `stream`, which last read
    /// this memory; None on the host (nothing to order).
    pub(crate) fn record_on(&self, stream: u64) -> Result<Option<Event>, LoaderError> {
        match self {
            Memory::Host(_) => {
                let _ = stream;
                Ok(None)
            }
            #[cfg(feature = "cuda")]
            Memory::Cuda(m) => m.record_on(stream).map(|e| Some(Event::Cuda(e))),
        }
    }

    /// The first `len` bytes, back on the host; call after the event of
    /// the last copy into it (the CUDA one waits for it itself).
    pub(crate) fn read(&self, len: usize) -> Result<Vec<u8>, LoaderError> {
        match self {
            Memory::Host(m) => Ok(m.read(len)),
            #[cfg(feature = "cuda")]
            Memory::Cuda(m) => m.read(len),
        }
    }
}

impl Event {
    /// True once the copy completed.
    pub(crate) fn is_done(&self) -> bool {
        match self {
            Event::Host(e) => e.is_done(),
            #[cfg(feature = "cuda")]
            Event::Cuda(e) => e.is_done(),
        }
    }

    /// Blocks until the copy completed.
    pub(crate) fn wait(&self) -> Result<(), LoaderError> {
        match self {
            Event::Host(e) => {
                e.wait();
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Event::Cuda(e) => e.wait(),
        }
    }

    /// Makes the consumer's `stream` wait for the copy; on the host, waits.
    pub(crate) fn order_before(&self, stream: u64) -> Result<(), LoaderError> {
        match self {
            Event::Host(e) => {
                let _ = stream;
                e.wait();
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Event::Cuda(e) => e.order_before(stream),
        }
    }

    /// The `CUevent` handle; 0 on the host.
    pub(crate) fn raw(&self) -> u64 {
        match self {
            Event::Host(_) => 0,
            #[cfg(feature = "cuda")]
            Event::Cuda(e) => e.raw(),
        }
    }
}
