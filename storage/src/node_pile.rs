//! [`NodePile`]: a folder's small objects kept on local disk for every
//! worker of a node, not one each.
//!
//! A shuffled epoch gives each worker a random part of a folder's images.
//! With a pile per worker, a worker's second epoch finds only the images
//! it fetched itself (half of them with two workers) and fetches the rest
//! again. Workers started with a shared local copy (`--storage-cache-shared`)
//! on one node keep them in one directory instead, one file per object,
//! named by a hash of its URL and ETag: any worker reads what any other
//! fetched, and an object replaced in the store has another name.
//!
//! A file is written whole under a temporary name and then linked under
//! its own (`persist_noclobber`): a reader never sees half an object, and
//! of two workers that fetched the same object, the first link wins.
//!
//! The directory lives while a worker uses it. Each holds a shared `flock`
//! on a file beside it, which the kernel drops when the worker dies; the
//! last to let go (it alone can take the lock exclusively) removes both.
//! A directory whose workers were all killed is reused by the next worker
//! that reads the same folder (its files are whole and named by version),
//! and removed when a worker opens another folder's pile and finds nobody
//! holding it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::local_copy;

/// The names of such directories (and their lock files) start with this.
pub(crate) const PREFIX: &str = "loader-objects-";
/// Tries to hold a directory before giving up: each retry means another
/// worker removed it in between.
const ATTEMPTS: usize = 8;

/// One folder's objects on this node's disk, held by this worker.
#[derive(Debug)]
pub(crate) struct NodePile {
    dir: PathBuf,
    /// The lock file's path, and this worker's shared lock on it (Some
    /// until dropped).
    hold_path: PathBuf,
    hold: Option<Flock<File>>,
    /// Bytes this worker wrote, taken from its budget.
    written: AtomicU64,
}

impl NodePile {
    /// The pile of the folder `folder` (any text naming it and its version)
    /// in `root`; None when the directory cannot be used (objects are then
    /// kept by this worker alone).
    pub(crate) fn open(root: &Path, folder: &str) -> Option<Self> {
        static SWEPT: Once = Once::new();
        SWEPT.call_once(|| sweep(root));
        let name = format!("{PREFIX}{}", hash_name(folder));
        let (dir, hold_path) = (root.join(&name), root.join(format!("{name}.hold")));
        for _ in 0..ATTEMPTS {
            let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&hold_path);
            let file = match file {
                Ok(f) => f,
                Err(e) => return unusable(&hold_path, &e.to_string()),
            };
            let lock = match Flock::lock(file, FlockArg::LockShared) {
                Ok(lock) => lock,
                Err((_, e)) => return unusable(&hold_path, &e.to_string()),
            };
            if !same_file(&lock, &hold_path) {
                // Its last holder removed it between the open and the lock.
                continue;
            }
            if let Err(e) = std::fs::create_dir_all(&dir) {
                return unusable(&dir, &e.to_string());
            }
            return Some(Self { dir, hold_path, hold: Some(lock), written: AtomicU64::new(0) });
        }
        unusable(&hold_path, "other workers kept removing it")
    }

    /// The bytes of the object `name` (its URL and ETag), if a worker of
    /// this node kept them.
    pub(crate) fn read(&self, name: &str) -> Option<Bytes> {
        std::fs::read(self.dir.join(hash_name(name))).ok().map(Bytes::from)
    }

    /// Whether a worker of this node kept the object `name`.
    pub(crate) fn holds(&self, name: &str) -> bool {
        self.dir.join(hash_name(name)).exists()
    }

    /// Keeps `bytes` as the object `name`'s, if the budget allows and no
    /// worker kept them already.
    pub(crate) fn keep(&self, name: &str, bytes: &Bytes) {
        let path = self.dir.join(hash_name(name));
        let len = bytes.len() as u64;
        if path.exists() || !local_copy::reserve(len) {
            return;
        }
        let written = tempfile::NamedTempFile::new_in(&self.dir)
            .and_then(|mut f| f.write_all(bytes).map(|()| f))
            .map_err(|e| e.to_string())
            .and_then(|f| f.persist_noclobber(&path).map_err(|e| e.error.to_string()));
        match written {
            Ok(_) => {
                self.written.fetch_add(len, Ordering::AcqRel);
            }
            Err(e) => {
                // Another worker linked it first, or the disk is full.
                local_copy::release(len);
                tracing::debug!("{name} not kept on the node's disk: {e}");
            }
        }
    }
}

impl Drop for NodePile {
    fn drop(&mut self) {
        local_copy::release(self.written.load(Ordering::Acquire));
        // Let go first, then try for it alone: of several workers letting
        // go at once, the last to try finds nobody else and removes it.
        let Some(Ok(file)) = self.hold.take().map(Flock::unlock) else { return };
        if let Ok(alone) = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            && same_file(&alone, &self.hold_path)
        {
            // The directory before its lock file: a worker that finds the
            // lock file afterwards makes a new one, and a new directory.
            let _ = std::fs::remove_dir_all(&self.dir);
            let _ = std::fs::remove_file(&self.hold_path);
        }
    }
}

/// Removes the piles in `root` that no worker holds (left by workers that
/// were killed).
fn sweep(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(dir) = file_name.strip_prefix(PREFIX).and_then(|n| n.strip_suffix(".hold")) else { continue };
        let hold_path = entry.path();
        let Ok(file) = OpenOptions::new().read(true).open(&hold_path) else { continue };
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(alone) if same_file(&alone, &hold_path) => {
                let _ = std::fs::remove_dir_all(root.join(format!("{PREFIX}{dir}")));
                let _ = std::fs::remove_file(&hold_path);
            }
            Ok(_) | Err((_, Errno::EWOULDBLOCK)) | Err(_) => {}
        }
    }
}

fn unusable(path: &Path, why: &str) -> Option<NodePile> {
    static SAID: Once = Once::new();
    SAID.call_once(|| tracing::warn!("objects are kept per worker, not per node: cannot use {}: {why}", path.display()));
    None
}

/// Whether `file` is the file at `path` now.
fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// A file name for `text`: 128 bits of two FNV-1a hashes, so that no two
/// of a folder's million objects share one.
fn hash_name(text: &str) -> String {
    let fnv = |offset: u64| {
        text.bytes().fold(offset, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
    };
    format!("{:016x}{:016x}", fnv(0xcbf2_9ce4_8422_2325), fnv(0x6c62_272e_07bb_0142))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_of_a_node_share_a_folders_objects_and_the_last_removes_them() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = NodePile::open(root.path(), "s3://b/train 1").expect("a");
        let b = NodePile::open(root.path(), "s3://b/train 1").expect("b");
        a.keep("s3://b/train/x.jpg \"e1\"", &Bytes::from_static(b"jpeg"));
        assert_eq!(b.read("s3://b/train/x.jpg \"e1\"").as_deref(), Some(&b"jpeg"[..]), "b reads what a kept");
        assert_eq!(b.read("s3://b/train/x.jpg \"e2\""), None, "another version is another object");
        // b keeping the same object again changes nothing.
        b.keep("s3://b/train/x.jpg \"e1\"", &Bytes::from_static(b"JPEG"));
        assert_eq!(a.read("s3://b/train/x.jpg \"e1\"").as_deref(), Some(&b"jpeg"[..]));
        let dir = a.dir.clone();
        drop(a);
        assert!(dir.exists(), "b still holds it");
        drop(b);
        assert!(!dir.exists(), "the last worker removed it");
        assert_eq!(std::fs::read_dir(root.path()).expect("root").count(), 0, "and its lock file");
    }

    #[test]
    fn a_pile_nobody_holds_is_swept_when_a_worker_opens_another() {
        let root = tempfile::tempdir().expect("tempdir");
        // Left by killed workers: a directory and a lock file nobody holds.
        let name = format!("{PREFIX}{}", hash_name("s3://b/old 1"));
        std::fs::create_dir(root.path().join(&name)).expect("dir");
        std::fs::write(root.path().join(&name).join("x"), b"x").expect("object");
        std::fs::write(root.path().join(format!("{name}.hold")), b"").expect("hold");
        sweep(root.path());
        assert_eq!(std::fs::read_dir(root.path()).expect("root").count(), 0, "swept");
    }

    #[test]
    fn names_differ_by_url_and_etag() {
        assert_ne!(hash_name("s3://b/k \"1\""), hash_name("s3://b/k \"2\""));
        assert_eq!(hash_name("s3://b/k"), hash_name("s3://b/k"));
        assert_eq!(hash_name("").len(), 32);
    }
}
