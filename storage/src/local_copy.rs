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
    limit: u64,
    used: AtomicU64,
    /// Small objects are kept for the node's workers, not this one alone.
    shared: bool,
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
    LocalCopy { dir, limit, used: AtomicU64::new(0), shared }
}

fn local_copy() -> &'static LocalCopy {
    LOCAL_COPY.get_or_init(|| make(None, None, false))
}

/// The directory, when the node's workers share small objects there.
pub(crate) fn shared_dir() -> Option<&'static std::path::Path> {
    let copy = local_copy();
    (copy.shared && copy.limit > 0).then_some(copy.dir.as_path())
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

/// Takes `bytes` of the budget; false (nothing taken) when they do not fit.
pub(crate) fn reserve(bytes: u64) -> bool {
    let copy = local_copy();
    copy.used
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| used.checked_add(bytes).filter(|&u| u <= copy.limit))
        .is_ok()
}

/// Gives back `bytes` taken with [`reserve`] (their file was closed).
pub(crate) fn release(bytes: u64) {
    let _ = local_copy().used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| Some(used.saturating_sub(bytes)));
}

/// Disk space a file of kept objects takes ahead of its writes: [`STEP`]
/// bytes at a time (`fallocate`), past the end written so far.
///
/// Why: a write that extends a file on ext4 (delayed allocation) reserves
/// and maps every block it lands on; into space allocated already it does
/// not. A worker appends each image it fetches to its file (~50 KB a
/// write): 600 MB written that way took 0.155 s of CPU instead of
/// 0.208 s (this machine, ext4). At most one step (32 MiB) beyond what a
/// file holds is taken and not used.
///
/// Not on tmpfs (an `emptyDir` in memory), where allocating is zeroing
/// pages the writes then overwrite; nor once the filesystem refuses (no
/// space, no `fallocate`): the writes then extend the file themselves.
#[derive(Debug)]
pub(crate) struct Room {
    /// How far the file is allocated; None when nothing is taken ahead.
    until: Mutex<Option<u64>>,
}

/// Bytes a [`Room`] allocates at a time.
const STEP: u64 = 32 << 20;

impl Room {
    /// The room of `file`, empty (and written past) so far.
    pub(crate) fn of(file: &File) -> Self {
        let tmpfs = fstatfs(file).map_or(true, |fs| fs.filesystem_type() == TMPFS_MAGIC);
        Self { until: Mutex::new((!tmpfs).then_some(0)) }
    }

    /// Makes sure `file` is allocated up to `end` before bytes are written
    /// there.
    pub(crate) fn make(&self, file: &File, end: u64) {
        let mut until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        let Some(at) = *until else { return };
        if end <= at {
            return;
        }
        let len = (end - at).max(STEP);
        let allocated = i64::try_from(at).ok().zip(i64::try_from(len).ok()).map(|(at, len)| fallocate(file, FallocateFlags::empty(), at, len));
        *until = match allocated {
            Some(Ok(())) => Some(at + len),
            _ => None,
        };
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileExt, MetadataExt};

    use super::*;

    #[test]
    fn a_file_is_allocated_a_step_ahead_of_its_writes_and_keeps_their_bytes() {
        let file = tempfile::tempfile().expect("file");
        let room = Room::of(&file);
        let Some(0) = *room.until.lock().expect("lock") else {
            // A temporary directory on tmpfs: nothing is taken ahead there.
            return;
        };
        room.make(&file, 100);
        file.write_all_at(b"kept", 96).expect("write");
        assert_eq!(*room.until.lock().expect("lock"), Some(STEP));
        assert_eq!(file.metadata().expect("meta").len(), STEP, "allocated a step ahead");
        assert!(file.metadata().expect("meta").blocks() * 512 >= STEP);
        room.make(&file, STEP + 1);
        assert_eq!(*room.until.lock().expect("lock"), Some(2 * STEP), "the next step");
        let mut read = [0u8; 4];
        file.read_exact_at(&mut read, 96).expect("read");
        assert_eq!(&read, b"kept");
    }
}
