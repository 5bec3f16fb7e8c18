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

    /// Whether a frame of `index` at `scale` would be kept now (the cache
    /// is on and has room). When not, the sample is decoded as without a
    /// cache (only the region its first pass reads).
    fn wants(&self, index: u64, scale: u32) -> bool;

    /// Keeps `frame` as sample `index`'s at `frame.scale`.
    fn put(&self, index: u64, frame: &Frame<'_>);

    /// A sample made from a kept frame, and how long it took to cut its
    /// region out.
    fn hit(&self, took: Duration);

    /// A sample whose frame was decoded (and offered to [`put`](Self::put)):
    /// how long reading and decoding took, storing, and cutting the
    /// sample's region out of the frame (what a hit will cost).
    fn miss(&self, decode: Duration, store: Duration, cut: Duration);
}
