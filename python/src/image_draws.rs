//! The image pipeline's random draws for one sample
//! (`loader_worker::image::draws`), so the SDK's tests can run torchvision's
//! deterministic functions at the same crop boxes and flips, and compare the
//! boxes' distribution with torchvision's `RandomResizedCrop.get_params`.

use loader_worker::dataset::SampleKey;
use loader_worker::image::draws;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// `[lo, hi]` with `0 < lo <= hi`, or a one-line error naming `name`.
fn range(name: &str, v: [f32; 2]) -> PyResult<[f32; 2]> {
    if v[0] > 0.0 && v[0] <= v[1] && v[1].is_finite() {
        Ok(v)
    } else {
        Err(PyValueError::new_err(format!("{name} must be [lo, hi] with 0 < lo <= hi, not {v:?}")))
    }
}

/// The `(left, top, width, height)` box that step `step` (a
/// `random_resized_crop` with `scale` and `ratio`) cuts from an image of
/// `width` x `height` for sample `index` of epoch `epoch` of a job seeded
/// `seed`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub(crate) fn random_resized_crop_box(
    width: u32,
    height: u32,
    scale: [f32; 2],
    ratio: [f32; 2],
    seed: u64,
    epoch: u64,
    index: u64,
    step: usize,
) -> PyResult<(u32, u32, u32, u32)> {
    if width == 0 || height == 0 {
        return Err(PyValueError::new_err(format!("an image of {width} x {height} pixels has nothing to crop")));
    }
    let (scale, ratio) = (range("scale", scale)?, range("ratio", ratio)?);
    Ok(draws::random_resized_crop_box(width, height, scale, ratio, SampleKey { seed, epoch, index }, step))
}

/// Whether step `step` (a `horizontal_flip` with probability `p`) mirrors
/// sample `index` of epoch `epoch` of a job seeded `seed`.
#[pyfunction]
pub(crate) fn flip_drawn(p: f32, seed: u64, epoch: u64, index: u64, step: usize) -> bool {
    draws::flip_drawn(p, SampleKey { seed, epoch, index }, step)
}
