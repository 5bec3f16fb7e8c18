//! The local copy's place and byte budget, shared by every object a
//! process reads from stores.
//!
//! Chunks of large objects and whole small objects fetched from a store are
//! kept in unlinked files in one directory, so later reads (the next epoch
//! above all) come from local disk. What they may take in all is one budget
//! per process: [`configure`]d by the worker (`--storage-cache-dir`,
//! `--storage-cache`), else `LOADER_STORAGE_CACHE_DIR` (default: the
//! system's temporary directory) and half the free space of that
//! directory's filesystem when first used. Past the budget, bytes are not
//! kept on disk: large objects keep a few chunks in memory, small ones are
//! fetched again when read again.
//!
//! Shared (`--storage-cache-shared`, `LOADER_STORAGE_CACHE_SHARED=1`), the
//! workers of a node that use the same directory keep a folder's small
//! objects in one place for all of them (`crate::node_pile`); each worker's
//! budget still counts what it wrote.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use nix::fcntl::{FallocateFlags, fallocate};
use nix::sys::statfs::{TMPFS_MAGIC, fstatfs};

/// Where and how much.
#[derive(Debug)]
struct LocalCopy {
    dir: PathBuf,
    budget: Budget,
    /// Small objects are kept for the node's workers, not this one alone.
    shared: bool,
}

/// Bytes of disk the local copy's files may take, and how many they do:
/// the bytes written, and the space allocated ahead of them ([`Room`]).
#[derive(Debug)]
pub(crate) struct Budget {
    limit: u64,
    used: AtomicU64,
}

impl Budget {
    pub(crate) const fn new(limit: u64) -> Self {
        Self { limit, used: AtomicU64::new(0) }
    }

    /// Takes `bytes`; false (nothing taken) when they do not fit.
    pub(crate) fn reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| used.checked_add(bytes).filter(|&u| u <= self.limit))
            .is_ok()
    }

    /// Gives back `bytes` taken with [`Budget::reserve`].
    pub(crate) fn release(&self, bytes: u64) {
        let _ = self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| Some(used.saturating_sub(bytes)));
    }

    #[cfg(test)]
    fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

static LOCAL_COPY: OnceLock<LocalCopy> = OnceLock::new();

/// Sets the directory and the byte budget of this process's local copy;
/// without a budget, half the directory's free space; `shared`: the node's
/// workers keep small objects together. Only the first call (or first
/// use) counts; returns false when it came too late.
pub fn configure(dir: Option<PathBuf>, limit: Option<u64>, shared: bool) -> bool {
    let mut made = false;
    LOCAL_COPY.get_or_init(|| {
        made = true;
        make(dir, limit, shared)
    });
    made
}

fn make(dir: Option<PathBuf>, limit: Option<u64>, shared: bool) -> LocalCopy {
    let shared = shared || std::env::var_os("LOADER_STORAGE_CACHE_SHARED").is_some_and(|v| v == "1" || v == "true");
    let dir = dir
        .or_else(|| std::env::var_os("LOADER_STORAGE_CACHE_DIR").map(PathBuf::from))
        .unwrap_or_else(std::env::temp_dir);
    let limit = limit.unwrap_or_else(|| {
        nix::sys::statvfs::statvfs(&dir).map_or(0, |s| s.blocks_available().saturating_mul(s.fragment_size()) / 2)
    });
    tracing::debug!(dir = %dir.display(), limit, shared, "the local copy of objects");
    LocalCopy { dir, budget: Budget::new(limit), shared }
}

fn local_copy() -> &'static LocalCopy {
    LOCAL_COPY.get_or_init(|| make(None, None, false))
}

/// The directory, when the node's workers share small objects there.
pub(crate) fn shared_dir() -> Option<&'static std::path::Path> {
    let copy = local_copy();
    (copy.shared && copy.budget.limit > 0).then_some(copy.dir.as_path())
}

/// A new unlinked file in the local copy's directory: nothing is left when
/// the process ends, however it ends. None (said once) when none can be made.
pub(crate) fn file() -> Option<File> {
    let dir = &local_copy().dir;
    match tempfile::tempfile_in(dir) {
        Ok(f) => Some(f),
        Err(e) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| tracing::warn!("objects are not kept on local disk: cannot make a file in {}: {e}", dir.display()));
            None
        }
    }
}

/// This process's budget.
fn budget() -> &'static Budget {
    &local_copy().budget
}

/// Takes `bytes` of the budget; false (nothing taken) when they do not fit.
pub(crate) fn reserve(bytes: u64) -> bool {
    budget().reserve(bytes)
}

/// Gives back `bytes` taken with [`reserve`] (their file was closed).
pub(crate) fn release(bytes: u64) {
    budget().release(bytes)
}

/// Disk space a file of kept objects takes ahead of its writes: [`STEP`]
/// bytes at a time (`fallocate`), past the end written so far.
///
/// Why: a write that extends a file on ext4 (delayed allocation) reserves
/// and maps every block it lands on; into space allocated already it does
/// not. A worker appends each image it fetches to its file (~50 KB a
/// write): 600 MB written that way took 0.155 s of CPU instead of
/// 0.208 s (this machine, ext4).
///
/// The space taken ahead is disk the budget pays for: a cache whose
/// budget is an `emptyDir`'s `sizeLimit` (the Helm chart's) would
/// otherwise pass it by up to a step per file, and the kubelet evicts a
/// pod whose `emptyDir` passes its limit. So a step is taken only while
/// the budget has room for it, and given back as the writes that fill it
/// take their own bytes (or when the file goes); near the budget's end,
/// the writes extend the file themselves.
///
/// Not on tmpfs (an `emptyDir` in memory), where allocating is zeroing
/// pages the writes then overwrite; nor once the filesystem refuses (no
/// space, no `fallocate`).
#[derive(Debug)]
pub(crate) struct Room {
    budget: &'static Budget,
    ahead: Mutex<Ahead>,
}

/// What a [`Room`] allocated, and what of it the budget pays for.
#[derive(Debug)]
struct Ahead {
    /// How far the file is allocated.
    until: u64,
    /// The furthest end of a write: the bytes below it are paid for by
    /// their writes, those from it to `until` by the room.
    written: u64,
    /// Whether steps are still taken (not on tmpfs, nor once refused).
    allocating: bool,
}

/// Bytes a [`Room`] allocates at a time.
const STEP: u64 = 32 << 20;

impl Room {
    /// The room of `file`, empty (and written past) so far, paid for out
    /// of this process's budget.
    pub(crate) fn of(file: &File) -> Self {
        Self::paid_by(file, budget())
    }

    fn paid_by(file: &File, budget: &'static Budget) -> Self {
        let tmpfs = fstatfs(file).map_or(true, |fs| fs.filesystem_type() == TMPFS_MAGIC);
        Self { budget, ahead: Mutex::new(Ahead { until: 0, written: 0, allocating: !tmpfs }) }
    }

    /// Makes sure `file` is allocated up to `end` before bytes are written
    /// there; the bytes up to `end` are paid for by the caller.
    pub(crate) fn make(&self, file: &File, end: u64) {
        let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        if end > ahead.written {
            // The write pays for its bytes: the room stops paying for
            // those it allocated.
            self.budget.release(end.min(ahead.until).saturating_sub(ahead.written));
            ahead.written = end;
        }
        if !ahead.allocating || end <= ahead.until {
            return;
        }
        let at = ahead.until;
        // A step past the write when the budget has room for it; else
        // only the write's own bytes.
        let spare = (at + STEP).saturating_sub(end);
        let spare = if spare > 0 && self.budget.reserve(spare) { spare } else { 0 };
        let len = end - at + spare;
        match i64::try_from(at).ok().zip(i64::try_from(len).ok()).map(|(at, len)| fallocate(file, FallocateFlags::empty(), at, len)) {
            Some(Ok(())) => ahead.until = at + len,
            _ => {
                self.budget.release(spare);
                ahead.allocating = false;
            }
        }
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        let ahead = self.ahead.get_mut().unwrap_or_else(|p| p.into_inner());
        self.budget.release(ahead.until.saturating_sub(ahead.written));
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileExt, MetadataExt};

    use super::*;

    /// A budget of `limit` bytes for one test.
    fn a_budget(limit: u64) -> &'static Budget {
        Box::leak(Box::new(Budget::new(limit)))
    }

    /// Bytes `file` takes on disk.
    fn on_disk(file: &File) -> u64 {
        file.metadata().expect("meta").blocks() * 512
    }

    /// Appends `len` bytes the way a pile does: paid for, then made room
    /// for, then written; false when the budget has no room for them.
    fn append(file: &File, room: &Room, budget: &Budget, end: &mut u64, len: u64) -> bool {
        if !budget.reserve(len) {
            return false;
        }
        room.make(file, *end + len);
        file.write_all_at(&vec![7; len as usize], *end).expect("write");
        *end += len;
        true
    }

    #[test]
    fn a_file_is_allocated_a_step_ahead_of_its_writes_and_keeps_their_bytes() {
        let file = tempfile::tempfile().expect("file");
        let budget = a_budget(1 << 40);
        let room = Room::paid_by(&file, budget);
        if !room.ahead.lock().expect("lock").allocating {
            // A temporary directory on tmpfs: nothing is taken ahead there.
            return;
        }
        assert!(budget.reserve(100));
        room.make(&file, 100);
        file.write_all_at(b"kept", 96).expect("write");
        assert_eq!(room.ahead.lock().expect("lock").until, STEP);
        assert_eq!(file.metadata().expect("meta").len(), STEP, "allocated a step ahead");
        assert!(on_disk(&file) >= STEP);
        assert_eq!(budget.used(), STEP, "the write's 100 bytes and the room's step past them");
        assert!(budget.reserve(STEP + 1 - 100));
        room.make(&file, STEP + 1);
        assert_eq!(room.ahead.lock().expect("lock").until, 2 * STEP, "the next step");
        assert_eq!(budget.used(), 2 * STEP);
        let mut read = [0u8; 4];
        file.read_exact_at(&mut read, 96).expect("read");
        assert_eq!(&read, b"kept");
        drop(room);
        assert_eq!(budget.used(), STEP + 1, "the room's unused step given back; the writes' bytes kept");
    }

    #[test]
    fn a_file_never_takes_more_disk_than_its_budget() {
        // Less than a step: what an emptyDir's sizeLimit of a few MiB gives.
        let limit = 5 << 20;
        let file = tempfile::tempfile().expect("file");
        let budget = a_budget(limit);
        let room = Room::paid_by(&file, budget);
        let mut end = 0;
        let mut kept = 0;
        while append(&file, &room, budget, &mut end, 50_000) {
            kept += 1;
            assert!(budget.used() <= limit);
            assert!(on_disk(&file) <= budget.used().next_multiple_of(4096) + 4096, "{} on disk, {} paid for", on_disk(&file), budget.used());
        }
        assert_eq!(kept, limit / 50_000, "kept until the budget was spent");
        drop(room);
        assert_eq!(budget.used(), end, "what the writes paid for");

        // With room for steps, they are taken while the budget allows, and
        // paid back as the writes fill them.
        let limit = STEP + STEP / 2;
        let file = tempfile::tempfile().expect("file");
        let budget = a_budget(limit);
        let room = Room::paid_by(&file, budget);
        let mut end = 0;
        while append(&file, &room, budget, &mut end, 1 << 20) {
            assert!(budget.used() <= limit);
            assert!(on_disk(&file) <= budget.used().next_multiple_of(4096) + 4096, "{} on disk, {} paid for", on_disk(&file), budget.used());
        }
        assert_eq!(end, limit, "every byte of the budget written");
        drop(room);
        assert_eq!(budget.used(), limit);
    }
}
