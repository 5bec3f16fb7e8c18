//! Software prefetch of bytes a dataset reads next ([`Dataset::prefetch`]):
//! a random sample's bytes come from memory, not cache, and a copy loop
//! that knows the next sample's address can overlap its latency with the
//! current copy.
//!
//! [`Dataset::prefetch`]: super::Dataset::prefetch

/// Bytes of one cache line.
const LINE: usize = 64;

/// Lines asked for: the first few of the bytes. They hide the latency of
/// the copy's start, and the hardware's own prefetcher follows the copy
/// from there; asking for every line of a 4 KB window instead filled the
/// core's miss buffers and stalled on the hints themselves (measured in
/// docs/benchmarks.md, "Mixtures").
const LINES: usize = 8;

/// Asks the CPU to start loading `bytes` into cache (the first
/// [`LINES`] lines); a no-op where the target has no prefetch instruction
/// Rust exposes.
pub(super) fn bytes(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        for line in bytes.chunks(LINE).take(LINES) {
            // SAFETY: a prefetch is a hint that never faults; the pointer is
            // into a live slice anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}
