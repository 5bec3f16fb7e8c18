//! Decoded frames kept across epochs, for [`Pipeline::run_kept`]: the
//! deterministic half of an image sample (its file read and decoded) done
//! once, so later epochs run only the random half (crops, flips, resizes).
//!
//! A frame is the whole image decoded at one DCT scale. The scale a sample
//! needs depends on its random crop, so a frame is kept per (sample, scale)
//! and a sample whose crop asks for another scale decodes again (and keeps
//! that frame too). From a frame the pipeline cuts exactly the region an
//! uncached run would have decoded, at the same place in the same buffer
//! geometry ([`jpeg::held`]), so the passes after it compute the same
//! floating-point boxes and write the same bytes: a kept frame changes how
//! fast a sample is made, never its pixels.
//!
//! [`Pipeline::run_kept`]: super::Pipeline::run_kept
//! [`jpeg::held`]: super::jpeg::held

use std::time::Duration;

use super::ImageError;

/// How a kept frame was decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A JPEG; a cropped decode of it at the frame's scale starts its rows
    /// at a multiple of `align` columns.
    Jpeg {
        /// The crop alignment libjpeg-turbo reported at this scale.
        align: u32,
    },
    /// A PNG (always at full size).
    Png,
}

/// One kept frame.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// What it was decoded from.
    pub source: Source,
    /// The image's full size, as its header says.
    pub full: (u32, u32),
    /// DCT scale numerator over 8 (8 for a PNG).
    pub scale: u32,
    /// RGBX rows of the image at that scale.
    pub pixels: &'a [u8],
}

/// Where frames are kept (the worker's sample cache); shared by the threads
/// of a worker, and by the co-located workers of one loader.
pub trait Frames: Send + Sync + std::fmt::Debug {
    /// What any kept frame of sample `index` says of its file: how it was
    /// decoded and the image's full size, enough to plan the sample
    /// without reading it.
    fn known(&self, index: u64) -> Option<(Source, (u32, u32))>;

    /// The frame of sample `index` at `scale`, if one is kept.
    fn get(&self, index: u64, scale: u32) -> Option<Frame<'_>>;

    /// Keeps a frame of sample `index` at `scale` (`pixels` bytes of RGBX
    /// rows of the image `full` scaled) that `decode` writes in place into
    /// the cache's memory, returning how it was decoded. None, without
    /// calling `decode`, when it cannot be kept now (the cache is off or
    /// full, or another worker kept on keeping it past a bounded wait):
    /// the sample is then decoded as without a cache (only the region its
    /// first pass reads). The frame comes with whether `decode` made it
    /// here (false: another worker was keeping it and finished while this
    /// one waited, so the image was decoded once on the node). An error of
    /// `decode` comes back as it is, and the index stays uncached (the
    /// sample is then made as without a cache too, with that run's
    /// result).
    fn keep(
        &self,
        index: u64,
        scale: u32,
        full: (u32, u32),
        pixels: usize,
        decode: &mut dyn FnMut(&mut [u8]) -> Result<Source, ImageError>,
    ) -> Option<Result<(Frame<'_>, bool), ImageError>>;

    /// A sample made from a kept frame, and the CPU time it took to cut
    /// its region out.
    fn hit(&self, took: Duration);

    /// A sample whose frame was decoded and kept ([`keep`](Self::keep)):
    /// the CPU time reading and decoding took (what a hit saves), and
    /// cutting the sample's region out of the frame (what a hit will
    /// cost). What keeping itself costs, `keep` counts.
    fn miss(&self, decode: Duration, cut: Duration);
}

/// This thread's CPU time: what [`Frames`] are told, so that their
/// decision weighs work, not waits (a busy machine preempts, and co-located
/// workers filling one cache file contend for it; either would make a
/// frame look dearer than it is).
pub fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).map_or(Duration::ZERO, Duration::from)
}
