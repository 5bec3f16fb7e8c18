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
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

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
