//! One pass of a plan over pixels: a copy where the pass only crops, else
//! fast_image_resize's bilinear convolution, which is built to give Pillow's
//! antialiased `resize` (the numbers that led to it are in docs/images.md).

use fast_image_resize::images::{CroppedImage, CroppedImageMut, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::{ImageError, PIXEL};
use super::geometry::Pass;

/// Runs `pass` from `input` (RGBX rows of `pass.input`) into `canvas` (RGBX
/// rows of `pass.canvas`, exactly that long). The fourth byte is carried
/// along as a plain channel, never as alpha.
pub(crate) fn run(resizer: &mut Resizer, pass: &Pass, input: &[u8], canvas: &mut [u8]) -> Result<(), ImageError> {
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
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
        .use_alpha(false)
        .crop(x, y, w, h);
    resizer.resize(&view, &mut dst, &options).map_err(|e| failed(&e))
}
