//! [`NodeChunks`]: a large object's chunks kept on local disk for every
//! worker of a node, each fetched from the store once.
//!
//! A shuffled epoch over a token file sends every worker to nearly every
//! chunk of it (a batch of 64 windows touches up to 64 chunks). With a
//! local copy per worker, N workers on one machine fetch the file N times
//! over the same link: two workers read a 1 Gbit/s link's worth of tokens
//! at half its rate. Workers with a shared local copy
//! (`--storage-cache-shared`, on for the workers a trainer starts) keep an
//! object's chunks in one file instead, in the object's directory of the
//! node (held and removed as [`NodePile`]'s are), and fetch each chunk once
//! between them:
//!
//! - `chunks`: the object's bytes at their own offsets, sparse, mapped by
//!   every worker;
//! - `chunks.state`: one byte per chunk, 0 until the chunk's bytes are
//!   written whole, then 1 (set with release ordering after the write, read
//!   with acquire ordering before the read);
//! - a worker fetches a chunk holding an open-file-description lock on its
//!   byte of `chunks.state`; another worker that wants it polls the lock
//!   (backing off to 20 ms) and then finds it there. The kernel drops the lock of a worker that
//!   dies, so the next one fetches the chunk itself: a chunk whose byte is
//!   0 is never read, whatever a dead writer left in it.
//!
//! The file's name holds the object's URL, ETag and size, so it is never
//! resized, and an object replaced in the store is another file.

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use memmap2::{Mmap, MmapMut};
use nix::fcntl::{FcntlArg, fcntl};

use crate::node_pile::NodePile;

/// The byte of a chunk whose bytes are in `chunks` whole.
const HERE: u8 = 1;

/// One object's chunks on this node's disk, held by this worker.
#[derive(Debug)]
pub(crate) struct NodeChunks {
    /// Holds the object's directory while this worker uses it.
    _pile: NodePile,
    data: File,
    map: Mmap,
    /// `chunks.state`, opened by this worker: its locks are this worker's.
    state_file: Arc<File>,
    state: MmapMut,
}

/// A worker's claim on one chunk: the lock on its byte, let go when
/// dropped.
#[derive(Debug)]
pub(crate) struct Claim {
    state_file: Arc<File>,
    index: u64,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let _ = lock(&self.state_file, self.index, nix::libc::F_UNLCK as i16, false);
    }
}

impl NodeChunks {
    /// The chunks of the object `key` (its URL, ETag and size as text) of
    /// `size` bytes in `chunks` chunks, in `root`; None when they cannot be
    /// kept there (the worker then keeps its own).
    pub(crate) fn open(root: &Path, key: &str, size: u64, chunks: u64) -> Option<Self> {
        let pile = NodePile::open(root, &format!("chunks {key}"))?;
        let opened = (|| -> std::io::Result<Self> {
            let file = |name: &str| OpenOptions::new().read(true).write(true).create(true).truncate(false).open(pile.dir().join(name));
            let (data, state_file) = (file("chunks")?, file("chunks.state")?);
            // Every worker sets the same lengths (the name fixes the size):
            // a file is never shortened.
            data.set_len(size)?;
            state_file.set_len(chunks)?;
            // SAFETY: `chunks` is only written at chunks whose state byte is
            // 0, by the worker holding that byte's lock, and read through
            // this mapping only at chunks whose byte is `HERE`, set after
            // the write completed; its length never changes (above), so no
            // read faults past its end or sees a write in progress.
            let map = unsafe { Mmap::map(&data)? };
            // SAFETY: `chunks.state` is touched only through atomic
            // accesses to its bytes (`state`), by every worker alike; its
            // length never changes.
            let state = unsafe { MmapMut::map_mut(&state_file)? };
            Ok(Self { _pile: pile, data, map, state_file: Arc::new(state_file), state })
        })();
        match opened {
            Ok(chunks) => Some(chunks),
            Err(e) => {
                tracing::debug!("an object's chunks are not kept for the node's workers: {e}");
                None
            }
        }
    }

    fn state(&self, index: u64) -> Option<&AtomicU8> {
        let i = usize::try_from(index).ok().filter(|&i| i < self.state.len())?;
        // SAFETY: `i` is within the mapping, which lives as long as `self`;
        // `AtomicU8` has the layout of `u8`, and every access to these
        // bytes, in any worker, is atomic.
        Some(unsafe { &*self.state.as_ptr().add(i).cast::<AtomicU8>() })
    }

    /// Whether chunk `index`'s bytes are in the file whole.
    pub(crate) fn is_here(&self, index: u64) -> bool {
        self.state(index).is_some_and(|s| s.load(Ordering::Acquire) == HERE)
    }

    /// Claims chunk `index`; None while another worker holds it (it is
    /// fetching it).
    pub(crate) fn try_claim(&self, index: u64) -> std::io::Result<Option<Claim>> {
        match lock(&self.state_file, index, nix::libc::F_WRLCK as i16, false) {
            Ok(()) => Ok(Some(Claim { state_file: Arc::clone(&self.state_file), index })),
            Err(e) if matches!(e.raw_os_error(), Some(nix::libc::EAGAIN | nix::libc::EACCES)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Claims chunk `index`, waiting while another worker holds it. Blocks.
    #[cfg(test)]
    fn claim(&self, index: u64) -> std::io::Result<Claim> {
        lock(&self.state_file, index, nix::libc::F_WRLCK as i16, true)?;
        Ok(Claim { state_file: Arc::clone(&self.state_file), index })
    }

    /// Writes chunk `index`'s bytes at `offset` under its claim and marks
    /// it here for every worker.
    pub(crate) fn put(&self, claim: Claim, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;

        self.data.write_all_at(bytes, offset)?;
        if let Some(state) = self.state(claim.index) {
            state.store(HERE, Ordering::Release);
        }
        drop(claim);
        Ok(())
    }

    /// The file mapped whole: read only the chunks [`is_here`](Self::is_here).
    pub(crate) fn map(&self) -> &Mmap {
        &self.map
    }
}

/// Sets (`F_WRLCK`) or clears (`F_UNLCK`) the open-file-description lock on
/// byte `index` of `file`, waiting for it when `wait`.
fn lock(file: &File, index: u64, kind: i16, wait: bool) -> std::io::Result<()> {
    let start = i64::try_from(index).map_err(std::io::Error::other)?;
    // SAFETY: `flock` is plain data; zeroed is a valid value of every field
    // (the pid must be 0 for an open-file-description lock).
    let mut flock: nix::libc::flock = unsafe { std::mem::zeroed() };
    flock.l_type = kind;
    flock.l_whence = nix::libc::SEEK_SET as i16;
    flock.l_start = start;
    flock.l_len = 1;
    loop {
        let arg = if wait { FcntlArg::F_OFD_SETLKW(&flock) } else { FcntlArg::F_OFD_SETLK(&flock) };
        match fcntl(file.as_fd(), arg) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_is_fetched_once_and_read_by_every_worker() {
        let root = tempfile::tempdir().expect("tempdir");
        // Two opens: two workers' descriptions, whose locks conflict.
        let a = NodeChunks::open(root.path(), "s3://b/t.bin \"e1\" 8", 8, 2).expect("open a");
        let b = NodeChunks::open(root.path(), "s3://b/t.bin \"e1\" 8", 8, 2).expect("open b");
        assert!(!a.is_here(0) && !b.is_here(0) && !a.is_here(2));
        let claim = a.claim(1).expect("claim");
        // b cannot take chunk 1 while a holds it, but can take chunk 0.
        assert!(b.try_claim(1).expect("try").is_none());
        drop(b.claim(0).expect("another chunk"));
        a.put(claim, 4, b"tail").expect("put");
        assert!(b.is_here(1) && !b.is_here(0));
        assert_eq!(&b.map()[4..8], b"tail");
        // The lock went with the put: b takes it at once.
        assert!(b.try_claim(1).expect("try").is_some());
    }

    #[test]
    fn a_dead_claim_leaves_the_chunk_to_the_next_worker() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = NodeChunks::open(root.path(), "k", 4, 1).expect("open a");
        let b = NodeChunks::open(root.path(), "k", 4, 1).expect("open b");
        let claim = a.claim(0).expect("claim");
        // a's writer goes away without writing: its lock with it.
        drop(claim);
        drop(a);
        let claim = b.claim(0).expect("b claims it");
        assert!(!b.is_here(0), "nothing was written");
        b.put(claim, 0, b"abcd").expect("put");
        assert_eq!(&b.map()[..], b"abcd");
    }

    #[test]
    fn another_version_is_another_file() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = NodeChunks::open(root.path(), "s3://b/t.bin \"e1\" 4", 4, 1).expect("open a");
        a.put(a.claim(0).expect("claim"), 0, b"old!").expect("put");
        let b = NodeChunks::open(root.path(), "s3://b/t.bin \"e2\" 4", 4, 1).expect("open b");
        assert!(!b.is_here(0));
    }
}
