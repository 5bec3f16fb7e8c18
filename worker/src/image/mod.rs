//! The image pipeline of the image datasets: decode a JPEG or PNG, run the
//! job's transforms, write the tensor straight into the batch row.
//!
//! # Layout
//! - [`Pipeline`]: built once per job from the validated steps
//!   (`loader_job::transforms`), run once per sample.
//! - `rng`: the per-(seed, epoch, index, step) random streams.
//! - `geometry`: the crops, resizes and flips planned from sizes alone.
//! - `region`: the DCT scale and the part of the file the first pass needs.
//! - `jpeg` (+ `jpeg_turbo.c`) and `png`: the decoders.
//! - `resample`: one pass over pixels (copy, or Pillow-style bilinear or
//!   bicubic).
//! - `emit`: the final write (flip, layout, normalize/cast table).
//! - [`frames`]: decoded frames kept across epochs ([`Pipeline::run_kept`]).
//!
//! A sample is planned before it is decoded: the JPEG header gives the size,
//! the plan fixes every random choice and the boxes, and the decoder then
//! produces only the rows and columns the first pass reads, at the smallest
//! DCT scale that keeps the crop at least as large as its output.

mod emit;
pub mod frames;
pub mod draws;
mod geometry;
mod jpeg;
mod png;
mod region;
mod resample;
mod rng;
#[cfg(test)]
mod tests;

use std::cell::RefCell;

use loader_proto::pb::{Dtype, Layout, Transform};
use loader_job::spec::SpecError;
use loader_job::transforms::{self, Step};

use crate::dataset::SampleKey;
use emit::Values;
use frames::{Frame, Frames, Source, thread_cpu};
use geometry::{Pass, Plan};

/// Bytes of a pixel between the decoder and the final write: RGBX. The
/// fourth byte costs a third more memory traffic but lets the resampler and
/// the final write move whole 32-bit pixels (measured in docs/images.md).
const PIXEL: usize = 4;

/// Images with more pixels are refused before decoding: Pillow's
/// decompression-bomb limit, which no training photo comes near.
pub const MAX_PIXELS: u64 = 178_956_970;

/// Scratch kept by a thread above this size is released after the sample,
/// so one huge image does not pin its buffers for the life of the worker.
const KEEP_SCRATCH_BYTES: usize = 64 << 20;

/// Why a sample could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The bytes are not a decodable JPEG or PNG (or the image is too large
    /// to decode); the job's corrupt-sample policy applies.
    #[error("corrupt image: {0}")]
    Corrupt(String),
    /// The caller's buffer is not the pipeline's output size.
    #[error("image output buffer holds {got} bytes, the pipeline writes {expected}")]
    OutputSize {
        /// [`Pipeline::output_bytes`].
        expected: usize,
        /// Length of the buffer given.
        got: usize,
    },
    /// The resampler refused a pass (a bug in the plan, not in the input).
    #[error("image resampling failed: {0}")]
    Resample(String),
}

/// A job's image pipeline, shared by the threads of a worker.
#[derive(Debug)]
pub struct Pipeline {
    /// The validated steps and the output they produce.
    spec: transforms::Pipeline,
    /// Output shape, kept for [`Pipeline::output`].
    shape: Vec<u64>,
    /// What normalize and cast do to each channel value.
    values: Values,
}

/// Per-thread buffers reused from sample to sample.
#[derive(Default)]
struct Scratch {
    /// Decoded pixels (RGBX rows) of the region the first pass reads.
    decoded: Vec<u8>,
    /// The PNG decoder's own layout before conversion to RGB.
    raw: Vec<u8>,
    /// A kept PNG's pixels before they are copied into the cache
    /// ([`Pipeline::run_kept`]).
    frame: Vec<u8>,
    /// Pass outputs, used in turn.
    canvases: [Vec<u8>; 2],
    /// The resampler's buffers.
    resampler: resample::Resampler,
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch").field("decoded", &self.decoded.len()).finish_non_exhaustive()
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Jpeg,
    Png,
}

fn format(encoded: &[u8]) -> Result<Format, ImageError> {
    if encoded.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Ok(Format::Jpeg)
    } else if encoded.starts_with(b"\x89PNG\r\n\x1a\n") {
        Ok(Format::Png)
    } else {
        let head: Vec<String> = encoded.iter().take(4).map(|b| format!("{b:02x}")).collect();
        Err(ImageError::Corrupt(format!("neither JPEG nor PNG (starts with {})", head.join(" "))))
    }
}

impl Format {
    fn of(source: Source) -> Format {
        match source {
            Source::Jpeg { .. } => Format::Jpeg,
            Source::Png => Format::Png,
        }
    }
}

/// The file's format and full size, refusing images too large to decode.
fn probe(encoded: &[u8]) -> Result<(Format, (u32, u32)), ImageError> {
    let format = format(encoded)?;
    let full = match format {
        Format::Jpeg => jpeg::header(encoded)?,
        Format::Png => png::header(encoded)?,
    };
    let pixels = u64::from(full.0) * u64::from(full.1);
    if pixels == 0 || pixels > MAX_PIXELS {
        return Err(ImageError::Corrupt(format!(
            "{}x{} pixels; images must have between 1 and {MAX_PIXELS}",
            full.0, full.1
        )));
    }
    Ok((format, full))
}

/// Decodes what `first` reads into `s.decoded` and rewrites `first` for
/// it: a JPEG's region at the pass's DCT scale, a whole PNG.
fn decode_first(encoded: &[u8], format: Format, full: (u32, u32), first: &mut Pass, s: &mut Scratch) -> Result<(), ImageError> {
    match format {
        Format::Jpeg => {
            let m = region::dct_scale(first);
            let scaled = jpeg::scaled(full, m);
            region::scale(first, full, m, scaled);
            let need = region::needed(first);
            let got = jpeg::decode(encoded, full, m, need, &mut s.decoded)?;
            region::rebase(first, got.origin, got.size);
        }
        Format::Png => {
            let size = png::decode(encoded, &mut s.raw, &mut s.decoded)?;
            if size != full {
                return Err(ImageError::Corrupt("PNG: size changed between header and data".into()));
            }
        }
    }
    Ok(())
}

/// Decodes the whole image at `scale` into `into` (exactly its RGBX rows),
/// for keeping; a PNG goes through `raw` and `spare` (its decoder's
/// buffers).
fn decode_whole(
    encoded: &[u8],
    format: Format,
    full: (u32, u32),
    scale: u32,
    into: &mut [u8],
    raw: &mut Vec<u8>,
    spare: &mut Vec<u8>,
) -> Result<Source, ImageError> {
    match format {
        Format::Jpeg => {
            let (w, h) = jpeg::scaled(full, scale);
            let got = jpeg::decode_into(encoded, full, scale, geometry::Rect { x: 0, y: 0, w, h }, into)?;
            if (got.origin, got.size) != ((0, 0), (w, h)) {
                return Err(ImageError::Corrupt(format!("JPEG: a whole decode held {:?} at {:?}", got.size, got.origin)));
            }
            Ok(Source::Jpeg { align: got.align })
        }
        Format::Png => {
            let size = png::decode(encoded, raw, spare)?;
            let bytes = size.0 as usize * size.1 as usize * PIXEL;
            if size != full || spare.len() < bytes || into.len() != bytes {
                return Err(ImageError::Corrupt("PNG: size changed between header and data".into()));
            }
            into.copy_from_slice(&spare[..bytes]);
            Ok(Source::Png)
        }
    }
}

/// Copies into `decoded` what an uncached run would have decoded for
/// `first` from `frame`, and rewrites `first` for it as that run does.
fn cut(frame: &Frame<'_>, first: &mut Pass, decoded: &mut Vec<u8>) -> Result<(), ImageError> {
    let scaled = match frame.source {
        Source::Jpeg { .. } => jpeg::scaled(frame.full, frame.scale),
        Source::Png => frame.full,
    };
    let stride = scaled.0 as usize * PIXEL;
    if frame.pixels.len() != stride * scaled.1 as usize {
        return Err(ImageError::Corrupt(format!(
            "a kept frame holds {} bytes, not {}x{} pixels",
            frame.pixels.len(),
            scaled.0,
            scaled.1
        )));
    }
    let Source::Jpeg { align } = frame.source else {
        decoded.clear();
        decoded.extend_from_slice(frame.pixels);
        return Ok(());
    };
    region::scale(first, frame.full, frame.scale, scaled);
    let need = region::needed(first);
    let ((x0, y0), (w, h)) = jpeg::held(need, scaled, align);
    if x0 + w > scaled.0 || y0 + h > scaled.1 {
        return Err(ImageError::Corrupt(format!("a region {w}x{h} at ({x0}, {y0}) outside the kept {}x{} frame", scaled.0, scaled.1)));
    }
    let row = w as usize * PIXEL;
    decoded.clear();
    decoded.reserve(row * h as usize);
    for y in y0..y0 + h {
        let at = y as usize * stride + x0 as usize * PIXEL;
        decoded.extend_from_slice(&frame.pixels[at..at + row]);
    }
    region::rebase(first, (x0, y0), (w, h));
    Ok(())
}

impl Pipeline {
    /// Validates `transforms` (the same rules the coordinator applies) and
    /// prepares the pipeline.
    pub fn new(transforms: &[Transform]) -> Result<Pipeline, SpecError> {
        let spec = transforms::check(transforms)?;
        let shape = spec.shape();
        let values = Values::new(&spec.steps, spec.dtype);
        Ok(Pipeline { spec, shape, values })
    }

    /// Element type and shape of one output, e.g. `(U8, [3, 224, 224])`.
    pub fn output(&self) -> (Dtype, &[u64]) {
        (self.spec.dtype, &self.shape)
    }

    /// Bytes of one output.
    pub fn output_bytes(&self) -> usize {
        self.spec.height as usize * self.spec.width as usize * 3 * self.spec.dtype.size()
    }

    /// Decodes `encoded` (JPEG or PNG, told apart by their magic bytes) and
    /// runs the steps, writing exactly [`output_bytes`](Self::output_bytes)
    /// into `out`. Random steps draw from `key` alone.
    pub fn run(&self, encoded: &[u8], key: SampleKey, out: &mut [u8]) -> Result<(), ImageError> {
        if out.len() != self.output_bytes() {
            return Err(ImageError::OutputSize { expected: self.output_bytes(), got: out.len() });
        }
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => {
                let r = self.run_with(encoded, key, out, &mut scratch);
                let held = scratch.decoded.capacity()
                    + scratch.raw.capacity()
                    + scratch.frame.capacity()
                    + scratch.canvases.iter().map(Vec::capacity).sum::<usize>()
                    + scratch.resampler.held();
                if held > KEEP_SCRATCH_BYTES {
                    *scratch = Scratch::default();
                }
                r
            }
            // Only reachable if a pipeline ran inside another on this thread.
            Err(_) => self.run_with(encoded, key, out, &mut Scratch::default()),
        })
    }

    /// As [`run`](Self::run), with frames kept in `frames`: a sample
    /// whose frame is kept is made from it without reading its file
    /// (`read` is not called); otherwise the whole image is decoded at the
    /// scale the sample needs and offered to `frames`. The bytes written
    /// are the same as `run`'s on the file `read` gives (see [`frames`]).
    pub fn run_kept<R: AsRef<[u8]>>(
        &self,
        key: SampleKey,
        out: &mut [u8],
        frames: &dyn Frames,
        read: impl FnOnce() -> Result<R, ImageError>,
    ) -> Result<(), ImageError> {
        if out.len() != self.output_bytes() {
            return Err(ImageError::OutputSize { expected: self.output_bytes(), got: out.len() });
        }
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => {
                let r = self.run_kept_with(key, out, frames, read, &mut scratch);
                let held = scratch.decoded.capacity()
                    + scratch.raw.capacity()
                    + scratch.frame.capacity()
                    + scratch.canvases.iter().map(Vec::capacity).sum::<usize>()
                    + scratch.resampler.held();
                if held > KEEP_SCRATCH_BYTES {
                    *scratch = Scratch::default();
                }
                r
            }
            Err(_) => self.run_kept_with(key, out, frames, read, &mut Scratch::default()),
        })
    }

    fn run_with(&self, encoded: &[u8], key: SampleKey, out: &mut [u8], s: &mut Scratch) -> Result<(), ImageError> {
        let (format, full) = probe(encoded)?;
        let mut plan = Plan::new(&self.spec.steps, full.0, full.1, key);
        decode_first(encoded, format, full, &mut plan.passes[0], s)?;
        self.finish(&plan, out, s)
    }

    fn run_kept_with<R: AsRef<[u8]>>(
        &self,
        key: SampleKey,
        out: &mut [u8],
        frames: &dyn Frames,
        read: impl FnOnce() -> Result<R, ImageError>,
        s: &mut Scratch,
    ) -> Result<(), ImageError> {
        let started = thread_cpu();
        // Any kept frame of the sample tells its format and size: no read.
        let mut file = None;
        let mut read = Some(read);
        let mut read_file = || read.take().map_or_else(|| Err(ImageError::Corrupt("the file was read twice".into())), |read| read());
        let (format, full) = match frames.known(key.index) {
            Some((source, full)) => (Format::of(source), full),
            None => {
                let bytes = read_file()?;
                let probed = probe(bytes.as_ref())?;
                file = Some(bytes);
                probed
            }
        };
        let mut plan = Plan::new(&self.spec.steps, full.0, full.1, key);
        let first = &mut plan.passes[0];
        let scale = match format {
            Format::Jpeg => region::dct_scale(first),
            Format::Png => 8,
        };
        if let Some(frame) = frames.get(key.index, scale) {
            cut(&frame, first, &mut s.decoded)?;
            frames.hit(thread_cpu().saturating_sub(started));
            return self.finish(&plan, out, s);
        }
        let bytes = match file {
            Some(bytes) => bytes,
            // Planned from a kept frame of another scale: the file must
            // still be what that frame was decoded from.
            None => {
                let bytes = read_file()?;
                if probe(bytes.as_ref())? != (format, full) {
                    return Err(ImageError::Corrupt("the file changed since its frame was kept".into()));
                }
                bytes
            }
        };
        let encoded = bytes.as_ref();
        let scaled = match format {
            Format::Jpeg => jpeg::scaled(full, scale),
            Format::Png => full,
        };
        let pixels = scaled.0 as usize * scaled.1 as usize * PIXEL;
        let (raw, spare) = (&mut s.raw, &mut s.frame);
        // Reading the file so far, and decoding (keeping's own cost, the
        // cache's pages, is not in it: `keep` counts that).
        let mut load = thread_cpu().saturating_sub(started);
        let mut decode = |into: &mut [u8]| {
            let began = thread_cpu();
            let source = decode_whole(encoded, format, full, scale, into, raw, spare);
            load += thread_cpu().saturating_sub(began);
            source
        };
        let (frame, decoded) = match frames.keep(key.index, scale, full, pixels, &mut decode) {
            Some(Ok(kept)) => kept,
            // Not kept, or the whole image does not decode where the
            // region may (a file cut short below the crop): made as an
            // uncached run makes it, with its result.
            None | Some(Err(_)) => {
                decode_first(encoded, format, full, first, s)?;
                return self.finish(&plan, out, s);
            }
        };
        let began = thread_cpu();
        cut(&frame, first, &mut s.decoded)?;
        if decoded {
            frames.miss(load, thread_cpu().saturating_sub(began));
        } else {
            // Another worker kept it while this one waited.
            frames.hit(thread_cpu().saturating_sub(started));
        }
        self.finish(&plan, out, s)
    }

    /// Runs the plan's passes from the first pass's input in `s.decoded`
    /// and writes the output.
    fn finish(&self, plan: &Plan, out: &mut [u8], s: &mut Scratch) -> Result<(), ImageError> {
        let Scratch { decoded, canvases, resampler, .. } = s;
        let [a, b] = canvases;
        let (mut input, mut output): (&mut Vec<u8>, &mut Vec<u8>) = (decoded, a);
        let mut spare: &mut Vec<u8> = b;
        for pass in &plan.passes {
            let len = pass.canvas.0 as usize * pass.canvas.1 as usize * PIXEL;
            if output.len() < len {
                output.resize(len, 0);
            }
            let in_len = pass.input.0 as usize * pass.input.1 as usize * PIXEL;
            resampler.run(pass, &input[..in_len], &mut output[..len])?;
            // The output becomes the next input; the old input is free.
            std::mem::swap(&mut input, &mut output);
            std::mem::swap(&mut output, &mut spare);
        }
        let (w, h) = plan.size();
        if (w, h) != (self.spec.width, self.spec.height) {
            return Err(ImageError::Resample(format!(
                "plan ends at {w}x{h}, expected {}x{}",
                self.spec.width, self.spec.height
            )));
        }
        let canvas = &input[..w as usize * h as usize * PIXEL];
        emit::write(canvas, w as usize, h as usize, plan.flip, self.layout(), &self.values, out);
        Ok(())
    }

    fn layout(&self) -> Layout {
        self.spec.layout
    }

    /// The validated steps.
    pub fn steps(&self) -> &[Step] {
        &self.spec.steps
    }
}
