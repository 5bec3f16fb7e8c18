//! The pin-memory stage: batches land on a device (an NVIDIA GPU with the
//! feature `cuda`) straight from the shared-memory ring, between the
//! consumer and the user.
//!
//! No pinned staging copy: the ring is one memfd this process owns, so the
//! CUDA backend registers its whole mapping with the driver once
//! (`cuMemHostRegister`) and each batch is DMA'd from the slot the worker
//! wrote it into. The slot goes back to the workers only after the copy's
//! event completed. A batch that did not come through the ring (gRPC), or
//! every batch when the driver refuses the registration, is copied through
//! a pinned buffer of its own.
//!
//! # Layout
//! - [`device`](Device): [`Device`], the `device` option (`cpu`, `cuda`,
//!   `cuda:N`, `auto`, `host`) parsed and printed.
//! - `backend`: what the stage asks of a device (allocate, copy with an
//!   event, read back), dispatched over the backends.
//! - `host`: the host backend: copies complete asynchronously and out of
//!   order on a thread pool; what tests and `device="host"` use.
//! - `cuda` (feature `cuda`): the CUDA backend over cudarc's driver API,
//!   loaded at run time.
//! - `pool`: device buffers, at most `device_prefetch + 2`, reused; the
//!   bound is the back-pressure.
//! - `stage`: [`PinStage`] itself: ordering, the reaper that returns slots
//!   after their events, and the correction of a saved position.
//! - [`on_device`](DeviceCopy): [`DeviceCopy`] and [`DeviceTensor`], what a
//!   device batch shows its user.

mod backend;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod host;
mod on_device;
mod pool;
mod stage;

#[cfg(test)]
mod tests;

pub(crate) use backend::{Backend, Opening, preflight};
pub use device::{BadDevice, Device};
pub use on_device::{DeviceCopy, DeviceTensor};
pub(crate) use stage::{PinStage, Pull, unyield};

/// Copies queued ahead of the batch being yielded, unless told otherwise:
/// two hide one batch's copy behind the training step of the one before.
pub const DEFAULT_DEVICE_PREFETCH: u32 = 2;
