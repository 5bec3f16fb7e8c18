//! The geometric steps (random_resized_crop, resize, center_crop,
//! horizontal_flip) planned from image sizes alone, before any pixel is
//! decoded: the plan says which part of the file the decoder must produce and
//! how many resampling passes follow.
//!
//! A pass resamples a box of its input into (part of) a canvas. Steps fold
//! into the current pass while that gives the same pixels as running them one
//! by one, which is most of the time:
//! - a crop before any resize narrows the pass's *view*, the part of the
//!   input that acts as the whole image (filter support stops at its edges,
//!   as it does on a cropped image in Pillow);
//! - a crop after a resize narrows the resampled *box* only (the filter still
//!   reads the pixels around it, as a crop of the resized image would);
//! - a flip is carried to the final write (resampling is mirror-symmetric),
//!   and crops planned meanwhile are mirrored instead.
//!
//! Only a resize of an image that is already resized (or zero-padded) starts
//! a second pass, so each pass holds at most one resize and resamples with
//! that resize's filter; crops folded in before or after it keep it.

use loader_job::transforms::{Filter, ResizeTo, Step};

use super::draws;
use crate::dataset::SampleKey;

/// A rectangle of whole pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rect {
    /// Left column.
    pub(crate) x: u32,
    /// Top row.
    pub(crate) y: u32,
    /// Columns.
    pub(crate) w: u32,
    /// Rows.
    pub(crate) h: u32,
}

/// A rectangle in fractional pixels: the source box of a resize.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Area {
    /// Left edge.
    pub(crate) x: f64,
    /// Top edge.
    pub(crate) y: f64,
    /// Width.
    pub(crate) w: f64,
    /// Height.
    pub(crate) h: f64,
}

/// One resampling pass over an input image.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pass {
    /// Input size.
    pub(crate) input: (u32, u32),
    /// The part of the input that acts as the whole image.
    pub(crate) view: Rect,
    /// The resampled box, relative to the view.
    pub(crate) src: Area,
    /// Output size (width, height).
    pub(crate) canvas: (u32, u32),
    /// Where the resampled box lands in the canvas; the rest is zero
    /// (center_crop's padding). Empty when the canvas is all padding.
    pub(crate) dst: Rect,
    /// The filter of the resize this pass runs (the step's own, as a
    /// bilinear and a bicubic resize give different pixels); unused by a
    /// pass that only copies.
    pub(crate) filter: Filter,
}

impl Pass {
    fn identity(w: u32, h: u32) -> Pass {
        let full = Rect { x: 0, y: 0, w, h };
        Pass {
            input: (w, h),
            view: full,
            src: Area { x: 0.0, y: 0.0, w: f64::from(w), h: f64::from(h) },
            canvas: (w, h),
            dst: full,
            filter: Filter::default(),
        }
    }

    /// True when the pass interpolates; false when it only copies pixels.
    pub(crate) fn resamples(&self) -> bool {
        self.src.w != f64::from(self.dst.w)
            || self.src.h != f64::from(self.dst.h)
            || self.src.x.fract() != 0.0
            || self.src.y.fract() != 0.0
    }

    fn padded(&self) -> bool {
        self.dst != Rect { x: 0, y: 0, w: self.canvas.0, h: self.canvas.1 }
    }
}

/// What the geometric steps do to one image.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    /// At least one pass; the first reads the decoded image.
    pub(crate) passes: Vec<Pass>,
    /// Mirror the final canvas left-right.
    pub(crate) flip: bool,
}

impl Plan {
    /// Plans `steps` (the non-geometric ones are skipped) for an image of
    /// `width` x `height`, drawing each random step's numbers from its own
    /// stream of `key`.
    pub(crate) fn new(steps: &[Step], width: u32, height: u32, key: SampleKey) -> Plan {
        let mut plan = Plan { passes: vec![Pass::identity(width, height)], flip: false };
        for (i, step) in steps.iter().enumerate() {
            match *step {
                Step::RandomResizedCrop { height, width, scale, ratio, filter } => {
                    let (w, h) = plan.size();
                    let (x, y, cw, ch) = draws::random_resized_crop_box(w, h, scale, ratio, key, i);
                    plan.window(i64::from(x), i64::from(y), cw, ch);
                    plan.resize(width, height, filter);
                }
                Step::Resize { to, filter } => {
                    let (w, h) = resized(plan.size(), to);
                    plan.resize(w, h, filter);
                }
                Step::CenterCrop { height, width } => {
                    let (w, h) = plan.size();
                    plan.window(centre(w, width), centre(h, height), width, height);
                }
                Step::HorizontalFlip { p } => {
                    if draws::flip_drawn(p, key, i) {
                        plan.flip = !plan.flip;
                    }
                }
                Step::Decode | Step::Normalize { .. } | Step::Cast(_) | Step::Layout(_) => {}
            }
        }
        plan
    }

    fn last(&mut self) -> &mut Pass {
        let n = self.passes.len() - 1;
        &mut self.passes[n]
    }

    /// Size of the image as the next step sees it.
    pub(crate) fn size(&self) -> (u32, u32) {
        self.passes[self.passes.len() - 1].canvas
    }

    /// Keeps the `w` x `h` window at (`x`, `y`) of the image as the next
    /// step sees it (flipped or not); parts outside the image become zero.
    fn window(&mut self, x: i64, y: i64, w: u32, h: u32) {
        let flip = self.flip;
        let p = self.last();
        let x = if flip { i64::from(p.canvas.0) - x - i64::from(w) } else { x };
        let (dx0, dx1) = overlap(p.dst.x, p.dst.w, x, w);
        let (dy0, dy1) = overlap(p.dst.y, p.dst.h, y, h);
        if dx1 <= dx0 || dy1 <= dy0 {
            p.dst = Rect { x: 0, y: 0, w: 0, h: 0 };
        } else if p.resamples() {
            // Narrow the box: the filter keeps reading around it.
            let (sx, sy) = (p.src.w / f64::from(p.dst.w), p.src.h / f64::from(p.dst.h));
            p.src = Area {
                x: p.src.x + (dx0 - i64::from(p.dst.x)) as f64 * sx,
                y: p.src.y + (dy0 - i64::from(p.dst.y)) as f64 * sy,
                w: (dx1 - dx0) as f64 * sx,
                h: (dy1 - dy0) as f64 * sy,
            };
            p.dst = rect(dx0 - x, dy0 - y, dx1 - dx0, dy1 - dy0);
        } else {
            // Narrow the view: a crop before any resize.
            p.view = rect(
                i64::from(p.view.x) + dx0 - i64::from(p.dst.x),
                i64::from(p.view.y) + dy0 - i64::from(p.dst.y),
                dx1 - dx0,
                dy1 - dy0,
            );
            p.src = Area { x: 0.0, y: 0.0, w: f64::from(p.view.w), h: f64::from(p.view.h) };
            p.dst = rect(dx0 - x, dy0 - y, dx1 - dx0, dy1 - dy0);
        }
        p.canvas = (w, h);
    }

    /// Resizes the image as the next step sees it to `w` x `h` with `filter`.
    fn resize(&mut self, w: u32, h: u32, filter: Filter) {
        if self.size() == (w, h) {
            // Pillow returns a copy for a same-size resize.
            return;
        }
        let (cw, ch) = self.size();
        if self.last().resamples() || self.last().padded() {
            self.passes.push(Pass::identity(cw, ch));
        }
        let p = self.last();
        p.canvas = (w, h);
        p.dst = Rect { x: 0, y: 0, w, h };
        p.filter = filter;
    }
}

/// `[lo, hi)` of the overlap of `[a, a + aw)` with `[b, b + bw)`.
fn overlap(a: u32, aw: u32, b: i64, bw: u32) -> (i64, i64) {
    let (a, aw, bw) = (i64::from(a), i64::from(aw), i64::from(bw));
    (a.max(b), (a + aw).min(b + bw))
}

/// A rectangle from values the caller has kept within u32.
fn rect(x: i64, y: i64, w: i64, h: i64) -> Rect {
    let c = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX);
    Rect { x: c(x), y: c(y), w: c(w), h: c(h) }
}

/// Offset of a centred crop of `crop` from `size`, torchvision's way:
/// `round((size - crop) / 2)` with ties to even, or minus the left/top
/// padding (`(crop - size) // 2`) when the crop is larger.
fn centre(size: u32, crop: u32) -> i64 {
    if crop > size {
        -i64::from((crop - size) / 2)
    } else {
        (f64::from(size - crop) / 2.0).round_ties_even() as i64
    }
}

/// torchvision's `Resize` output size: one value sets the shorter side and
/// truncates the other (`int(size * long / short)`).
pub(crate) fn resized((w, h): (u32, u32), to: ResizeTo) -> (u32, u32) {
    match to {
        ResizeTo::Exact { height, width } => (width, height),
        ResizeTo::ShorterSide(s) => {
            let long = |a: u32, b: u32| ((f64::from(s) * f64::from(a) / f64::from(b)) as u32).max(1);
            if w <= h { (s, long(h, w)) } else { (long(w, h), s) }
        }
    }
}
