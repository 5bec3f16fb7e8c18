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
//! in [`own_use`], which its producer attributes to the job it was making
//! a batch of and its heartbeats report to the coordinator (`loaderctl
//! status`); the file's header holds the sums over every worker, which the
//! trainer reads.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::OFlag;
use nix::sys::memfd::{MFdFlags, memfd_create};

/// The variable a loader's trainer sets in each worker it forks, naming
/// the cache they share: `{"fd": N, "entries": M}`
/// (`python/loader/_template.py`).
pub const INHERITED: &str = "LOADER_SAMPLE_CACHE";

/// "LDRCACH1": the file is a sample cache of this layout.
const MAGIC: u64 = u64::from_le_bytes(*b"LDRCACH1");
/// Bytes before the slots: the header's words, padded to a page.
const HEADER: usize = 4096;
/// Bytes per slot: the state word and the entry's length.
const SLOT: usize = 16;
/// Entries start at multiples of this (a cache line).
const ALIGN: u64 = 64;
/// The most entries a cache holds (16 GiB of slots would be absurd):
/// a billion samples.
pub const MAX_ENTRIES: u64 = 1 << 30;

/// Slot states; a published slot holds `READY | offset`.
const EMPTY: u64 = 0;
const CLAIMED: u64 = 1;
const NEVER: u64 = 2;
const READY: u64 = 1 << 63;

/// The header's words, by index.
#[derive(Clone, Copy)]
#[repr(usize)]
enum Word {
    Magic = 0,
    Entries,
    /// The allocation cursor: bytes of the data area taken.
    Next,
    /// 0 while on; otherwise why it was turned off ([`Off`]).
    Off,
    Hits,
    Misses,
    Stored,
    StoredBytes,
    /// Entries refused because the space ran out.
    Refused,
    /// Nanoseconds spent loading samples that missed, and how many.
    LoadNanos,
    Loads,
    /// Nanoseconds spent reading samples back from the cache, and how many.
    HitNanos,
    HitsTimed,
    /// Nanoseconds spent storing entries (encoding and writing), and how
    /// many.
    StoreNanos,
    StoresTimed,
}

/// Why a cache was turned off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Off {
    /// Reading a sample back cost about as much as loading it.
    DoesNotPay,
    /// A sample could not be stored or read back (its codec failed).
    Failed,
    /// The job reads each sample once: nothing would be read back.
    OneEpoch,
    /// The cache's file system ran out of space (a full `--cache-dir`).
    NoSpace,
}

impl Off {
    fn code(self) -> u64 {
        match self {
            Off::DoesNotPay => 1,
            Off::Failed => 2,
            Off::OneEpoch => 3,
            Off::NoSpace => 4,
        }
    }

    fn of(code: u64) -> Option<Off> {
        match code {
            0 => None,
            1 => Some(Off::DoesNotPay),
            3 => Some(Off::OneEpoch),
            4 => Some(Off::NoSpace),
            _ => Some(Off::Failed),
        }
    }

    /// Its name in the protocol (`CacheUse.off`) and in the Python half
    /// (`SampleCache.turn_off`).
    pub fn name(self) -> &'static str {
        match self {
            Off::DoesNotPay => "does-not-pay",
            Off::Failed => "failed",
            Off::OneEpoch => "one-epoch",
            Off::NoSpace => "no-space",
        }
    }

    /// The reason named `name` (see [`name`](Self::name)).
    pub fn named(name: &str) -> Option<Off> {
        [Off::DoesNotPay, Off::Failed, Off::OneEpoch, Off::NoSpace].into_iter().find(|off| off.name() == name)
    }

    /// How the worker log and `cache_stats` say it.
    pub fn describe(self) -> &'static str {
        match self {
            Off::DoesNotPay => "storing and reading samples back cost about as much as loading them",
            Off::Failed => "a sample could not be stored in or read from the cache",
            Off::OneEpoch => "the job has one epoch: no sample is read twice",
            Off::NoSpace => "its directory ran out of space: nothing more is stored, samples load as without a cache",
        }
    }
}

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

/// The counters of a cache, summed over every worker using it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Indexes the cache has a slot for.
    pub entries: u64,
    /// Bytes of entries it may hold.
    pub capacity: u64,
    /// Reads that found their entry.
    pub hits: u64,
    /// Reads that loaded their sample.
    pub misses: u64,
    /// Entries stored.
    pub stored: u64,
    /// Bytes of the entries stored.
    pub stored_bytes: u64,
    /// Entries refused because the space ran out.
    pub refused: u64,
    /// Nanoseconds spent loading the samples of misses.
    pub load_nanos: u64,
    /// Misses whose load was timed.
    pub loads: u64,
    /// Nanoseconds spent reading entries back.
    pub hit_nanos: u64,
    /// Reads back that were timed.
    pub hits_timed: u64,
    /// Nanoseconds spent storing entries.
    pub store_nanos: u64,
    /// Stores that were timed.
    pub stores_timed: u64,
    /// Why it was turned off, if it was.
    pub off: Option<Off>,
}

/// One thread's own use of sample caches (see [`own_use`]): the header's
/// counters sum over every co-located worker, these over one thread of
/// one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnUse {
    /// Reads that found their entry.
    pub hits: u64,
    /// Reads that loaded their sample.
    pub misses: u64,
    /// Bytes of the entries this thread stored.
    pub stored_bytes: u64,
    /// Entries refused because the space ran out.
    pub refused: u64,
}

impl OwnUse {
    /// What was counted between `earlier` and `self`.
    pub fn since(&self, earlier: &OwnUse) -> OwnUse {
        OwnUse {
            hits: self.hits.saturating_sub(earlier.hits),
            misses: self.misses.saturating_sub(earlier.misses),
            stored_bytes: self.stored_bytes.saturating_sub(earlier.stored_bytes),
            refused: self.refused.saturating_sub(earlier.refused),
        }
    }

    /// Adds `more` to these counts.
    pub fn add(&mut self, more: &OwnUse) {
        self.hits += more.hits;
        self.misses += more.misses;
        self.stored_bytes += more.stored_bytes;
        self.refused += more.refused;
    }

    /// Nothing was counted.
    pub fn is_empty(&self) -> bool {
        *self == OwnUse::default()
    }
}

thread_local! {
    /// This thread's [`OwnUse`].
    static OWN: std::cell::Cell<OwnUse> = const { std::cell::Cell::new(OwnUse { hits: 0, misses: 0, stored_bytes: 0, refused: 0 }) };
    /// The [`Off`] code a cache this thread used was last found off with
    /// (0: none since [`take_off_seen`]).
    static OFF_SEEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// This thread's own use of sample caches since it started: a worker's
/// producer thread reads every sample it makes on itself (a Python
/// dataset's `__getitem__` too), so the counts that move while it makes a
/// job's batch are that job's.
pub fn own_use() -> OwnUse {
    OWN.with(std::cell::Cell::get)
}

/// Why a cache this thread read or stored through was off, if one was
/// since the last call (and forgets it): a cache turned off records no
/// use, so its job learns of it this way.
pub fn take_off_seen() -> Option<Off> {
    Off::of(OFF_SEEN.with(|off| off.replace(0)))
}

/// Adds to this thread's [`OwnUse`].
fn own(count: impl FnOnce(&mut OwnUse)) {
    OWN.with(|own| {
        let mut used = own.get();
        count(&mut used);
        own.set(used);
    });
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

/// Why a cache file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Creating, sizing or mapping the file failed.
    #[error("sample cache: {0}")]
    Io(#[from] io::Error),
    /// The file is not a cache of the expected layout.
    #[error("sample cache: the file is not a sample cache of {entries} entries ({why})")]
    NotACache {
        /// Entries the caller expected.
        entries: u64,
        /// What did not match.
        why: &'static str,
    },
    /// More entries than a cache holds.
    #[error("sample cache: {0} entries is more than the {MAX_ENTRIES} a cache holds")]
    TooManyEntries(u64),
    /// The directory has no room for the cache's index.
    #[error("sample cache: {where_} has no room for the cache's index of {bytes} bytes ({source}); free space there or give another --cache-dir")]
    NoSpace {
        /// The directory (or "memory").
        where_: String,
        /// Bytes the index needs.
        bytes: u64,
        /// The file system's answer.
        source: io::Error,
    },
}

impl SampleCache {
    /// A new cache of `entries` indexes and `capacity` bytes of entries: a
    /// memfd, or an unnamed file in `dir`. The file is sparse: memory (or
    /// disk) is taken as entries are written.
    pub fn create(entries: u64, capacity: u64, dir: Option<&Path>) -> Result<Self, CacheError> {
        let data_at = data_at(entries)?;
        let file = match dir {
            None => File::from(memfd_create("loader-sample-cache", MFdFlags::MFD_CLOEXEC).map_err(io::Error::from)?),
            Some(dir) => OpenOptions::new()
                .read(true)
                .write(true)
                .mode(0o600)
                .custom_flags(OFlag::O_TMPFILE.bits() | OFlag::O_CLOEXEC.bits())
                .open(dir)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?,
        };
        let size = (data_at as u64).checked_add(capacity).ok_or(CacheError::NotACache { entries, why: "too large" })?;
        file.set_len(size)?;
        // The header and slots are written through the mapping: their
        // space is taken now, so a full directory is this one-line error
        // rather than a SIGBUS at the first store.
        if let Err(source) = allocate(&file, 0, data_at as u64) {
            if source.raw_os_error() == Some(nix::libc::ENOSPC) {
                return Err(CacheError::NoSpace { where_: location(&file), bytes: data_at as u64, source });
            }
        }
        let cache = Self::map(file, entries, data_at)?;
        cache.word(Word::Entries).store(entries, Ordering::Relaxed);
        cache.word(Word::Magic).store(MAGIC, Ordering::Release);
        Ok(cache)
    }

    /// Lets processes this one starts with `exec` inherit the cache's
    /// descriptor (it is made close-on-exec): `loaderctl run --cache`
    /// starts its workers so, naming the descriptor in [`INHERITED`]
    /// ([`variable`](Self::variable)).
    pub fn inherit_across_exec(&self) -> io::Result<()> {
        use nix::fcntl::{FcntlArg, FdFlag, fcntl};
        fcntl(self.file.as_fd(), FcntlArg::F_SETFD(FdFlag::empty())).map(drop).map_err(io::Error::from)
    }

    /// The value of [`INHERITED`] that names this cache to a worker that
    /// inherits its descriptor.
    pub fn variable(&self) -> String {
        serde_json::json!({ "fd": self.file.as_raw_fd(), "entries": self.entries }).to_string()
    }

    /// The cache another process created, of `entries` indexes, from its
    /// descriptor.
    pub fn open(file: File, entries: u64) -> Result<Self, CacheError> {
        let data_at = data_at(entries)?;
        let size = file.metadata()?.len();
        if size < data_at as u64 {
            return Err(CacheError::NotACache { entries, why: "too short" });
        }
        let cache = Self::map(file, entries, data_at)?;
        if cache.word(Word::Magic).load(Ordering::Acquire) != MAGIC {
            return Err(CacheError::NotACache { entries, why: "no magic" });
        }
        if cache.word(Word::Entries).load(Ordering::Relaxed) != entries {
            return Err(CacheError::NotACache { entries, why: "made for another number of samples" });
        }
        Ok(cache)
    }

    /// The cache this process inherited from its trainer ([`INHERITED`]),
    /// made for `entries` indexes; None when it inherited none. The
    /// descriptor is reopened, so it stays where it was.
    pub fn inherited(entries: u64) -> Result<Option<Self>, CacheError> {
        let Ok(named) = std::env::var(INHERITED) else {
            return Ok(None);
        };
        let given: serde_json::Value =
            serde_json::from_str(&named).map_err(|_| CacheError::NotACache { entries, why: "the variable is not its JSON" })?;
        let field = |name: &str| given.get(name).and_then(serde_json::Value::as_u64);
        let (Some(fd), Some(made_for)) = (field("fd"), field("entries")) else {
            return Err(CacheError::NotACache { entries, why: "the variable names no descriptor" });
        };
        if made_for != entries {
            return Err(CacheError::NotACache { entries, why: "made for another number of samples" });
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{fd}"))
            .map_err(|e| io::Error::new(e.kind(), format!("descriptor {fd}: {e}")))?;
        Self::open(file, entries).map(Some)
    }

    fn map(file: File, entries: u64, data_at: usize) -> Result<Self, CacheError> {
        let size = file.metadata()?.len();
        let map = MmapOptions::new().map_raw(&file)?;
        if (map.len() as u64) != size {
            return Err(CacheError::NotACache { entries, why: "mapped short" });
        }
        Ok(Self { capacity: size - data_at as u64, file, map, entries, data_at })
    }

    /// The file's descriptor, to hand to a worker.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

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

    /// Every worker's counters.
    pub fn stats(&self) -> Stats {
        let w = |word| self.word(word).load(Ordering::Relaxed);
        Stats {
            entries: self.entries,
            capacity: self.capacity,
            hits: w(Word::Hits),
            misses: w(Word::Misses),
            stored: w(Word::Stored),
            stored_bytes: w(Word::StoredBytes),
            refused: w(Word::Refused),
            load_nanos: w(Word::LoadNanos),
            loads: w(Word::Loads),
            hit_nanos: w(Word::HitNanos),
            hits_timed: w(Word::HitsTimed),
            store_nanos: w(Word::StoreNanos),
            stores_timed: w(Word::StoresTimed),
            off: Off::of(w(Word::Off)),
        }
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

/// Where `file` lives, for messages: its directory, or "memory" for a memfd.
fn location(file: &File) -> String {
    match std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
        Ok(path) if path.to_string_lossy().starts_with("/memfd:") => "memory (a memfd)".to_owned(),
        Ok(path) => path.parent().map_or_else(|| path.display().to_string(), |dir| dir.display().to_string()),
        Err(_) => "the cache's file system".to_owned(),
    }
}

/// Where the data area of a cache of `entries` starts: after the header and
/// the slots, at a page boundary.
fn data_at(entries: u64) -> Result<usize, CacheError> {
    if entries > MAX_ENTRIES {
        return Err(CacheError::TooManyEntries(entries));
    }
    let end = HEADER + entries as usize * SLOT;
    Ok(end.div_ceil(4096) * 4096)
}

pub mod on_node;

#[cfg(test)]
mod tests;
