//! [`SampleCache`]: samples kept across epochs, shared by the co-located
//! workers of one loader.
//!
//! A multi-epoch job reads every sample again each epoch, and for an image
//! dataset most of a sample's cost is the deterministic half of its
//! pipeline (open and decode the JPEG), not the random half (crop, flip).
//! The cache keeps the output of the deterministic half, index by index,
//! so later epochs run only the random half, with bit-identical results.
//!
//! One file holds it: a memfd (memory) or an unnamed file in a directory
//! (`O_TMPFILE`: the page cache keeps what fits, the rest lives on that
//! disk). The trainer creates it and hands the descriptor to the workers it
//! forks, so the file goes when the last of them closes it: nothing is left
//! behind when a trainer is killed. Layout:
//!
//! | at | what |
//! | --- | --- |
//! | 0 | header: magic, entries, the allocation cursor, the off switch, counters |
//! | [`HEADER`] | one slot per index: a state word and a length |
//! | `data_at` | entries, allocated front to back, never freed or moved |
//!
//! An entry is written once: a worker claims the index's slot (compare and
//! swap from empty), takes space by moving the cursor, copies the bytes and
//! then publishes the slot with the entry's offset (release). A reader that
//! sees a published slot (acquire) sees the bytes, which nobody writes
//! again, so the cache needs no locks and a worker killed mid-write costs
//! only that index (its slot stays claimed: later readers load it
//! themselves). Once the space runs out, indexes without an entry are
//! marked never-cached and loaded every time.
//!
//! Each worker also counts its own hits, misses, stored bytes and refusals
//! for Prometheus (`loader_worker_sample_cache_*_total`) and per thread
//! in [`own_use()`], which its producer attributes to the job it was making
//! a batch of and its heartbeats report to the coordinator (`loaderctl
//! status`); the file's header holds the sums over every worker, which the
//! trainer reads.
//!
//! This module holds the entries' path, the one every sample takes: the
//! mapped [`SampleCache`], reading an entry back, claiming, filling and
//! publishing one, and counting hits, misses and stores (kept beside the
//! slots and header words they touch, so that path reads in one place).
//! The rest is in submodules: `layout`, the file's layout in named
//! constants and the header's words; `file`, making, opening and
//! inheriting the file, and why that can fail ([`CacheError`]); `off`, why
//! a cache was turned off ([`Off`]); `own_use`, one thread's own counts
//! ([`OwnUse`]); `stats`, the counters summed over every worker as the
//! trainer reads them ([`Stats`]); `on_node`, a cache the workers of one
//! node share by name.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapRaw;

mod file;
mod layout;
mod off;
mod own_use;
mod stats;

pub use file::{CacheError, INHERITED};
pub use layout::MAX_ENTRIES;
pub use off::Off;
pub use own_use::{OwnUse, own_use, take_off_seen};
pub use stats::Stats;

use file::location;
use layout::{ALIGN, CLAIMED, EMPTY, HEADER, NEVER, READY, SLOT, Word};
use own_use::{OFF_SEEN, own};

/// What became of a [`SampleCache::put`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    /// The entry is in; readers see it from now on.
    Stored,
    /// Another worker holds or is writing this index.
    Taken,
    /// The space ran out (this index will not be cached).
    Full,
    /// The cache is off, or the index is not one of its entries.
    Refused,
}

/// A sample cache mapped in this process (see the module docs).
#[derive(Debug)]
pub struct SampleCache {
    file: File,
    map: MmapRaw,
    entries: u64,
    /// Where the data area starts in the file.
    data_at: usize,
    /// Bytes of the data area.
    capacity: u64,
}

impl SampleCache {
    /// Indexes the cache has a slot for.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Whether entries are read and stored (no worker turned it off).
    pub fn is_on(&self) -> bool {
        let off = self.word(Word::Off).load(Ordering::SeqCst);
        if off != 0 {
            OFF_SEEN.with(|seen| seen.set(off));
        }
        off == 0
    }

    /// Turns the cache off for every worker using it: from now on `get`
    /// finds nothing and `put` stores nothing. The first reason stays.
    pub fn turn_off(&self, why: Off) {
        let _ = self.word(Word::Off).compare_exchange(0, why.code(), Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The entry of `index`, if one was published and the cache is on. The
    /// bytes stay valid and unchanged for as long as the cache is mapped
    /// (an entry is never written again).
    pub fn get(&self, index: u64) -> Option<&[u8]> {
        if index >= self.entries || !self.is_on() {
            return None;
        }
        let state = self.slot(index).load(Ordering::Acquire);
        if state & READY == 0 {
            return None;
        }
        let offset = state & !READY;
        let len = self.slot_len(index).load(Ordering::Relaxed);
        let end = offset.checked_add(len)?;
        if end > self.capacity {
            return None; // never written so: a damaged file reads as a miss
        }
        // SAFETY: [offset, end) lies in the data area (checked above), which
        // the mapping covers; the slot was published (acquire) after the
        // writer's last store into those bytes, and no one writes them
        // again (the cursor only moves forward), so no write races this
        // shared borrow for as long as `self` keeps the mapping.
        Some(unsafe { std::slice::from_raw_parts(self.data().add(offset as usize), len as usize) })
    }

    /// Stores the concatenation of `parts` as the entry of `index`, unless
    /// it has one, another worker is writing it, the space ran out or the
    /// cache is off. Written with `pwrite`, not through the mapping: a
    /// fresh page is then allocated by the write, not by a page fault per
    /// 4 KiB (which cost half as much again as the copy).
    pub fn put(&self, index: u64, parts: &[&[u8]]) -> Put {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let offset = match self.reserve(index, len) {
            Ok(offset) => offset,
            Err(put) => return put,
        };
        // [offset, offset + len) is this call's alone: the cursor moved
        // past it, and no reader looks at it before the slot is published.
        let mut at = self.data_at as u64 + offset;
        for part in parts {
            if let Err(e) = self.file.write_all_at(part, at) {
                self.slot(index).store(NEVER, Ordering::Release);
                if e.raw_os_error() == Some(nix::libc::ENOSPC) {
                    self.out_of_space(&e);
                }
                return Put::Refused;
            }
            at += part.len() as u64;
        }
        self.publish(index, offset, len)
    }

    /// Stores an entry of `len` bytes that `fill` writes in place, in the
    /// cache's memory (no copy, and no write call: concurrent `pwrite`s
    /// to one file queue on its lock, which cost the co-located workers
    /// of an image job several times the copy itself). `fill` is called
    /// only once the space is this call's; returning false (a decode
    /// failed) leaves the index uncached. Otherwise as [`put`](Self::put).
    pub fn put_with(&self, index: u64, len: u64, fill: impl FnOnce(&mut [u8]) -> bool) -> Put {
        let offset = match self.reserve(index, len) {
            Ok(offset) => offset,
            Err(put) => return put,
        };
        let Ok(bytes) = usize::try_from(len) else {
            self.slot(index).store(NEVER, Ordering::Release);
            return Put::Refused;
        };
        // The entry's pages are written through the mapping, where a full
        // file system is a SIGBUS: their space is taken first, so it is
        // this refusal instead (a file system without fallocate keeps the
        // old risk).
        if let Err(e) = allocate(&self.file, self.data_at as u64 + offset, len)
            && e.raw_os_error() == Some(nix::libc::ENOSPC)
        {
            self.slot(index).store(NEVER, Ordering::Release);
            self.out_of_space(&e);
            return Put::Refused;
        }
        // SAFETY: [offset, offset + len) lies in the data area (`reserve`
        // checked end <= capacity), which the mapping covers; it is this
        // call's alone (the cursor moved past it, and no reader looks at it
        // before the slot is published), so nothing else reads or writes
        // it while `fill` holds this unique borrow.
        let area = unsafe { std::slice::from_raw_parts_mut(self.data().add(offset as usize), bytes) };
        if !fill(area) {
            self.slot(index).store(NEVER, Ordering::Release);
            return Put::Refused;
        }
        self.publish(index, offset, len)
    }

    /// Whether another writer holds `index`'s slot right now (claimed, not
    /// yet published or given up).
    pub fn claimed(&self, index: u64) -> bool {
        index < self.entries && self.slot(index).load(Ordering::Acquire) == CLAIMED
    }

    /// Claims `index`'s slot and `len` bytes of space for it: the space's
    /// offset, or why not (the slot is left claimed only on success, or
    /// marked never-cached when the space ran out).
    fn reserve(&self, index: u64, len: u64) -> Result<u64, Put> {
        if index >= self.entries || !self.is_on() {
            return Err(Put::Refused);
        }
        let slot = self.slot(index);
        if slot.compare_exchange(EMPTY, CLAIMED, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return Err(Put::Taken);
        }
        let taken = len.div_ceil(ALIGN) * ALIGN;
        let next = self.word(Word::Next);
        let mut offset = next.load(Ordering::Relaxed);
        loop {
            let end = offset.checked_add(taken).filter(|&end| end <= self.capacity);
            let Some(end) = end else {
                slot.store(NEVER, Ordering::Release);
                self.count(Word::Refused, 1);
                own(|u| u.refused += 1);
                metrics::counter!("loader_worker_sample_cache_refused_total").increment(1);
                return Err(Put::Full);
            };
            match next.compare_exchange_weak(offset, end, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(offset),
                Err(now) => offset = now,
            }
        }
    }

    /// The file system is full: the cache turns off for every worker
    /// using it, said once per process, naming where it lives.
    fn out_of_space(&self, e: &io::Error) {
        self.turn_off(Off::NoSpace);
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::warn!(
                "sample cache: {} is full ({e}); nothing more is cached, samples load as without a cache",
                location(&self.file)
            );
        });
    }

    /// Publishes the entry of `index` written at `offset`.
    fn publish(&self, index: u64, offset: u64, len: u64) -> Put {
        self.slot_len(index).store(len, Ordering::Relaxed);
        self.slot(index).store(READY | offset, Ordering::Release);
        self.count(Word::Stored, 1);
        self.count(Word::StoredBytes, len);
        own(|u| u.stored_bytes += len);
        metrics::counter!("loader_worker_sample_cache_stored_bytes_total").increment(len);
        Put::Stored
    }

    /// Counts a read that found its entry (and, when timed, what reading it
    /// back cost).
    pub fn record_hit(&self, nanos: Option<u64>) {
        self.count(Word::Hits, 1);
        own(|u| u.hits += 1);
        metrics::counter!("loader_worker_sample_cache_hits_total").increment(1);
        self.time_hit(nanos);
    }

    /// Counts what reading an entry back cost, for a read that was not a hit
    /// (a worker's trial read of an entry it just stored).
    pub fn time_hit(&self, nanos: Option<u64>) {
        if let Some(n) = nanos {
            self.count(Word::HitNanos, n);
            self.count(Word::HitsTimed, 1);
        }
    }

    /// Counts a read that loaded its sample, and what loading it cost.
    pub fn record_miss(&self, nanos: u64) {
        self.count(Word::Misses, 1);
        own(|u| u.misses += 1);
        metrics::counter!("loader_worker_sample_cache_misses_total").increment(1);
        self.count(Word::LoadNanos, nanos);
        self.count(Word::Loads, 1);
    }

    /// Counts a read that loaded its sample without timing the load (it
    /// found the entry being written by another worker).
    pub fn record_untimed_miss(&self) {
        self.count(Word::Misses, 1);
        own(|u| u.misses += 1);
        metrics::counter!("loader_worker_sample_cache_misses_total").increment(1);
    }

    /// Counts what storing an entry cost (encoding it and writing it).
    pub fn time_store(&self, nanos: u64) {
        self.count(Word::StoreNanos, nanos);
        self.count(Word::StoresTimed, 1);
    }


    fn count(&self, word: Word, n: u64) {
        self.word(word).fetch_add(n, Ordering::Relaxed);
    }

    fn word(&self, word: Word) -> &AtomicU64 {
        // SAFETY: the header's words lie in the first page of the mapping
        // (at most 16 words of 8 bytes), 8-aligned (the mapping is
        // page-aligned); the mapping outlives the borrow, and every process
        // touches these words only atomically.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().cast::<u64>().add(word as usize)) }
    }

    fn slot(&self, index: u64) -> &AtomicU64 {
        debug_assert!(index < self.entries);
        // SAFETY: slot `index < entries` lies within [HEADER, data_at),
        // which the mapping covers; 8-aligned (HEADER and SLOT are
        // multiples of 8); only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(HEADER + index as usize * SLOT).cast::<u64>()) }
    }

    fn slot_len(&self, index: u64) -> &AtomicU64 {
        debug_assert!(index < self.entries);
        // SAFETY: as for `slot`, the second word of the same slot.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(HEADER + index as usize * SLOT + 8).cast::<u64>()) }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: data_at <= the mapping's length (checked when mapped).
        unsafe { self.map.as_mut_ptr().add(self.data_at) }
    }
}

/// Takes the disk (or memory) space of `[offset, offset + len)` of `file`
/// without writing it.
fn allocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(nix::libc::EFBIG));
    };
    nix::fcntl::fallocate(file, nix::fcntl::FallocateFlags::empty(), offset, len).map_err(io::Error::from)
}

pub mod on_node;

#[cfg(test)]
mod tests;
