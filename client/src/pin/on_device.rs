//! The device half of a batch that went through the stage: the buffer its
//! bytes were copied into (the whole frame, so each tensor sits at the
//! offset the header gives), the copy's event, and the device. Public
//! through [`Batch::on_device`](crate::Batch::on_device).

use loader_proto::pb::Dtype;

use super::backend::Event;
use super::device::Device;
use super::pool::PooledBuffer;
use crate::error::LoaderError;

/// Where a batch's bytes lie on a device, and how to wait for them. Shared
/// by the clones of a batch; the device buffer returns to the loader's pool
/// when the last one drops.
#[derive(Debug)]
pub struct DeviceCopy {
    /// The buffer holding the frame.
    buffer: PooledBuffer,
    /// Completes when the frame is in `buffer`.
    event: Event,
    /// Which device.
    device: Device,
    /// Length of the frame.
    len: usize,
}

/// One tensor of a batch on a device: an address and what lies there.
#[derive(Debug, Clone, Copy)]
pub struct DeviceTensor<'a> {
    /// Name the worker gave it.
    pub name: &'a str,
    /// Element type.
    pub dtype: Dtype,
    /// Shape, batch dimension first (C order, contiguous).
    pub shape: &'a [u64],
    /// Device address of the first byte (64-byte aligned within the frame;
    /// the frame starts a device allocation).
    pub ptr: u64,
    /// Bytes.
    pub len: usize,
}

impl DeviceCopy {
    pub(crate) fn new(buffer: PooledBuffer, event: Event, device: Device, len: usize) -> Self {
        Self {
            buffer,
            event,
            device,
            len,
        }
    }

    /// The device the batch is on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Device address of the frame's first byte.
    pub fn ptr(&self) -> u64 {
        self.buffer.memory().map_or(0, |m| m.ptr())
    }

    /// Length of the frame in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty frame (never produced by a valid job).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The copy's `CUevent` handle (0 on the host backend), for code that
    /// orders its own streams after it.
    pub fn event(&self) -> u64 {
        self.event.raw()
    }

    /// True once the bytes are on the device.
    pub fn is_ready(&self) -> bool {
        self.event.is_done()
    }

    /// Blocks this thread until the bytes are on the device.
    pub fn wait(&self) -> Result<(), LoaderError> {
        self.event.wait()
    }

    /// Makes the consumer's `stream` (a `CUstream`; 1 is the legacy default
    /// stream, 2 the per-thread default stream) wait for the copy without
    /// blocking this thread, and remembers the stream: the next copy into
    /// this buffer (once the batch is dropped) waits for the work queued on
    /// it until the drop. On the host backend this waits for the copy.
    pub fn wait_on_stream(&self, stream: u64) -> Result<(), LoaderError> {
        self.event.order_before(stream)?;
        self.buffer.used_on(stream);
        Ok(())
    }

    /// The frame's bytes, copied back to the host after the copy completed:
    /// for checks (every byte equals the host batch's), not for training.
    pub fn read_back(&self) -> Result<Vec<u8>, LoaderError> {
        self.event.wait()?;
        let memory = self
            .buffer
            .memory()
            .ok_or_else(|| LoaderError::Device("the batch's device buffer is gone".into()))?;
        memory.read(self.len)
    }
}
