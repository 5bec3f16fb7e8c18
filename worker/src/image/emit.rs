//! The final write: the last canvas (RGBX rows) into the caller's buffer,
//! mirrored if the plan says so, in CHW or HWC, with normalize and cast
//! applied through a per-channel table.
//!
//! Geometry runs on 8-bit pixels whatever the step order; normalize and cast
//! act per pixel and per channel, so they commute with crops and flips, and
//! with a resize up to the rounding of its 8-bit output. A table of the 256
//! possible inputs per channel gives every value chain (even a cast to uint8
//! between two normalizes) exactly, at the cost of one lookup.

use loader_proto::pb::{Dtype, Layout};
use loader_job::transforms::Step;

use super::PIXEL;

/// What normalize and cast do to each channel value.
#[derive(Debug, Clone)]
pub(crate) enum Values {
    /// uint8 out, unchanged.
    Identity,
    /// uint8 out through a table per channel.
    U8(Box<[[u8; 256]; 3]>),
    /// float32 out through a table per channel.
    F32(Box<[[f32; 256]; 3]>),
}

impl Values {
    /// The table of the value steps among `steps`, ending in `dtype`.
    pub(crate) fn new(steps: &[Step], dtype: Dtype) -> Values {
        let touches = steps.iter().any(|s| matches!(s, Step::Normalize { .. } | Step::Cast(Dtype::F32)));
        if !touches {
            return Values::Identity;
        }
        let mut f = Box::new([[0f32; 256]; 3]);
        for (c, table) in f.iter_mut().enumerate() {
            for (x, out) in table.iter_mut().enumerate() {
                *out = chain(steps, c, x as f32);
            }
        }
        match dtype {
            Dtype::F32 => Values::F32(f),
            _ => {
                let mut u = Box::new([[0u8; 256]; 3]);
                for (tu, tf) in u.iter_mut().zip(f.iter()) {
                    for (o, v) in tu.iter_mut().zip(tf.iter()) {
                        *o = to_u8(*v);
                    }
                }
                Values::U8(u)
            }
        }
    }
}

/// float32 -> uint8: round to nearest, saturate (NaN becomes 0).
fn to_u8(v: f32) -> u8 {
    v.round().clamp(0.0, 255.0) as u8
}

/// The value steps applied in order to channel `c`'s value `x`, in float32
/// as torchvision computes them (`x / 255`, then `(x - mean) / std`).
fn chain(steps: &[Step], c: usize, mut x: f32) -> f32 {
    let mut is_u8 = true;
    for s in steps {
        match *s {
            Step::Normalize { mean, std } => {
                x = (x / 255.0 - mean[c]) / std[c];
                is_u8 = false;
            }
            Step::Cast(Dtype::U8) if !is_u8 => {
                x = f32::from(to_u8(x));
                is_u8 = true;
            }
            Step::Cast(_) => {}
            _ => {}
        }
    }
    x
}

/// Writes the `w` x `h` RGBX `canvas` into `out` (exactly the output size).
pub(crate) fn write(canvas: &[u8], w: usize, h: usize, flip: bool, layout: Layout, values: &Values, out: &mut [u8]) {
    let col = |x: usize| if flip { w - 1 - x } else { x };
    let plane = w * h;
    match (values, layout) {
        (Values::Identity, Layout::Hwc) => {
            for (dst, src) in out.chunks_exact_mut(w * 3).zip(canvas.chunks_exact(w * PIXEL)) {
                if flip {
                    for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(PIXEL).rev()) {
                        d.copy_from_slice(&s[..3]);
                    }
                } else {
                    for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(PIXEL)) {
                        d.copy_from_slice(&s[..3]);
                    }
                }
            }
        }
        (Values::Identity, _) => {
            let (r, rest) = out.split_at_mut(plane);
            let (g, b) = rest.split_at_mut(plane);
            let rows = canvas.chunks_exact(w * PIXEL).zip(r.chunks_exact_mut(w).zip(g.chunks_exact_mut(w)).zip(b.chunks_exact_mut(w)));
            for (src, ((r, g), b)) in rows {
                split(src, r, g, b, flip);
            }
        }
        (Values::U8(t), _) => {
            for y in 0..h {
                for x in 0..w {
                    let p = &canvas[(y * w + col(x)) * PIXEL..][..3];
                    for c in 0..3 {
                        out[index(layout, plane, w, y, x, c)] = t[c][usize::from(p[c])];
                    }
                }
            }
        }
        (Values::F32(t), _) => {
            for y in 0..h {
                for x in 0..w {
                    let p = &canvas[(y * w + col(x)) * PIXEL..][..3];
                    for c in 0..3 {
                        let i = index(layout, plane, w, y, x, c) * 4;
                        out[i..i + 4].copy_from_slice(&t[c][usize::from(p[c])].to_le_bytes());
                    }
                }
            }
        }
    }
}

/// Pixels per block of [`split`]: fixed-size blocks let the compiler turn
/// the per-byte moves into vector shuffles (the plain byte loop cost a tenth
/// of a sample's time).
const BLOCK: usize = 16;

/// One row of RGBX pixels into three planes, mirrored if `flip`.
fn split(src: &[u8], r: &mut [u8], g: &mut [u8], b: &mut [u8], flip: bool) {
    let n = r.len();
    let (src, g, b) = (&src[..n * PIXEL], &mut g[..n], &mut b[..n]);
    let blocks = n / BLOCK;
    let planes = r.chunks_exact_mut(BLOCK).zip(g.chunks_exact_mut(BLOCK)).zip(b.chunks_exact_mut(BLOCK));
    if flip {
        for (s, ((r, g), b)) in src.rchunks_exact(BLOCK * PIXEL).zip(planes) {
            block(s, r, g, b, |i| BLOCK - 1 - i);
        }
    } else {
        for (s, ((r, g), b)) in src.chunks_exact(BLOCK * PIXEL).zip(planes) {
            block(s, r, g, b, |i| i);
        }
    }
    for i in blocks * BLOCK..n {
        let p = if flip { n - 1 - i } else { i };
        r[i] = src[p * PIXEL];
        g[i] = src[p * PIXEL + 1];
        b[i] = src[p * PIXEL + 2];
    }
}

/// One block of [`split`]: pixel `at(i)` of `s` goes to `r[i]`, `g[i]`, `b[i]`.
#[cfg(not(target_arch = "x86_64"))]
fn block(s: &[u8], r: &mut [u8], g: &mut [u8], b: &mut [u8], at: impl Fn(usize) -> usize) {
    for i in 0..BLOCK.min(r.len()).min(g.len()).min(b.len()).min(s.len() / PIXEL) {
        let p = at(i) * PIXEL;
        r[i] = s[p];
        g[i] = s[p + 1];
        b[i] = s[p + 2];
    }
}

/// One block of [`split`] on x86_64, through [`block_sse2`].
#[cfg(target_arch = "x86_64")]
fn block(s: &[u8], r: &mut [u8], g: &mut [u8], b: &mut [u8], at: impl Fn(usize) -> usize) {
    let (Ok(s), Ok(r), Ok(g), Ok(b)) = (
        <&[u8; BLOCK * PIXEL]>::try_from(s),
        <&mut [u8; BLOCK]>::try_from(r),
        <&mut [u8; BLOCK]>::try_from(g),
        <&mut [u8; BLOCK]>::try_from(b),
    ) else {
        return;
    };
    // SAFETY: SSE2 is part of the x86_64 baseline: every CPU this code
    // can run on has it.
    unsafe { block_sse2(s, r, g, b, at(0) != 0) }
}

/// SSE2 split of 16 RGBX pixels: each channel is masked out of the 32-bit
/// pixels and packed down to bytes; `flip` reverses the pixels.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn block_sse2(s: &[u8; BLOCK * PIXEL], r: &mut [u8; BLOCK], g: &mut [u8; BLOCK], b: &mut [u8; BLOCK], flip: bool) {
    use std::arch::x86_64::{__m128i, _mm_and_si128, _mm_loadu_si128, _mm_packs_epi32, _mm_packus_epi16};
    use std::arch::x86_64::{_mm_set1_epi32, _mm_shuffle_epi32, _mm_srli_epi32, _mm_storeu_si128};
    // SAFETY: each load reads 16 bytes at offset 0, 16, 32 or 48 of `s`,
    // which is 64 bytes long; loadu has no alignment requirement.
    let mut v: [__m128i; 4] = unsafe {
        [
            _mm_loadu_si128(s.as_ptr().cast()),
            _mm_loadu_si128(s.as_ptr().add(16).cast()),
            _mm_loadu_si128(s.as_ptr().add(32).cast()),
            _mm_loadu_si128(s.as_ptr().add(48).cast()),
        ]
    };
    if flip {
        // Reverse the 16 pixels: the vectors, and the 4 pixels in each.
        v = [
            _mm_shuffle_epi32::<0x1B>(v[3]),
            _mm_shuffle_epi32::<0x1B>(v[2]),
            _mm_shuffle_epi32::<0x1B>(v[1]),
            _mm_shuffle_epi32::<0x1B>(v[0]),
        ];
    }
    let mask = _mm_set1_epi32(0xFF);
    let mut planes = [_mm_set1_epi32(0); 3];
    for (c, plane) in planes.iter_mut().enumerate() {
        let mut m = [_mm_set1_epi32(0); 4];
        for (m, x) in m.iter_mut().zip(v) {
            let shifted = match c {
                0 => x,
                1 => _mm_srli_epi32::<8>(x),
                _ => _mm_srli_epi32::<16>(x),
            };
            *m = _mm_and_si128(shifted, mask);
        }
        *plane = _mm_packus_epi16(_mm_packs_epi32(m[0], m[1]), _mm_packs_epi32(m[2], m[3]));
    }
    // SAFETY: each store writes 16 bytes into a 16-byte array; storeu has
    // no alignment requirement.
    unsafe {
        _mm_storeu_si128(r.as_mut_ptr().cast(), planes[0]);
        _mm_storeu_si128(g.as_mut_ptr().cast(), planes[1]);
        _mm_storeu_si128(b.as_mut_ptr().cast(), planes[2]);
    }
}

/// Element index of (y, x, channel c) in the output layout.
fn index(layout: Layout, plane: usize, w: usize, y: usize, x: usize, c: usize) -> usize {
    match layout {
        Layout::Hwc => (y * w + x) * 3 + c,
        _ => c * plane + y * w + x,
    }
}
