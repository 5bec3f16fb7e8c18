//! Software prefetch of bytes a dataset reads next ([`Dataset::prefetch`]):
//! a random sample's bytes come from memory, not cache, and a copy loop
//! that knows the next sample's address can overlap its latency with the
//! current copy.
//!
//! [`Dataset::prefetch`]: super::Dataset::prefetch

/// Bytes of one cache line.
const LINE: usize = 64;

/// Asks the CPU to load `bytes` into cache; a no-op where the target has
/// no prefetch instruction Rust exposes.
pub(super) fn bytes(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        for line in bytes.chunks(LINE) {
            // SAFETY: a prefetch is a hint that never faults; the pointer is
            // into a live slice anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}
