//! The final write: the last canvas (RGB rows) into the caller's buffer,
//! mirrored if the plan says so, in CHW or HWC, with normalize and cast
//! applied through a per-channel table.
//!
//! Geometry runs on 8-bit pixels whatever the step order; normalize and cast
//! act per pixel and per channel, so they commute with crops and flips, and
//! with a resize up to the rounding of its 8-bit output. A table of the 256
//! possible inputs per channel gives every value chain (even a cast to uint8
//! between two normalizes) exactly, at the cost of one lookup.

use loader_proto::pb::{Dtype, Layout};
use loader_proto::transforms::Step;

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

/// Writes the `w` x `h` RGB `canvas` into `out` (exactly the output size).
pub(crate) fn write(canvas: &[u8], w: usize, h: usize, flip: bool, layout: Layout, values: &Values, out: &mut [u8]) {
    let col = |x: usize| if flip { w - 1 - x } else { x };
    let plane = w * h;
    match (values, layout) {
        (Values::Identity, Layout::Hwc) => {
            for (dst, src) in out.chunks_exact_mut(w * 3).zip(canvas.chunks_exact(w * 3)) {
                if flip {
                    for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(3).rev()) {
                        d.copy_from_slice(s);
                    }
                } else {
                    dst.copy_from_slice(src);
                }
            }
        }
        (Values::Identity, _) => {
            let (r, rest) = out.split_at_mut(plane);
            let (g, b) = rest.split_at_mut(plane);
            for y in 0..h {
                let src = &canvas[y * w * 3..][..w * 3];
                let (r, g, b) = (&mut r[y * w..][..w], &mut g[y * w..][..w], &mut b[y * w..][..w]);
                for x in 0..w {
                    let p = &src[col(x) * 3..][..3];
                    r[x] = p[0];
                    g[x] = p[1];
                    b[x] = p[2];
                }
            }
        }
        (Values::U8(t), _) => {
            for y in 0..h {
                for x in 0..w {
                    let p = &canvas[(y * w + col(x)) * 3..][..3];
                    for c in 0..3 {
                        out[index(layout, plane, w, y, x, c)] = t[c][usize::from(p[c])];
                    }
                }
            }
        }
        (Values::F32(t), _) => {
            for y in 0..h {
                for x in 0..w {
                    let p = &canvas[(y * w + col(x)) * 3..][..3];
                    for c in 0..3 {
                        let i = index(layout, plane, w, y, x, c) * 4;
                        out[i..i + 4].copy_from_slice(&t[c][usize::from(p[c])].to_le_bytes());
                    }
                }
            }
        }
    }
}

/// Element index of (y, x, channel c) in the output layout.
fn index(layout: Layout, plane: usize, w: usize, y: usize, x: usize, c: usize) -> usize {
    match layout {
        Layout::Hwc => (y * w + x) * 3 + c,
        _ => c * plane + y * w + x,
    }
}
