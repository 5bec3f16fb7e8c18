//! The shared-memory ring of a `Loader.local` job whose batch size only
//! its first sample tells (a Python dataset's), or whose batches outgrow
//! the default slot: a batch's bytes from the batch layout itself
//! ([`BatchLayout`]), and the window and slots for batches of that size
//! (`loader._ring` asks; the Rust SDK sizes a built-in job's ring itself).

use loader_proto::batch::{BatchLayout, TensorDesc};
use loader_proto::pb::Dtype;
use pyo3::prelude::*;

/// Memory the ring of one loader sized here may take: its slots are
/// fewer than the workers' windows would ask for beyond it.
const RING_BUDGET: u64 = 1 << 30;

/// Fewest slots a sized ring has: the Rust SDK's own floor for a ring of
/// its default geometry.
const MIN_SLOTS: u32 = 4;

use loader_ring::frame::MAX_SLOTS;

/// Bytes of one batch of `batch_size` samples holding `tensors`
/// (`(name, dtype, shape)`, the batch dimension first) in the batch
/// format, header, index list and payload alignment included: what a
/// worker will lay out. None when no worker could lay it out (an unknown
/// dtype, too many tensors or dimensions, a name too long): the workers
/// then say why.
#[pyfunction]
pub(crate) fn batch_len(batch_size: usize, tensors: Vec<(String, String, Vec<u64>)>) -> Option<u64> {
    let descs = tensors
        .into_iter()
        .map(|(name, dtype, shape)| Some(TensorDesc { name, dtype: Dtype::parse(&dtype)?, shape }))
        .collect::<Option<Vec<_>>>()?;
    let layout = BatchLayout::new(batch_size, descs).ok()?;
    u64::try_from(layout.total_len()).ok()
}

/// `(window, slots, slot_bytes)` for batches of `batch_bytes` made by
/// `workers` workers with the configured `prefetch`: the SDK's window for
/// batches of that size (`loader_job::window::batches`: small batches get
/// a long one, as the workers' own window does), slots that hold a whole
/// batch (a larger one would stream over gRPC) rounded up to `page` (this
/// machine's page size, which a slot is a multiple of), and enough of them
/// for every worker's window twice over, within [`RING_BUDGET`] and the
/// ring's own limit on slots.
#[pyfunction]
pub(crate) fn ring_for_batch(batch_bytes: u64, prefetch: u32, workers: u32, page: u64) -> (u32, u32, u64) {
    let window = loader_job::window::batches(batch_bytes, prefetch);
    let page = page.max(1);
    let slot = batch_bytes.max(1).div_ceil(page).saturating_mul(page);
    let wanted = window.saturating_mul(2).saturating_mul(workers.max(1));
    let affordable = u32::try_from(RING_BUDGET / slot).unwrap_or(u32::MAX);
    (window, wanted.min(affordable).clamp(MIN_SLOTS, MAX_SLOTS), slot)
}
