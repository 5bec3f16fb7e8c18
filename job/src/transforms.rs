//! Validation of an image pipeline (`JobSpec.transforms`): every step checked
//! once, here, and turned into typed [`Step`]s with the defaults filled in, so
//! the coordinator (rejecting a bad spec) and the worker (running it) read the
//! same rules, and the output tensor of a job is known before any image is.

use loader_proto::pb::{Dtype, Interpolation, Layout, Transform, transform::Op};
use crate::error::{SpecError, err};

/// Largest height or width a step may ask for: far above any training
/// resolution, low enough that a typo cannot make a worker allocate
/// gigabytes per sample.
pub const MAX_SIDE: u32 = 16384;

/// torchvision's `RandomResizedCrop` default area fraction.
pub const DEFAULT_SCALE: [f32; 2] = [0.08, 1.0];
/// torchvision's `RandomResizedCrop` default aspect ratios (width / height).
pub const DEFAULT_RATIO: [f32; 2] = [3.0 / 4.0, 4.0 / 3.0];
/// torchvision's `RandomHorizontalFlip` default probability.
pub const DEFAULT_FLIP_P: f32 = 0.5;

/// Target of a resize.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ResizeTo {
    /// The shorter side becomes this; the other keeps the aspect ratio
    /// (truncated, as torchvision computes it).
    ShorterSide(u32),
    /// Exactly this height and width.
    Exact {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
    },
}

/// The filter a resize resamples with (`Interpolation` in the spec). Both
/// are Pillow's antialiased convolution: the kernel widens with the shrink
/// factor, so a downscale averages every input pixel rather than skipping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Filter {
    /// Pillow's BILINEAR (triangle kernel, support 1): torchvision's
    /// default, and what an unspecified interpolation means.
    #[default]
    Bilinear,
    /// Pillow's BICUBIC (Keys' cubic with a = -0.5, support 2).
    Bicubic,
}

/// One validated step, defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// Decode JPEG or PNG to 8-bit RGB; always the first step, and only there.
    Decode,
    /// torchvision's `RandomResizedCrop`.
    RandomResizedCrop {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
        /// `[min, max]` fraction of the image area, within (0, 1].
        scale: [f32; 2],
        /// `[min, max]` aspect ratio (width / height), > 0.
        ratio: [f32; 2],
        /// The resize's filter.
        filter: Filter,
    },
    /// Antialiased resize.
    Resize {
        /// The output size.
        to: ResizeTo,
        /// The filter.
        filter: Filter,
    },
    /// Centre crop (zero padding where the image is smaller, as torchvision).
    CenterCrop {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
    },
    /// Left-right mirror with probability `p` in [0, 1].
    HorizontalFlip {
        /// Probability of a flip.
        p: f32,
    },
    /// `(x / 255 - mean) / std` per channel; the tensor becomes float32.
    Normalize {
        /// Per-channel mean (R, G, B).
        mean: [f32; 3],
        /// Per-channel standard deviation, > 0.
        std: [f32; 3],
    },
    /// Convert the element type: uint8 or float32.
    Cast(Dtype),
    /// Memory layout of the output tensor.
    Layout(Layout),
}

/// A validated pipeline and the tensor it produces per sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    /// The steps, in order, starting with [`Step::Decode`].
    pub steps: Vec<Step>,
    /// Element type of the output.
    pub dtype: Dtype,
    /// Layout of the output (CHW unless a step says otherwise).
    pub layout: Layout,
    /// Output height.
    pub height: u32,
    /// Output width.
    pub width: u32,
}

impl Pipeline {
    /// Shape of one sample: `[3, h, w]` (CHW) or `[h, w, 3]` (HWC).
    pub fn shape(&self) -> Vec<u64> {
        let (h, w) = (u64::from(self.height), u64::from(self.width));
        match self.layout {
            Layout::Hwc => vec![h, w, 3],
            _ => vec![3, h, w],
        }
    }
}

/// The element type and shape of the tensor a pipeline produces per sample.
pub fn output(transforms: &[Transform]) -> Result<(Dtype, Vec<u64>), SpecError> {
    let p = check(transforms)?;
    Ok((p.dtype, p.shape()))
}

/// Validates every step and returns the typed pipeline.
pub fn check(transforms: &[Transform]) -> Result<Pipeline, SpecError> {
    if transforms.is_empty() {
        return err(
            "transforms",
            "empty; an image dataset needs decode then a step that fixes the size, e.g. random_resized_crop",
        );
    }
    let mut steps = Vec::with_capacity(transforms.len());
    let mut dtype = Dtype::U8;
    let mut layout = Layout::Chw;
    // Output size once a step has fixed it; a one-value resize unfixes it.
    let mut size: Option<(u32, u32)> = None;
    for (i, t) in transforms.iter().enumerate() {
        let step = step(i, t)?;
        match step {
            Step::Decode if i > 0 => return err(format!("transforms[{i}].decode"), "decode must be the first step only"),
            _ if i == 0 && step != Step::Decode => {
                return err("transforms[0]", format!("must be decode, got {}", op_name(t)));
            }
            Step::RandomResizedCrop { height, width, .. } | Step::CenterCrop { height, width } => {
                size = Some((height, width));
            }
            Step::Resize { to: ResizeTo::Exact { height, width }, .. } => size = Some((height, width)),
            Step::Resize { to: ResizeTo::ShorterSide(_), .. } => size = None,
            Step::Normalize { .. } => dtype = Dtype::F32,
            Step::Cast(d) => dtype = d,
            Step::Layout(l) => layout = l,
            Step::Decode | Step::HorizontalFlip { .. } => {}
        }
        steps.push(step);
    }
    let Some((height, width)) = size else {
        return err(
            "transforms",
            "the output size is not fixed; add center_crop (or random_resized_crop, or a two-value resize) after the last one-value resize",
        );
    };
    Ok(Pipeline { steps, dtype, layout, height, width })
}

fn op_name(t: &Transform) -> &'static str {
    match &t.op {
        None => "an empty step",
        Some(Op::Decode(_)) => "decode",
        Some(Op::RandomResizedCrop(_)) => "random_resized_crop",
        Some(Op::Resize(_)) => "resize",
        Some(Op::CenterCrop(_)) => "center_crop",
        Some(Op::HorizontalFlip(_)) => "horizontal_flip",
        Some(Op::Normalize(_)) => "normalize",
        Some(Op::Cast(_)) => "cast",
        Some(Op::Layout(_)) => "layout",
    }
}

fn step(i: usize, t: &Transform) -> Result<Step, SpecError> {
    let name = op_name(t);
    let field = |f: &str| format!("transforms[{i}].{name}.{f}");
    Ok(match &t.op {
        None => {
            return err(
                format!("transforms[{i}]"),
                "empty step; expected one of decode, random_resized_crop, resize, center_crop, horizontal_flip, normalize, cast, layout",
            );
        }
        Some(Op::Decode(_)) => Step::Decode,
        Some(Op::RandomResizedCrop(r)) => {
            let (height, width) = size_pair(&r.size, &field("size"))?;
            Step::RandomResizedCrop {
                height,
                width,
                scale: range(&r.scale, DEFAULT_SCALE, &field("scale"), |v| v > 0.0 && v <= 1.0, "within (0, 1]")?,
                ratio: range(&r.ratio, DEFAULT_RATIO, &field("ratio"), |v| v > 0.0 && v.is_finite(), "> 0")?,
                filter: filter(r.interpolation, &field("interpolation"))?,
            }
        }
        Some(Op::Resize(r)) => {
            let to = match r.size.as_slice() {
                [s] => ResizeTo::ShorterSide(side(*s, &field("size"), &r.size)?),
                _ => {
                    let (height, width) = size_pair(&r.size, &field("size"))?;
                    ResizeTo::Exact { height, width }
                }
            };
            Step::Resize { to, filter: filter(r.interpolation, &field("interpolation"))? }
        }
        Some(Op::CenterCrop(c)) => {
            let (height, width) = size_pair(&c.size, &field("size"))?;
            Step::CenterCrop { height, width }
        }
        Some(Op::HorizontalFlip(f)) => {
            let p = f.p.unwrap_or(DEFAULT_FLIP_P);
            if !(0.0..=1.0).contains(&p) {
                return err(field("p"), format!("must be within [0, 1], got {p}"));
            }
            Step::HorizontalFlip { p }
        }
        Some(Op::Normalize(n)) => {
            let mean = triple(&n.mean, &field("mean"), |v| v.is_finite(), "finite")?;
            let std = triple(&n.std, &field("std"), |v| v > 0.0 && v.is_finite(), "> 0")?;
            Step::Normalize { mean, std }
        }
        Some(Op::Cast(c)) => match Dtype::try_from(c.dtype) {
            Ok(d @ (Dtype::U8 | Dtype::F32)) => Step::Cast(d),
            _ => return err(field("dtype"), format!("must be uint8 or float32, got {}", dtype_name(c.dtype))),
        },
        Some(Op::Layout(l)) => match Layout::try_from(*l) {
            Ok(l @ (Layout::Chw | Layout::Hwc)) => Step::Layout(l),
            _ => return err(format!("transforms[{i}].layout"), format!("must be chw or hwc, got {l}")),
        },
    })
}

fn dtype_name(v: i32) -> String {
    Dtype::try_from(v).map_or_else(|_| format!("unknown dtype {v}"), |d| d.short_name().to_owned())
}

/// The filter of an `Interpolation` value; unspecified is bilinear.
fn filter(v: i32, field: &str) -> Result<Filter, SpecError> {
    match Interpolation::try_from(v) {
        Ok(Interpolation::Unspecified | Interpolation::Bilinear) => Ok(Filter::Bilinear),
        Ok(Interpolation::Bicubic) => Ok(Filter::Bicubic),
        Err(_) => err(field, format!("must be bilinear or bicubic, got the unknown value {v}")),
    }
}

fn side(v: u32, field: &str, all: &[u32]) -> Result<u32, SpecError> {
    if v == 0 || v > MAX_SIDE {
        return err(field, format!("values must be within 1..={MAX_SIDE}, got {all:?}"));
    }
    Ok(v)
}

/// One value (a square) or two (height, width).
fn size_pair(size: &[u32], field: &str) -> Result<(u32, u32), SpecError> {
    match size {
        [s] => {
            let s = side(*s, field, size)?;
            Ok((s, s))
        }
        [h, w] => Ok((side(*h, field, size)?, side(*w, field, size)?)),
        _ => err(field, format!("must hold 1 value (a square) or 2 (height, width), got {size:?}")),
    }
}

/// `[min, max]` with each value passing `ok`; empty means `default`.
fn range(v: &[f32], default: [f32; 2], field: &str, ok: impl Fn(f32) -> bool, what: &str) -> Result<[f32; 2], SpecError> {
    match v {
        [] => Ok(default),
        [lo, hi] if ok(*lo) && ok(*hi) && lo <= hi => Ok([*lo, *hi]),
        [lo, hi] if ok(*lo) && ok(*hi) => err(field, format!("min must be <= max, got {v:?}")),
        [_, _] => err(field, format!("values must be {what}, got {v:?}")),
        _ => err(field, format!("must hold 2 values [min, max] (or none for {default:?}), got {v:?}")),
    }
}

/// Exactly three per-channel values, each passing `ok`.
fn triple(v: &[f32], field: &str, ok: impl Fn(f32) -> bool, what: &str) -> Result<[f32; 3], SpecError> {
    match v {
        [a, b, c] if ok(*a) && ok(*b) && ok(*c) => Ok([*a, *b, *c]),
        [_, _, _] => err(field, format!("values must be {what}, got {v:?}")),
        _ => err(field, format!("must hold 3 values (R, G, B), got {v:?}")),
    }
}

#[cfg(test)]
mod tests;
