//! JPEG through the system's libjpeg-turbo (`jpeg_turbo.c`): the header, then
//! a region of the image at a DCT scale of 1, 1/2, 1/4 or 1/8.
//!
//! libjpeg-turbo was picked by measurement (docs/images.md): its SIMD decoder
//! is the fastest available here, and it alone offers both DCT scaling and
//! region decoding. The C file catches every libjpeg error (a longjmp must
//! not cross Rust frames) and returns a code and a message; this module only
//! passes slices whose lengths it states.

use std::ffi::{c_char, c_int, c_uint};

use super::geometry::Rect;
use super::{ImageError, PIXEL};

unsafe extern "C" {
    fn loader_jpeg_header(
        data: *const u8,
        len: usize,
        width: *mut c_uint,
        height: *mut c_uint,
        msg: *mut c_char,
        msg_len: usize,
    ) -> c_int;
    fn loader_jpeg_decode(
        data: *const u8,
        len: usize,
        scale_num: c_uint,
        x0: c_uint,
        y0: c_uint,
        w: c_uint,
        h: c_uint,
        out: *mut u8,
        out_cap: usize,
        out_x0: *mut c_uint,
        out_w: *mut c_uint,
        scaled_w: *mut c_uint,
        scaled_h: *mut c_uint,
        align: *mut c_uint,
        msg: *mut c_char,
        msg_len: usize,
    ) -> c_int;
}

/// Room for libjpeg's longest message (JMSG_LENGTH_MAX is 200).
const MSG_LEN: usize = 256;

/// Where a decoded region sits in the (scaled) image, and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decoded {
    /// Column and row of the region's top-left pixel.
    pub(crate) origin: (u32, u32),
    /// Columns and rows held (the row stride is `PIXEL * width`).
    pub(crate) size: (u32, u32),
    /// What a cropped decode at this scale rounds its first column down to
    /// a multiple of (see [`held`]).
    pub(crate) align: u32,
}

/// The columns `decode` asks libjpeg for, for `region` of an image `width`
/// wide: one more on each side (see [`decode`]).
fn widened(region: Rect, width: u32) -> Rect {
    let x0 = region.x.saturating_sub(1);
    let x1 = region.x.saturating_add(region.w).saturating_add(1).min(width);
    Rect { x: x0, w: x1.saturating_sub(x0).max(1), ..region }
}

/// The origin and size [`decode`] returns for `region` of an image scaled
/// to `scaled`, whose crop alignment is `align`, without decoding: the
/// widened columns, their first rounded down to a multiple of `align` as
/// `jpeg_crop_scanline` does (the whole width is not cropped). The sample
/// cache cuts exactly this out of a whole decode, so the passes after it
/// see the buffer an uncached run would.
pub(crate) fn held(region: Rect, scaled: (u32, u32), align: u32) -> ((u32, u32), (u32, u32)) {
    let r = widened(region, scaled.0);
    if r.w >= scaled.0 {
        return ((r.x, region.y), (r.w, region.h));
    }
    let x0 = r.x / align.max(1) * align.max(1);
    ((x0, region.y), (r.w + r.x - x0, region.h))
}

fn message(code: c_int, msg: &[u8; MSG_LEN]) -> Result<(), ImageError> {
    if code == 0 {
        return Ok(());
    }
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    let text = String::from_utf8_lossy(&msg[..end]);
    let text = if text.is_empty() { "undecodable JPEG".into() } else { format!("JPEG: {text}") };
    Err(ImageError::Corrupt(text))
}

/// Full-size width and height from the header.
pub(crate) fn header(data: &[u8]) -> Result<(u32, u32), ImageError> {
    let (mut w, mut h): (c_uint, c_uint) = (0, 0);
    let mut msg = [0u8; MSG_LEN];
    // SAFETY: `data` is valid for `data.len()` bytes and only read; `w`, `h`
    // and `msg` (MSG_LEN bytes) are live locals the function writes into.
    let code = unsafe { loader_jpeg_header(data.as_ptr(), data.len(), &mut w, &mut h, msg.as_mut_ptr().cast(), MSG_LEN) };
    message(code, &msg)?;
    Ok((w, h))
}

/// Size of the image scaled by `scale_num / 8`, as libjpeg rounds it.
pub(crate) fn scaled((w, h): (u32, u32), scale_num: u32) -> (u32, u32) {
    let s = |v: u32| u32::try_from((u64::from(v) * u64::from(scale_num)).div_ceil(8)).unwrap_or(u32::MAX);
    (s(w), s(h))
}

/// Decodes `region` (in pixels of the image scaled by `scale_num / 8`) into
/// `out` as RGBX rows, each pixel of it as a decode of the whole image
/// gives it. The columns held are wider than asked: see the returned
/// [`Decoded`].
///
/// libjpeg-turbo's cropped decode upsamples chroma without the column
/// beside the crop, so its first and last columns can differ from the
/// whole image's (in about one region in ten of 4:2:0 photos, at every
/// DCT scale); one more column on each side keeps those two out of the
/// region. Rows need nothing: skipped rows keep their context.
pub(crate) fn decode(
    data: &[u8],
    full: (u32, u32),
    scale_num: u32,
    region: Rect,
    out: &mut Vec<u8>,
) -> Result<Decoded, ImageError> {
    let (sw, _) = scaled(full, scale_num);
    // libjpeg widens the columns to whole iMCUs, never past the image.
    let cap = sw as usize * region.h as usize * PIXEL;
    if out.len() < cap {
        out.resize(cap, 0);
    }
    decode_into(data, full, scale_num, region, out)
}

/// As [`decode`], into `out`, which must hold the scaled image's width
/// times the region's rows of RGBX pixels (a whole image: exactly it).
pub(crate) fn decode_into(
    data: &[u8],
    full: (u32, u32),
    scale_num: u32,
    region: Rect,
    out: &mut [u8],
) -> Result<Decoded, ImageError> {
    let (sw, sh) = scaled(full, scale_num);
    let region = widened(region, sw);
    let (mut x0, mut w, mut got_w, mut got_h, mut align): (c_uint, c_uint, c_uint, c_uint, c_uint) = (0, 0, 0, 0, 0);
    let mut msg = [0u8; MSG_LEN];
    // SAFETY: `data` is valid for reads of `data.len()` bytes; `out` for
    // writes of `out.len()` bytes, which the C side checks the region
    // against before writing; the other pointers are live locals.
    let code = unsafe {
        loader_jpeg_decode(
            data.as_ptr(),
            data.len(),
            scale_num,
            region.x,
            region.y,
            region.w,
            region.h,
            out.as_mut_ptr(),
            out.len(),
            &mut x0,
            &mut w,
            &mut got_w,
            &mut got_h,
            &mut align,
            msg.as_mut_ptr().cast(),
            MSG_LEN,
        )
    };
    message(code, &msg)?;
    if (got_w, got_h) != (sw, sh) {
        // The header changed between two reads of the same bytes: impossible
        // unless the arithmetic above disagrees with libjpeg's.
        return Err(ImageError::Corrupt(format!("JPEG: scaled size {got_w}x{got_h}, expected {sw}x{sh}")));
    }
    Ok(Decoded { origin: (x0, region.y), size: (w, region.h), align })
}
