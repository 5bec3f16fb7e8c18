//! A sample cache that the workers of one node share by name: the workers
//! started on their own with `--cache-shared`, which inherit no cache from
//! a trainer.
//!
//! Each job's cache is a file `loader-frames-<name>` in the directory the
//! workers were given (`--cache-dir`), where the name is derived from the
//! job's spec. The first worker to need it makes it complete as an unnamed
//! file and then links it under its name (`linkat`). Another worker
//! therefore never finds a half-made cache, and two that race keep the
//! first one linked. Every worker that uses the file holds a shared
//! `flock` on it, which the kernel drops when the worker dies. The last
//! worker to let go (it alone can take the lock exclusively) unlinks the
//! file, so it goes when its job's dataset closes on the node.
//!
//! A file nobody holds is a leftover of workers that were killed. A worker
//! that comes across one unlinks it and makes the cache afresh: when its
//! job starts, and for every such file in the directory when it starts.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, Flock, FlockArg};
use nix::unistd::linkat;

use super::{CacheError, SampleCache};

/// The names of such files start with this.
pub const PREFIX: &str = "loader-frames-";
/// Tries to open or make the file before giving up. Each retry means
/// another worker linked, or unlinked, the name in between.
const ATTEMPTS: usize = 8;

/// This worker's hold on a node's cache file. When it drops, the file is
/// unlinked if no other worker holds it.
#[derive(Debug)]
pub struct NodeHold {
    /// Always Some until dropped.
    lock: Option<Flock<File>>,
    path: PathBuf,
}

impl Drop for NodeHold {
    fn drop(&mut self) {
        // Let go first, then try for it alone: of several workers letting
        // go at once, the last to try finds nobody else and unlinks it
        // (trying while still holding it, each could see the other and
        // none would). Exclusive only if nobody else holds it; a worker
        // that opened the name but has not locked it yet checks afterwards
        // that the name is still this file, and retries if it is not.
        let Some(Ok(file)) = self.lock.take().map(Flock::unlock) else { return };
        if let Ok(alone) = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            && same_file(&alone, &self.path)
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The cache called `name` in `dir`, made for `entries` indexes and
/// `capacity` bytes if no live worker has it. Err when the directory
/// cannot be used, or when the file found is a cache of another size.
pub fn open_or_make(dir: &Path, name: &str, entries: u64, capacity: u64) -> Result<(SampleCache, NodeHold), CacheError> {
    let path = dir.join(format!("{PREFIX}{name}"));
    for _ in 0..ATTEMPTS {
        match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => {
                if let Some(found) = hold(file, &path, entries)? {
                    return Ok(found);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(made) = make(dir, &path, entries, capacity)? {
                    return Ok(made);
                }
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display())).into()),
        }
    }
    Err(io::Error::other(format!("{}: other workers kept linking and unlinking it", path.display())).into())
}

/// Holds the file found at `path`: None when it went meanwhile, or was a
/// leftover (unlinked here): try again.
fn hold(file: File, path: &Path, entries: u64) -> Result<Option<(SampleCache, NodeHold)>, CacheError> {
    let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        // Nobody holds it: left by workers that were killed. Its bytes may
        // be of files changed since; make it again.
        Ok(lock) => {
            if same_file(&lock, path) {
                let _ = std::fs::remove_file(path);
            }
            return Ok(None);
        }
        Err((file, Errno::EWOULDBLOCK)) => {
            Flock::lock(file, FlockArg::LockShared).map_err(|(_, e)| io::Error::from(e))?
        }
        Err((_, e)) => return Err(io::Error::from(e).into()),
    };
    if !same_file(&lock, path) {
        // Unlinked by its last holder between the open and the lock.
        return Ok(None);
    }
    let cache = SampleCache::open(lock.try_clone()?, entries)?;
    Ok(Some((cache, NodeHold { lock: Some(lock), path: path.to_owned() })))
}

/// Makes the cache as an unnamed file in `dir` and links it at `path`:
/// None when another worker linked one first (use that one).
fn make(dir: &Path, path: &Path, entries: u64, capacity: u64) -> Result<Option<(SampleCache, NodeHold)>, CacheError> {
    let cache = SampleCache::create(entries, capacity, Some(dir))?;
    let lock = Flock::lock(cache.file.try_clone()?, FlockArg::LockShared).map_err(|(_, e)| io::Error::from(e))?;
    let unnamed = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&*lock));
    match linkat(AT_FDCWD, unnamed.as_str(), AT_FDCWD, path, AtFlags::AT_SYMLINK_FOLLOW) {
        Ok(()) => Ok(Some((cache, NodeHold { lock: Some(lock), path: path.to_owned() }))),
        Err(Errno::EEXIST) => Ok(None),
        Err(e) => Err(io::Error::new(io::Error::from(e).kind(), format!("{}: {e}", path.display())).into()),
    }
}

/// Whether `path` names the file `file` is open on.
fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Unlinks the caches in `dir` that no worker holds (left by workers that
/// were killed); how many. A worker started with `--cache-shared` calls it
/// before it registers.
pub fn sweep(dir: &Path) -> io::Result<usize> {
    let mut swept = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let path = entry.path();
        let Ok(file) = OpenOptions::new().read(true).open(&path) else { continue };
        if let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            && same_file(&lock, &path)
            && std::fs::remove_file(&path).is_ok()
        {
            swept += 1;
        }
    }
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_share_one_file_and_the_last_to_let_go_unlinks_it() {
        let dir = tempfile::tempdir().expect("dir");
        let (a, hold_a) = open_or_make(dir.path(), "job", 8, 1 << 20).expect("made");
        let path = dir.path().join(format!("{PREFIX}job"));
        assert!(path.exists());
        assert!(matches!(a.put(3, &[b"frame".as_slice()]), crate::sample_cache::Put::Stored));
        let (b, hold_b) = open_or_make(dir.path(), "job", 8, 1 << 20).expect("found");
        assert_eq!(b.get(3), Some(&b"frame"[..]), "the second holder reads what the first stored");
        // Another size under the same name is an error, not a wrong read.
        assert!(open_or_make(dir.path(), "job", 16, 1 << 20).is_err());
        // Nothing to sweep while it is held.
        assert_eq!(sweep(dir.path()).expect("sweep"), 0);
        drop(hold_a);
        assert!(path.exists(), "still held by the second");
        drop(hold_b);
        assert!(!path.exists(), "the last holder unlinks it");
        // Holders that let go in either order: the file goes too.
        let (c, hold_c) = open_or_make(dir.path(), "job", 8, 1 << 20).expect("made");
        let (d, hold_d) = open_or_make(dir.path(), "job", 8, 1 << 20).expect("found");
        drop(hold_d);
        drop(hold_c);
        assert!(!path.exists());
        drop((c, d));
        drop((a, b));
    }

    #[test]
    fn a_file_nobody_holds_is_made_again_and_swept() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join(format!("{PREFIX}job"));
        // A leftover: the cache of killed workers (linked, held by
        // nobody), with an entry in it.
        {
            let left = SampleCache::create(8, 1 << 20, Some(dir.path())).expect("create");
            assert!(matches!(left.put(1, &[b"old".as_slice()]), crate::sample_cache::Put::Stored));
            let unnamed = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&left.file));
            linkat(AT_FDCWD, unnamed.as_str(), AT_FDCWD, &path, AtFlags::AT_SYMLINK_FOLLOW).expect("link");
        }
        assert!(path.exists());
        let (fresh, _hold) = open_or_make(dir.path(), "job", 8, 1 << 20).expect("made again");
        assert_eq!(fresh.get(1), None, "a leftover's entries are not read");
        drop((fresh, _hold));
        std::fs::write(dir.path().join(format!("{PREFIX}other")), b"left").expect("write");
        std::fs::write(dir.path().join("not-ours"), b"x").expect("write");
        assert_eq!(sweep(dir.path()).expect("sweep"), 1);
        assert!(dir.path().join("not-ours").exists());
    }
}
