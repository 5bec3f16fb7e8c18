//! What the decoder must produce for the first pass of a plan: the DCT scale
//! and the region of the image (the trick that makes DALI/FFCV-style loaders
//! fast), and the pass rewritten in the decoded buffer's coordinates.

use super::geometry::{Area, Pass, Rect};
use super::resample;

/// The DCT scale (numerator over 8) for the first pass: the strongest of
/// 1/2, 1/4, 1/8 that still leaves the resampled box at least as large as
/// its output, or 8 (full size) when the pass shrinks by less than 2x.
///
/// The same rule for either filter. A scaled IDCT keeps the DCT
/// frequencies the smaller image can hold and drops the rest; with the box
/// still no smaller than the output, what it drops lies above the output's
/// Nyquist frequency too, where either antialiased filter after it
/// attenuates. Bicubic passes more just below that frequency than
/// bilinear, so it strays a little further from Pillow's full-size resize
/// (`worker/tests/pillow.rs`, a 3x shrink of sharp texture at 1/2: mean
/// |diff| 1.02 against bilinear's 0.77, both max 6), not enough to give up
/// what the scaled decode saves (a 1/2 decode costs about 0.7x a full one,
/// docs/images.md).
pub(crate) fn dct_scale(pass: &Pass) -> u32 {
    if !pass.resamples() || pass.dst.w == 0 || pass.dst.h == 0 {
        return 8;
    }
    let fits = |m: u32| {
        let f = f64::from(m) / 8.0;
        pass.src.w * f >= f64::from(pass.dst.w) && pass.src.h * f >= f64::from(pass.dst.h)
    };
    [1, 2, 4].into_iter().find(|&m| fits(m)).unwrap_or(8)
}

/// Rewrites `pass` for the image scaled by `scale_num / 8` (full size
/// `full`): the view grows outwards to whole pixels, the box scales exactly.
pub(crate) fn scale(pass: &mut Pass, full: (u32, u32), scale_num: u32, scaled: (u32, u32)) {
    if scale_num == 8 {
        return;
    }
    let f = f64::from(scale_num) / 8.0;
    let v = pass.view;
    let x0 = (f64::from(v.x) * f).floor() as u32;
    let y0 = (f64::from(v.y) * f).floor() as u32;
    let x1 = ((f64::from(v.x + v.w) * f).ceil() as u32).min(scaled.0);
    let y1 = ((f64::from(v.y + v.h) * f).ceil() as u32).min(scaled.1);
    pass.src = Area {
        x: (f64::from(v.x) + pass.src.x) * f - f64::from(x0),
        y: (f64::from(v.y) + pass.src.y) * f - f64::from(y0),
        w: pass.src.w * f,
        h: pass.src.h * f,
    };
    pass.view = Rect { x: x0, y: y0, w: x1.saturating_sub(x0).max(1), h: y1.saturating_sub(y0).max(1) };
    pass.input = scaled;
    debug_assert!(full.0 >= scaled.0 && full.1 >= scaled.1);
}

/// The part of the input the pass reads: its view where it only copies, or
/// the box plus the filter's reach (clipped to the view) where it resamples.
/// Pixels beyond the reach get zero weight, so decoding only this region
/// gives the same output as decoding everything.
pub(crate) fn needed(pass: &Pass) -> Rect {
    let v = pass.view;
    if !pass.resamples() || pass.dst.w == 0 || pass.dst.h == 0 {
        if pass.dst.w == 0 || pass.dst.h == 0 {
            return v;
        }
        let (x, y) = (pass.src.x as u32, pass.src.y as u32);
        return Rect { x: v.x + x, y: v.y + y, w: pass.dst.w, h: pass.dst.h };
    }
    let support = resample::support(pass.filter);
    let reach = |box_len: f64, out: u32| (support * (box_len / f64::from(out)).max(1.0)).ceil() + 1.0;
    let (rx, ry) = (reach(pass.src.w, pass.dst.w), reach(pass.src.h, pass.dst.h));
    let lo = |start: f64, r: f64| (start - r).floor().max(0.0) as u32;
    let hi = |end: f64, r: f64, len: u32| ((end + r).ceil().max(0.0) as u32).min(len);
    let x0 = lo(pass.src.x, rx).min(v.w - 1);
    let y0 = lo(pass.src.y, ry).min(v.h - 1);
    let x1 = hi(pass.src.x + pass.src.w, rx, v.w).clamp(x0 + 1, v.w);
    let y1 = hi(pass.src.y + pass.src.h, ry, v.h).clamp(y0 + 1, v.h);
    Rect { x: v.x + x0, y: v.y + y0, w: x1 - x0, h: y1 - y0 }
}

/// Rewrites `pass` for a buffer that holds `size` pixels of its input
/// starting at `origin` (which covers [`needed`]).
pub(crate) fn rebase(pass: &mut Pass, origin: (u32, u32), size: (u32, u32)) {
    let v = pass.view;
    let x0 = v.x.max(origin.0);
    let y0 = v.y.max(origin.1);
    let x1 = (v.x + v.w).min(origin.0 + size.0);
    let y1 = (v.y + v.h).min(origin.1 + size.1);
    pass.src.x -= f64::from(x0 - v.x);
    pass.src.y -= f64::from(y0 - v.y);
    pass.view = Rect { x: x0 - origin.0, y: y0 - origin.1, w: x1.saturating_sub(x0), h: y1.saturating_sub(y0) };
    pass.input = size;
}
