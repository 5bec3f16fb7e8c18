//! Keeps freed batch-sized buffers in the process instead of handing them
//! back to the kernel.
//!
//! Why: over gRPC every batch is a fresh buffer of ~10 MB on both sides (the
//! worker encodes into one, the trainer's tonic stream decodes into one).
//! glibc's malloc serves that size with `mmap` and returns it with `munmap`
//! on free, or, once its dynamic threshold has moved, from an arena it trims
//! back to the kernel as soon as the top is free: either way each batch
//! faults in and zeroes 2,400 fresh pages. Which of those happens depends
//! on which thread freed what first, so two builds of the same code
//! differed in gRPC samples/s by more than the changes between them; with
//! the buffers kept, the trainer's CPU per batch fell (docs/benchmarks.md).
//! Called first thing by
//! `loader-worker`, `loaderctl` and the Python package's
//! worker entry point; the Python SDK's trainer side is a library in the
//! user's interpreter and leaves that process's malloc alone.
//!
//! The coordinator (`loader-server`) carries no batches, and the opposite
//! matters there: memory that thousands of connections took (HTTP/2
//! buffers, TLS state, per-connection tasks) must go back to the kernel
//! once they close. Freed, it can stay in glibc's arenas for good: 2,000
//! connections closed left it at 58.5 MB from 16 MB (the issue saw 67 MB
//! from 14.5); trimmed, 17.7 MB. It keeps glibc's defaults and trims
//! every few seconds ([`return_freed_memory`]).

/// Largest request still served from malloc's arenas (glibc caps it at
/// 32 MiB on 64-bit): batches up to this size are reused, not unmapped.
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free memory at the top of an arena that is kept rather than trimmed: a
/// prefetch window of batches and then some.
const TRIM_THRESHOLD: i32 = 512 << 20;

/// Sets malloc to keep batch-sized buffers (glibc only; elsewhere nothing).
/// Best called before the process starts threads.
pub fn keep_batch_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only changes malloc's parameters, under
        // glibc's own lock; both values are in the documented range. A
        // refused value (0 returned) leaves the default: slower, not wrong.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}

/// Hands memory the process freed back to the kernel every `period`, on a
/// thread of its own (glibc's `malloc_trim`, which also releases free
/// pages inside its arenas, not only at their tops; elsewhere nothing).
/// For a long-lived process whose peaks are bursts of connections, not
/// batches: the coordinator. A trim of a few tens of MB of arenas takes
/// well under a millisecond, under each arena's own lock in turn.
pub fn return_freed_memory(period: std::time::Duration) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let spawned = std::thread::Builder::new().name("heap-trim".into()).spawn(move || {
            loop {
                std::thread::sleep(period);
                // SAFETY: `malloc_trim` takes each arena's own lock while it
                // releases that arena's free pages; it touches no memory
                // that is in use.
                unsafe {
                    libc::malloc_trim(0);
                }
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("freed memory is not handed back to the kernel: {e}");
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = period;
}
