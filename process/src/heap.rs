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
//!
//! `loader-worker` and `loaderctl` also hand small requests to mimalloc
//! ([`Allocator`]): an image pipeline's many small blocks are reused warm
//! there, where glibc's bins turned them cold.

/// Requests of this size and more go to the system's malloc (glibc's,
/// set up by [`keep_batch_buffers`]); smaller ones to mimalloc. See
/// [`Allocator`].
const SMALL_BELOW: usize = 64 << 10;

/// The allocator of `loader-worker` and `loaderctl`: mimalloc for small
/// requests, the system's malloc for large ones.
///
/// Why: a worker's pipeline makes and frees hundreds of small blocks per
/// image (the resizer's coefficient rows: 448 per 224x224 crop) beside
/// large ones (images, batches, HTTP bodies), some of them freed on
/// another thread (a fetched image's buffer). glibc keeps 7 free blocks
/// of a size per thread; the rest go through its bins, and once other
/// threads' frees and large blocks have scattered its arena those bins
/// hand out blocks that are cold in the cache: in a store's later epochs,
/// reading the local copy of an image folder's images spent 8% of the
/// producer in `_int_malloc`, at 0.88-0.89x of the folder on local disk; with
/// `GLIBC_TUNABLES=glibc.malloc.tcache_count=1000`, 1.02x. mimalloc keeps
/// small blocks in per-thread pages, reused most recent first. Large
/// blocks stay with glibc, whose thresholds [`keep_batch_buffers`] sets:
/// mimalloc alone gave batch buffers back to the kernel and faulted them
/// in again (gRPC batches of 64 224x224 images at 0.70x), and its v3
/// zeroed fresh pages for a store's response bodies (first batch +0.2 s).
///
/// Which allocator owns a block follows from its layout's size alone,
/// which Rust passes to every call: a block never reaches the other.
#[derive(Debug, Clone, Copy, Default)]
pub struct Allocator;

impl Allocator {
    fn small(size: usize) -> bool {
        size < SMALL_BELOW
    }
}

// SAFETY: every call is forwarded to `mimalloc::MiMalloc` or to
// `std::alloc::System`, chosen by the size of the block's layout: the
// layout given to `dealloc` and `realloc` is the one the block was made
// with, so a block is freed or grown by the allocator that made it; a
// `realloc` across the threshold makes the new block with the other
// allocator, copies the smaller of the two sizes and frees the old one with
// its own.
unsafe impl std::alloc::GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe {
            if Self::small(layout.size()) {
                mimalloc::MiMalloc.alloc(layout)
            } else {
                std::alloc::System.alloc(layout)
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe {
            if Self::small(layout.size()) {
                mimalloc::MiMalloc.alloc_zeroed(layout)
            } else {
                std::alloc::System.alloc_zeroed(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `layout` is the block's own, so this is its allocator.
        unsafe {
            if Self::small(layout.size()) {
                mimalloc::MiMalloc.dealloc(ptr, layout)
            } else {
                std::alloc::System.dealloc(ptr, layout)
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        let (was, will) = (Self::small(layout.size()), Self::small(new_size));
        // SAFETY: within one allocator, forwarded with the caller's
        // guarantees; across, `new` is a fresh block of `new_size` (the
        // caller guarantees the layout is valid), both blocks hold at
        // least `min` bytes and do not overlap, and the old block is freed
        // with its own allocator and layout after the copy.
        unsafe {
            match (was, will) {
                (true, true) => mimalloc::MiMalloc.realloc(ptr, layout, new_size),
                (false, false) => std::alloc::System.realloc(ptr, layout, new_size),
                _ => {
                    let new_layout = std::alloc::Layout::from_size_align_unchecked(new_size, layout.align());
                    let new = self.alloc(new_layout);
                    if !new.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    new
                }
            }
        }
    }
}

/// Largest request still served from malloc's arenas (glibc caps it at
/// 32 MiB on 64-bit): batches up to this size are reused, not unmapped.
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free memory at the top of an arena that is kept rather than trimmed: a
/// prefetch window of batches and then some.
const TRIM_THRESHOLD: i32 = 512 << 20;

/// mimalloc's option `purge_delay` (`mi_option_purge_delay` in v2's
/// `mimalloc.h`, which the Rust bindings leave out: its place in the enum,
/// after `eager_commit_delay`, which they do export).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = libmimalloc_sys::mi_option_eager_commit_delay + 1;
/// How long small blocks' pages that mimalloc holds free wait before it
/// hands them back to the kernel, in milliseconds (its default: 10).
///
/// Why: a worker reading images from a store frees each image's buffer
/// (~50 KB, a mimalloc block) on its producer thread once decoded, while
/// the storage thread allocates the next ones. At 10 ms mimalloc returned
/// those pages between two batches and faulted them in again: 12,800
/// images from a store took 64-68 thousand page faults, 46-49 thousand at
/// 1 s, and read 0.7-2.5% faster (three same-run A/Bs). Pages idle for a
/// second still go back.
const PURGE_DELAY_MS: std::ffi::c_long = 1000;

/// Sets malloc to keep batch-sized buffers (glibc) and the pages of
/// mimalloc's freed small blocks for a while ([`PURGE_DELAY_MS`]). Best
/// called before the process starts threads.
pub fn keep_batch_buffers() {
    // SAFETY: `mi_option_set` stores an option's value; any value is
    // valid for this one (negative: never purge), and mimalloc reads it
    // when it next decides to purge.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS);
    }
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

#[cfg(test)]
mod tests {
    use std::alloc::{GlobalAlloc, Layout};

    use super::*;

    /// The option set is mimalloc's purge delay: it sits between the
    /// eager commit delay and the NUMA nodes, the two options the bindings
    /// export on either side of it, has the purge delay's default (10 ms),
    /// and takes the value set.
    #[test]
    fn the_purge_delay_is_the_option_set() {
        // SAFETY: reading and setting mimalloc options has no other effect.
        unsafe {
            use libmimalloc_sys::{mi_option_eager_commit_delay, mi_option_get, mi_option_use_numa_nodes};
            assert_eq!(mi_option_use_numa_nodes, MI_OPTION_PURGE_DELAY + 1, "the enum's order");
            assert_eq!(mi_option_get(mi_option_eager_commit_delay), 1);
            assert_eq!(mi_option_get(MI_OPTION_PURGE_DELAY), 10, "mimalloc's default purge delay");
            keep_batch_buffers();
            assert_eq!(mi_option_get(MI_OPTION_PURGE_DELAY), PURGE_DELAY_MS);
        }
    }

    /// A block grown or shrunk across the threshold keeps its bytes and
    /// is freed by the allocator that holds it after the move.
    #[test]
    fn blocks_keep_their_bytes_across_the_threshold() {
        let a = Allocator;
        let small = Layout::from_size_align(100, 8).expect("layout");
        // SAFETY: each block is used within its size and freed once, with
        // the layout it has at that point.
        unsafe {
            let p = a.alloc(small);
            assert!(!p.is_null());
            for i in 0..100 {
                *p.add(i) = i as u8;
            }
            let big = a.realloc(p, small, SMALL_BELOW * 2);
            assert!(!big.is_null());
            assert!((0..100).all(|i| *big.add(i) == i as u8), "grown into the system's malloc");
            *big.add(SMALL_BELOW * 2 - 1) = 7;
            let large = Layout::from_size_align(SMALL_BELOW * 2, 8).expect("layout");
            let back = a.realloc(big, large, 50);
            assert!(!back.is_null());
            assert!((0..50).all(|i| *back.add(i) == i as u8), "shrunk back into mimalloc");
            a.dealloc(back, Layout::from_size_align(50, 8).expect("layout"));
            let zeroed = a.alloc_zeroed(large);
            assert!(!zeroed.is_null() && (0..SMALL_BELOW * 2).all(|i| *zeroed.add(i) == 0));
            a.dealloc(zeroed, large);
        }
    }
}
