//! PNG through the `png` crate, to 8-bit RGBX: palettes expanded, 16-bit
//! samples cut to their high byte, grey replicated, alpha dropped (Pillow's
//! `convert("RGB")` does the same).

use std::io::Cursor;

use png::{ColorType, Transformations};

use super::{ImageError, PIXEL};

fn corrupt(e: png::DecodingError) -> ImageError {
    ImageError::Corrupt(format!("PNG: {e}"))
}

/// Width and height from the header, without decoding pixels.
pub(crate) fn header(data: &[u8]) -> Result<(u32, u32), ImageError> {
    let reader = png::Decoder::new(Cursor::new(data)).read_info().map_err(corrupt)?;
    Ok(reader.info().size())
}

/// Decodes the whole image into `out` (RGBX, `4 * w * h` bytes, grown as
/// needed), using `raw` for the decoder's own layout.
pub(crate) fn decode(data: &[u8], raw: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<(u32, u32), ImageError> {
    let mut decoder = png::Decoder::new(Cursor::new(data));
    decoder.set_transformations(Transformations::EXPAND | Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(corrupt)?;
    let (w, h) = reader.info().size();
    let len = reader.output_buffer_size().ok_or_else(|| ImageError::Corrupt(format!("PNG: {w}x{h} is too large")))?;
    if raw.len() < len {
        raw.resize(len, 0);
    }
    let frame = reader.next_frame(&mut raw[..len]).map_err(corrupt)?;
    let rgbx_len = w as usize * h as usize * PIXEL;
    if out.len() < rgbx_len {
        out.resize(rgbx_len, 0);
    }
    let channels = match frame.color_type {
        ColorType::Rgb => 3,
        ColorType::Rgba => 4,
        ColorType::Grayscale => 1,
        ColorType::GrayscaleAlpha => 2,
        ColorType::Indexed => return Err(ImageError::Corrupt("PNG: palette not expanded".into())),
    };
    let stride = frame.line_size;
    for y in 0..h as usize {
        let src = &raw[y * stride..][..w as usize * channels];
        let dst = &mut out[y * w as usize * PIXEL..][..w as usize * PIXEL];
        for (d, s) in dst.chunks_exact_mut(PIXEL).zip(src.chunks_exact(channels)) {
            if channels >= 3 {
                d[..3].copy_from_slice(&s[..3]);
            } else {
                d[..3].fill(s[0]);
            }
            d[3] = 255;
        }
    }
    Ok((w, h))
}
