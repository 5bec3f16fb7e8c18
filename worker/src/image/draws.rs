//! The random numbers a sample's image steps draw: the pipeline's plan
//! (`geometry`) takes them from here, and so can code outside the worker
//! that must see them: the Python SDK's parity tests run torchvision's
//! deterministic functions at these draws and compare pixels, and compare
//! the boxes' distribution with torchvision's `get_params`.

use crate::dataset::SampleKey;

use super::rng::StepRng;

/// The box (left, top, width, height) that step `step` of the pipeline, a
/// `random_resized_crop` with `scale` and `ratio`, cuts from an image of
/// `width` x `height` for the sample `key`.
pub fn random_resized_crop_box(
    width: u32,
    height: u32,
    scale: [f32; 2],
    ratio: [f32; 2],
    key: SampleKey,
    step: usize,
) -> (u32, u32, u32, u32) {
    random_crop(width, height, scale, ratio, &mut StepRng::new(key, step))
}

/// Whether step `step`, a `horizontal_flip` with probability `p`, mirrors
/// the sample `key`.
pub fn flip_drawn(p: f32, key: SampleKey, step: usize) -> bool {
    StepRng::new(key, step).unit() < f64::from(p)
}

/// torchvision's `RandomResizedCrop.get_params`: ten tries at a box with a
/// uniform area fraction in `scale` and a log-uniform aspect ratio in
/// `ratio`, then the centre crop with the ratio clamped. Returns
/// (left, top, width, height).
pub(crate) fn random_crop(width: u32, height: u32, scale: [f32; 2], ratio: [f32; 2], rng: &mut StepRng) -> (u32, u32, u32, u32) {
    let area = f64::from(width) * f64::from(height);
    let (log_lo, log_hi) = (f64::from(ratio[0]).ln(), f64::from(ratio[1]).ln());
    for _ in 0..10 {
        let target = area * rng.uniform(f64::from(scale[0]), f64::from(scale[1]));
        let aspect = rng.uniform(log_lo, log_hi).exp();
        let w = (target * aspect).sqrt().round_ties_even();
        let h = (target / aspect).sqrt().round_ties_even();
        if w > 0.0 && w <= f64::from(width) && h > 0.0 && h <= f64::from(height) {
            let (w, h) = (w as u32, h as u32);
            let top = rng.up_to(height - h);
            let left = rng.up_to(width - w);
            return (left, top, w, h);
        }
    }
    let in_ratio = f64::from(width) / f64::from(height);
    let (lo, hi) = (f64::from(ratio[0]), f64::from(ratio[1]));
    let (w, h) = if in_ratio < lo {
        (width, ((f64::from(width) / lo).round_ties_even() as u32).clamp(1, height))
    } else if in_ratio > hi {
        (((f64::from(height) * hi).round_ties_even() as u32).clamp(1, width), height)
    } else {
        (width, height)
    };
    ((width - w) / 2, (height - h) / 2, w, h)
}
