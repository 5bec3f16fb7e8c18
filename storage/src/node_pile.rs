//! [`NodePile`]: a folder's small objects kept on local disk for every
//! worker of a node, not one each.
//!
//! A shuffled epoch gives each worker a random part of a folder's images.
//! With a pile per worker, a worker's second epoch finds only the images
//! it fetched itself (half of them with two workers) and fetches the rest
//! again. Workers started with a shared local copy (`--storage-cache-shared`)
//! on one node keep them in one directory instead: any worker reads what
//! any other fetched.
//!
//! The directory holds one pack per worker (`pack-<id>`: the objects it
//! fetched, appended) and one `index` that every worker appends a record
//! to for each object it kept: the object's name (a 128-bit hash of its
//! URL and ETag, so that an object replaced in the store is another
//! object), its pack, offset and length, and a check. A worker writes the
//! bytes into its pack before it appends their record, so a record that a
//! reader finds names bytes that are there. A file per object would cost
//! an inode per image: creating them took a fifth of a worker's CPU in
//! epoch 1 (ext4 looking for free inodes).
//!
//! The directory lives while a worker uses it. Each holds a shared `flock`
//! on a file beside it, which the kernel drops when the worker dies; the
//! last to let go (it alone can take the lock exclusively) removes both.
//! A directory whose workers were all killed is removed by the next worker
//! started with a shared local copy in that directory ([`sweep_leftovers`]).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock};

use bytes::Bytes;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::local_copy::{self, Room};

/// The names of such directories (and their lock files) start with this.
pub(crate) const PREFIX: &str = "loader-objects-";
/// Tries to hold a directory before giving up: each retry means another
/// worker removed it in between.
const ATTEMPTS: usize = 8;
/// Bytes of one index record.
const RECORD: usize = 48;
/// Marks a record (`LOBJ`).
const MAGIC: u32 = 0x4c4f_424a;

/// Where an object's bytes sit: its pack, offset and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place {
    pack: u64,
    offset: u64,
    len: u64,
}

/// The index as this worker has read it so far, and the packs it opened.
#[derive(Debug, Default)]
struct Known {
    places: HashMap<u128, Place>,
    /// Index bytes read: whole records only.
    read_to: u64,
    /// A record failed its check (a write cut short by a full disk):
    /// what follows is not read.
    broken: bool,
    packs: HashMap<u64, Arc<File>>,
}

/// One folder's objects on this node's disk, held by this worker.
#[derive(Debug)]
pub(crate) struct NodePile {
    dir: PathBuf,
    /// The lock file's path, and this worker's shared lock on it (Some
    /// until dropped).
    hold_path: PathBuf,
    hold: Option<Flock<File>>,
    /// The index, opened to append.
    index: File,
    known: Mutex<Known>,
    /// This worker's pack (made at its first object), its id and disk
    /// space; None inside when it cannot be made.
    pack: OnceLock<Option<(u64, Arc<File>, Room)>>,
    /// Its end: where the next object goes.
    end: AtomicU64,
    /// Bytes this worker's pack took (its end), taken from its budget.
    written: AtomicU64,
}

impl NodePile {
    /// The pile of the folder `folder` (any text naming it and its version)
    /// in `root`; None when the directory cannot be used (objects are then
    /// kept by this worker alone).
    pub(crate) fn open(root: &Path, folder: &str) -> Option<Self> {
        sweep_once(root);
        let name = format!("{PREFIX}{:032x}", hash(folder));
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
            let index = std::fs::create_dir_all(&dir)
                .and_then(|()| OpenOptions::new().read(true).append(true).create(true).open(dir.join("index")));
            let index = match index {
                Ok(index) => index,
                Err(e) => return unusable(&dir, &e.to_string()),
            };
            return Some(Self {
                dir,
                hold_path,
                hold: Some(lock),
                index,
                known: Mutex::default(),
                pack: OnceLock::new(),
                end: AtomicU64::new(0),
                written: AtomicU64::new(0),
            });
        }
        unusable(&hold_path, "other workers kept removing it")
    }

    /// The directory this worker holds.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads the records other workers appended since the last look: once
    /// per batch, before its objects are looked up.
    pub(crate) fn refresh(&self) {
        let mut known = self.known();
        let mut buf = vec![0u8; RECORD * 1024];
        while !known.broken {
            let Ok(n) = self.index.read_at(&mut buf, known.read_to) else { break };
            let whole = n - n % RECORD;
            if whole == 0 {
                break;
            }
            for record in buf[..whole].chunks_exact(RECORD) {
                match parse(record) {
                    Some((name, place)) => {
                        known.places.entry(name).or_insert(place);
                    }
                    None => {
                        known.broken = true;
                        break;
                    }
                }
                known.read_to += RECORD as u64;
            }
        }
    }

    /// Whether a worker of this node kept the object named `key` (the
    /// [`hash`] of its URL and ETag), as of the last
    /// [`refresh`](Self::refresh).
    pub(crate) fn holds(&self, key: u128) -> bool {
        self.known().places.contains_key(&key)
    }

    /// The bytes of the object named `key`, if a worker of
    /// this node kept them (as of the last [`refresh`](Self::refresh)).
    pub(crate) fn read(&self, key: u128) -> Option<Bytes> {
        let (place, pack) = {
            let mut known = self.known();
            let place = *known.places.get(&key)?;
            let pack = match known.packs.get(&place.pack) {
                Some(pack) => Arc::clone(pack),
                None => {
                    let pack = Arc::new(File::open(self.dir.join(pack_name(place.pack))).ok()?);
                    known.packs.insert(place.pack, Arc::clone(&pack));
                    pack
                }
            };
            (place, pack)
        };
        let mut bytes = vec![0; usize::try_from(place.len).ok()?];
        // A pack shorter than its record says is a miss: fetched again.
        pack.read_exact_at(&mut bytes, place.offset).ok()?;
        Some(Bytes::from(bytes))
    }

    /// Keeps `bytes` as the object named `key`'s, if the budget allows and no
    /// worker kept them already (as far as this one knows).
    pub(crate) fn keep(&self, key: u128, bytes: &Bytes) {
        let len = bytes.len() as u64;
        if self.known().places.contains_key(&key) || !local_copy::reserve(len) {
            return;
        }
        let Some((id, pack, room)) = self.pack.get_or_init(|| self.make_pack()) else {
            local_copy::release(len);
            return;
        };
        let offset = self.end.fetch_add(len, Ordering::AcqRel);
        // Paid for whether or not the write succeeds: the pack's end moved
        // past its bytes (a write cut short by a full disk took some).
        self.written.fetch_add(len, Ordering::AcqRel);
        room.make(pack, offset + len);
        let place = Place { pack: *id, offset, len };
        // The bytes first, then their record: a record names bytes that
        // are there.
        let written = pack.write_all_at(bytes, offset).and_then(|()| {
            let record = record(key, place);
            // One write of a whole record (the index is opened to append):
            // records of several workers never interleave.
            match (&self.index).write(&record)? {
                RECORD => Ok(()),
                n => Err(std::io::Error::other(format!("{n} of {RECORD} bytes of a record written"))),
            }
        });
        match written {
            Ok(()) => {
                self.known().places.entry(key).or_insert(place);
            }
            Err(e) => tracing::debug!("object {key:032x} not kept on the node's disk: {e}"),
        }
    }

    /// This worker's pack: a new file of a name no other worker has.
    fn make_pack(&self) -> Option<(u64, Arc<File>, Room)> {
        for _ in 0..ATTEMPTS {
            let id = (u64::from(std::process::id()) << 32) | u64::from(rand_u32());
            match OpenOptions::new().read(true).write(true).create_new(true).open(self.dir.join(pack_name(id))) {
                Ok(file) => {
                    let room = Room::of(&file);
                    return Some((id, Arc::new(file), room));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    tracing::debug!("objects are not kept on the node's disk: cannot make a pack in {}: {e}", self.dir.display());
                    return None;
                }
            }
        }
        None
    }

    fn known(&self) -> MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
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

/// Removes the piles that no worker holds from the local copy's directory,
/// when it is shared: a worker calls it as it starts, so that what killed
/// workers left is not kept until a job needs the directory.
pub fn sweep_leftovers() {
    if let Some(root) = local_copy::shared_dir() {
        sweep_once(root);
    }
}

/// Removes, once per process, the piles in `root` that no worker holds
/// (left by workers that were all killed): when a worker with a shared
/// local copy starts, and before its first pile.
fn sweep_once(root: &Path) {
    static SWEPT: Once = Once::new();
    SWEPT.call_once(|| sweep(root));
}

/// Removes the piles in `root` that no worker holds.
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

/// A 128-bit name for `text` (two FNV-1a hashes): no two of a folder's
/// million objects share one.
pub(crate) fn hash(text: &str) -> u128 {
    let mut h = Hasher::default();
    h.add(text);
    h.finish()
}

/// [`hash`] of text written in pieces (`write!`), so that an object's key
/// (its URL and ETag) is named without first being made a `String`: a
/// worker names each object of five batches for every batch it makes.
pub(crate) struct Hasher(u64, u64);

impl Default for Hasher {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325, 0x6c62_272e_07bb_0142)
    }
}

impl Hasher {
    fn add(&mut self, text: &str) {
        let step = |h: u64, b: u8| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        for b in text.bytes() {
            self.0 = step(self.0, b);
            self.1 = step(self.1, b);
        }
    }

    pub(crate) fn finish(&self) -> u128 {
        (u128::from(self.0) << 64) | u128::from(self.1)
    }
}

impl std::fmt::Write for Hasher {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.add(s);
        Ok(())
    }
}

fn pack_name(id: u64) -> String {
    format!("pack-{id:016x}")
}

/// A few random bits for a pack's name (two workers of one pid, in turn).
fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now()) as u32
}

/// The check of a record's other bytes.
fn check(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193))
}

/// The index record of object `name` at `place`: magic, check, name,
/// pack, offset, length (little-endian).
fn record(name: u128, place: Place) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    r[8..24].copy_from_slice(&name.to_le_bytes());
    r[24..32].copy_from_slice(&place.pack.to_le_bytes());
    r[32..40].copy_from_slice(&place.offset.to_le_bytes());
    r[40..48].copy_from_slice(&place.len.to_le_bytes());
    let sum = check(&r[8..]);
    r[4..8].copy_from_slice(&sum.to_le_bytes());
    r
}

/// A record's name and place; None when it is not a whole record.
fn parse(r: &[u8]) -> Option<(u128, Place)> {
    let u32_at = |i: usize| Some(u32::from_le_bytes(r.get(i..i + 4)?.try_into().ok()?));
    let u64_at = |i: usize| Some(u64::from_le_bytes(r.get(i..i + 8)?.try_into().ok()?));
    if r.len() != RECORD || u32_at(0)? != MAGIC || u32_at(4)? != check(&r[8..]) {
        return None;
    }
    let name = u128::from_le_bytes(r[8..24].try_into().ok()?);
    Some((name, Place { pack: u64_at(24)?, offset: u64_at(32)?, len: u64_at(40)? }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const X1: &str = "s3://b/train/x.jpg \"e1\"";

    #[test]
    fn workers_of_a_node_share_a_folders_objects_and_the_last_removes_them() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = NodePile::open(root.path(), "s3://b/train 1").expect("a");
        let b = NodePile::open(root.path(), "s3://b/train 1").expect("b");
        a.keep(hash(X1), &Bytes::from_static(b"jpeg"));
        a.keep(hash("s3://b/train/y.jpg \"e1\""), &Bytes::from_static(b"second"));
        assert!(!b.holds(hash(X1)), "b has not looked yet");
        b.refresh();
        assert!(b.holds(hash(X1)));
        assert_eq!(b.read(hash(X1)).as_deref(), Some(&b"jpeg"[..]), "b reads what a kept");
        assert_eq!(b.read(hash("s3://b/train/y.jpg \"e1\"")).as_deref(), Some(&b"second"[..]));
        assert_eq!(b.read(hash("s3://b/train/x.jpg \"e2\"")), None, "another version is another object");
        // b keeping the same object again changes nothing.
        b.keep(hash(X1), &Bytes::from_static(b"JPEG"));
        a.refresh();
        assert_eq!(a.read(hash(X1)).as_deref(), Some(&b"jpeg"[..]));
        // What b keeps, a reads.
        b.keep(hash("s3://b/train/z.jpg \"e1\""), &Bytes::from_static(b"third"));
        a.refresh();
        assert_eq!(a.read(hash("s3://b/train/z.jpg \"e1\"")).as_deref(), Some(&b"third"[..]));
        let dir = a.dir.clone();
        drop(a);
        assert!(dir.exists(), "b still holds it");
        drop(b);
        assert!(!dir.exists(), "the last worker removed it");
        assert_eq!(std::fs::read_dir(root.path()).expect("root").count(), 0, "and its lock file");
    }

    #[test]
    fn a_broken_record_ends_the_index_and_a_short_pack_is_a_miss() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = NodePile::open(root.path(), "s3://b/train 1").expect("a");
        a.keep(hash(X1), &Bytes::from_static(b"jpeg"));
        // A record cut short (a full disk), then a whole one after it.
        (&a.index).write_all(&[0xff; 20]).expect("garbage");
        (&a.index).write_all(&record(hash("s3://b/later"), Place { pack: 1, offset: 0, len: 1 })).expect("record");
        let b = NodePile::open(root.path(), "s3://b/train 1").expect("b");
        b.refresh();
        assert!(b.holds(hash(X1)), "records before it are read");
        assert!(!b.holds(hash("s3://b/later")), "nothing after it");
        // A record whose bytes are not in the pack reads as a miss.
        let c = NodePile::open(root.path(), "s3://b/other 1").expect("c");
        (&c.index).write_all(&record(hash("s3://b/k"), Place { pack: 7, offset: 0, len: 10 })).expect("record");
        std::fs::write(c.dir.join(pack_name(7)), b"short").expect("pack");
        c.refresh();
        assert!(c.holds(hash("s3://b/k")));
        assert_eq!(c.read(hash("s3://b/k")), None);
    }

    #[test]
    fn a_pile_nobody_holds_is_swept_when_a_worker_opens_another() {
        let root = tempfile::tempdir().expect("tempdir");
        // Left by killed workers: a directory and a lock file nobody holds.
        let name = format!("{PREFIX}{:032x}", hash("s3://b/old 1"));
        std::fs::create_dir(root.path().join(&name)).expect("dir");
        std::fs::write(root.path().join(&name).join("index"), b"x").expect("index");
        std::fs::write(root.path().join(format!("{name}.hold")), b"").expect("hold");
        sweep(root.path());
        assert_eq!(std::fs::read_dir(root.path()).expect("root").count(), 0, "swept");
    }

    #[test]
    fn records_round_trip_and_names_differ_by_url_and_etag() {
        assert_ne!(hash("s3://b/k \"1\""), hash("s3://b/k \"2\""));
        let place = Place { pack: 3, offset: 1 << 40, len: 12345 };
        let r = record(hash("s3://b/k"), place);
        assert_eq!(parse(&r), Some((hash("s3://b/k"), place)));
        let mut bad = r;
        bad[30] ^= 1;
        assert_eq!(parse(&bad), None, "a changed byte fails the check");
        assert_eq!(parse(&r[..40]), None);
    }
}
