//! One pass of a plan over pixels: a copy where the pass only crops, else
//! fast_image_resize's convolution, which is built to give Pillow's
//! antialiased `resize` (the numbers that led to it are in docs/images.md):
//! the same kernels, widened by the shrink factor, on the same box, with an
//! 8-bit image between the horizontal and the vertical half.
//!
//! The order of the halves matters for bicubic only. Pillow resamples rows
//! first; fast_image_resize, for 8-bit pixels, columns first. Bilinear's
//! weights are never negative, so the image between holds no value out of
//! 0-255 and the order moves a rounding (at most one level). Bicubic's
//! negative lobes overshoot at edges and the 8-bit image between clips the
//! overshoot, so columns first differs from Pillow by up to 4 levels
//! along sharp edges (`worker/tests/pillow.rs`); a bicubic pass is
//! therefore run as two calls, rows then columns.

use fast_image_resize::images::{CroppedImage, CroppedImageMut, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use loader_job::transforms::Filter;

use super::{ImageError, PIXEL};
use super::geometry::Pass;

/// fast_image_resize's kernel for `filter`. Both are Pillow's:
/// `Bilinear` is its triangle, `CatmullRom` its BICUBIC (Keys' cubic
/// with a = -0.5 and support 2 in fast_image_resize 6.1's
/// `convolution/filters.rs`, as `bicubic_filter` in Pillow's
/// `Resample.c`). Its `Mitchell` (B = C = 1/3) is another cubic: softer,
/// and not what torchvision's BICUBIC gives on a PIL image.
fn kernel(filter: Filter) -> FilterType {
    match filter {
        Filter::Bilinear => FilterType::Bilinear,
        Filter::Bicubic => FilterType::CatmullRom,
    }
}

/// How far from its centre `filter`'s kernel reaches, in input pixels at
/// scale 1; a shrink widens it by its factor (antialiasing). The values of
/// fast_image_resize's `get_filter_func` for [`kernel`]'s filters.
pub(crate) fn support(filter: Filter) -> f64 {
    match filter {
        Filter::Bilinear => 1.0,
        Filter::Bicubic => 2.0,
    }
}

/// What resampling keeps from pass to pass on one thread.
#[derive(Default)]
pub(crate) struct Resampler {
    /// fast_image_resize's coefficient and row buffers.
    resizer: Resizer,
    /// A bicubic pass's rows resampled, before its columns are (RGBX, the
    /// output's width by the view's height).
    rows: Vec<u8>,
}

impl std::fmt::Debug for Resampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resampler").field("rows", &self.rows.len()).finish_non_exhaustive()
    }
}

impl Resampler {
    /// Bytes held between samples (for the per-thread scratch limit).
    pub(crate) fn held(&self) -> usize {
        self.rows.capacity() + self.resizer.size_of_internal_buffers()
    }

    /// Runs `pass` from `input` (RGBX rows of `pass.input`) into `canvas`
    /// (RGBX rows of `pass.canvas`, exactly that long). The fourth byte is
    /// carried along as a plain channel, never as alpha.
    pub(crate) fn run(&mut self, pass: &Pass, input: &[u8], canvas: &mut [u8]) -> Result<(), ImageError> {
        let (cw, ch) = pass.canvas;
        let d = pass.dst;
        if d.w == 0 || d.h == 0 || d.w != cw || d.h != ch {
            canvas.fill(0);
        }
        if d.w == 0 || d.h == 0 {
            return Ok(());
        }
        let (iw, ih) = pass.input;
        let v = pass.view;
        if !pass.resamples() {
            let (sx, sy) = ((v.x + pass.src.x as u32) as usize, (v.y + pass.src.y as u32) as usize);
            let row = d.w as usize * PIXEL;
            for r in 0..d.h as usize {
                let from = ((sy + r) * iw as usize + sx) * PIXEL;
                let to = ((d.y as usize + r) * cw as usize + d.x as usize) * PIXEL;
                canvas[to..to + row].copy_from_slice(&input[from..from + row]);
            }
            return Ok(());
        }
        let failed = |e: &dyn std::fmt::Display| ImageError::Resample(e.to_string());
        let src = ImageRef::new(iw, ih, input, PixelType::U8x4).map_err(|e| failed(&e))?;
        let view = CroppedImage::new(&src, v.x, v.y, v.w, v.h).map_err(|e| failed(&e))?;
        let mut dst = Image::from_slice_u8(cw, ch, canvas, PixelType::U8x4).map_err(|e| failed(&e))?;
        let mut dst = CroppedImageMut::new(&mut dst, d.x, d.y, d.w, d.h).map_err(|e| failed(&e))?;
        // Rounding may leave the box a hair outside the view: clamp it.
        let (vw, vh) = (f64::from(v.w), f64::from(v.h));
        let (x, y) = (pass.src.x.clamp(0.0, vw - 1.0), pass.src.y.clamp(0.0, vh - 1.0));
        let (w, h) = (pass.src.w.min(vw - x), pass.src.h.min(vh - y));
        let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(kernel(pass.filter))).use_alpha(false);
        match pass.filter {
            Filter::Bilinear => self.resizer.resize(&view, &mut dst, &options.crop(x, y, w, h)).map_err(|e| failed(&e)),
            Filter::Bicubic => {
                // Rows: the box's columns over every row of the view, so the
                // columns' half sees the view's edges where Pillow's does.
                let len = d.w as usize * v.h as usize * PIXEL;
                if self.rows.len() < len {
                    self.rows.resize(len, 0);
                }
                let mut rows = Image::from_slice_u8(d.w, v.h, &mut self.rows[..len], PixelType::U8x4).map_err(|e| failed(&e))?;
                self.resizer.resize(&view, &mut rows, &options.crop(x, 0.0, w, vh)).map_err(|e| failed(&e))?;
                self.resizer.resize(&rows, &mut dst, &options.crop(0.0, y, f64::from(d.w), h)).map_err(|e| failed(&e))
            }
        }
    }
}
