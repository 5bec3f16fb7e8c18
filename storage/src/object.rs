//! One object, read in chunks and kept on local disk.
//!
//! A sample of a large object (a token window, an npy row) is a few KB; one
//! request per sample would pay a round trip each and, under a shuffled
//! order, fetch the same neighbourhood again and again. The object is cut
//! into chunks of [`CHUNK`] bytes instead: a read copies out of the chunks
//! it spans, fetching any not yet here with one ranged GET each (at most
//! [`IN_FLIGHT`] at once per process), and [`RemoteObject::prefetch`]
//! starts the fetches of chunks the next samples need, so that many
//! requests are in flight while the worker copies.
//!
//! A fetched chunk is written into a cache file of the object's size (a
//! sparse, unlinked file of the local copy, `crate::local_copy`), mapped
//! whole: every chunk is fetched once per job whatever the order, later
//! reads are copies out of the mapping, served by the page cache, and the file's space goes back to the
//! filesystem when the job closes the object or the worker dies (it has no
//! name to leak). When the local copy's budget is spent or the disk refuses
//! a chunk (full), the chunk stays in memory instead, at most [`IN_MEMORY`]
//! of them, the least recently used dropped first.
//!
//! When the node's workers share the local copy (`crate::node_chunks`),
//! the chunks are kept in the node's file of the object instead, and a
//! chunk another worker fetched (or is fetching) is read from there, not
//! fetched again: N workers on one machine fetch an object once, not N
//! times.
//!
//! A shuffled read's first batches touch chunks all over the object, each
//! of which takes its share of the link to arrive: a batch of 64 token
//! windows waited for 64 chunks (256 MB), 5-6.8 s. A sample hinted out of
//! order whose chunk is not here yet is also fetched on its own, a
//! *piece* of at most [`PIECE`] bytes, and the read takes it if its chunk
//! is still on its way: the first batch waits for 64 small requests, not
//! for most of the object (0.58-0.96 s). Only an object's first
//! [`PIECES`] (or a batch's samples, when larger) are made. Read in order,
//! a sample's chunk is fetched ahead and no piece is made.
//!
//! Every request names the ETag the object had at open (`If-Match`): an
//! object rewritten mid-job fails its next read with a
//! [`crate::ErrorKind::Changed`] error instead of mixing two versions.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use memmap2::Mmap;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStoreExt};
use tokio::sync::Semaphore;

use crate::error::ErrorKind;
use crate::node_chunks::NodeChunks;
use crate::stores::{Store, store};
use crate::{ObjectUrl, StorageError, io, local_copy};

/// Bytes a chunk holds: large enough that a request's round trip is paid
/// once per many samples, small enough that the first read of a shuffled
/// epoch waits little for bytes it does not need yet.
pub const CHUNK: u64 = 4 << 20;
/// Requests in flight at once, per process.
pub const IN_FLIGHT: usize = 64;
/// Chunks kept in memory per object when the disk refuses them.
pub const IN_MEMORY: usize = 32;
/// Chunks fetched ahead of a read that goes through the object in order.
/// A worker is told of the samples of its next few batches only: in order,
/// those span a few hundred KB of a token file, less than one chunk, so a
/// reader in order had one or two requests in flight and drew 55-65 MB/s
/// from a link that carries 118. Eight chunks ahead (32 MB) keep the link
/// full, as the kernel's readahead does for a file read in order; a
/// shuffled read, which asks for chunks all over the object, seldom
/// follows the hint before it and is left as it was.
pub const READ_AHEAD: u64 = 8;
/// Largest sample fetched on its own while its chunk is on its way (a
/// token window is 4-16 KB, an npy row a few KB).
pub const PIECE: u64 = 64 << 10;
/// Pieces made per object, at least, over its life: enough for a worker's
/// first few batches, which would wait for most of a shuffled object's
/// chunks. Past them a piece costs a request per sample, which the chunks
/// save: with 64 pieces in flight per worker and no end to them, a
/// shuffled epoch 1 of a token file made 12% fewer windows a second
/// (19,700 against 23,000, 6 pairs), the store answering a request for
/// every few KB. A dataset read in larger batches says so
/// ([`RemoteObject::read_in_batches_of`]): its first batch is made of
/// pieces whole, up to [`MOST_PIECES`].
pub const PIECES: usize = 64;
/// Pieces made per object, at most, whatever the batch: 1,024 token
/// windows of 8 KB are 8 MB, two chunks' worth, where a batch that large
/// spans every chunk of most objects.
pub const MOST_PIECES: usize = 1024;
/// Piece requests in flight at once, per process, beside [`IN_FLIGHT`]
/// chunk requests: a piece is wanted now, so it does not wait for a
/// chunk's request to end.
pub const PIECES_IN_FLIGHT: usize = 64;

/// Where a fetched chunk's bytes are.
#[derive(Debug, Clone)]
enum Held {
    /// In the cache file, at the chunk's own offset.
    OnDisk,
    /// In memory (the disk refused them).
    InMemory(Bytes),
}

/// One chunk: being fetched, or fetched (where, or the error).
type Slot = crate::slot::Slot<Held>;

/// A piece on its way or fetched, and the slots of the chunks it lies in:
/// once they are all here it is of no use.
#[derive(Debug)]
struct Piece {
    bytes: Arc<crate::slot::Slot<Bytes>>,
    chunks: Arc<[Arc<Slot>]>,
}

/// Whether every chunk of `chunks` is here (or failed: then the read of
/// the chunk says why).
fn all_here(chunks: &[Arc<Slot>]) -> bool {
    chunks.iter().all(|c| c.is_filled())
}

/// The chunks fetched or on their way, and the use order of those held in
/// memory.
#[derive(Debug, Default)]
struct Chunks {
    slots: HashMap<u64, Arc<Slot>>,
    /// Last use of each chunk held in memory, by a counter.
    in_memory: HashMap<u64, u64>,
    clock: u64,
}

/// An object opened for reading: its size and ETag as of the open.
#[derive(Debug)]
pub struct RemoteObject {
    url: String,
    store: Store,
    path: Path,
    size: u64,
    etag: Option<String>,
    /// The chunks already here, at their offsets; None when no cache file
    /// could be made (every chunk is then held in memory).
    cache: Option<File>,
    /// The cache file mapped whole, so that a read of a chunk that is here
    /// is a copy, as from a local file's mapping (no system call).
    map: Option<Mmap>,
    /// The node's file of the object, when the node's workers share it
    /// (then `cache` and `map` are None).
    node: Option<NodeChunks>,
    /// Bytes of the cache file taken from the local copy's budget.
    kept: AtomicU64,
    /// Chunks in the cache file: when all are, the object is here whole
    /// and reads are copies out of the mapping, nothing more.
    on_disk: AtomicU64,
    /// One past the last chunk of the latest prefetch hint: a hint that
    /// starts there (or one chunk before) follows it, in order.
    hinted: AtomicU64,
    /// One past the last chunk the latest read ahead asked for.
    ahead: AtomicU64,
    /// Where the latest prefetch hint ended, in bytes: a hint that starts
    /// there (or before, by less than its own length) follows it, in order.
    hint_end: AtomicU64,
    chunks: Mutex<Chunks>,
    /// Samples fetched on their own while their chunks are on their way,
    /// by (offset, length), until read or their chunks are here.
    pieces: Mutex<HashMap<(u64, u64), Piece>>,
    /// Pieces in `pieces`, read without its lock: a read finds none there
    /// (every read, once the first batches are made) without locking.
    pieces_held: AtomicUsize,
    /// Pieces made so far.
    pieces_made: AtomicUsize,
    /// Pieces that may be made: [`PIECES`], or a batch's samples
    /// ([`RemoteObject::read_in_batches_of`]).
    pieces_allowed: AtomicUsize,
}

impl Drop for RemoteObject {
    fn drop(&mut self) {
        local_copy::release(self.kept.load(Ordering::Acquire));
    }
}

/// The requests in flight, process-wide.
pub(crate) fn in_flight() -> &'static Arc<Semaphore> {
    static SEMAPHORE: OnceLock<Arc<Semaphore>> = OnceLock::new();
    SEMAPHORE.get_or_init(|| Arc::new(Semaphore::new(IN_FLIGHT)))
}

/// The piece requests in flight, process-wide.
fn pieces_in_flight() -> &'static Arc<Semaphore> {
    static SEMAPHORE: OnceLock<Arc<Semaphore>> = OnceLock::new();
    SEMAPHORE.get_or_init(|| Arc::new(Semaphore::new(PIECES_IN_FLIGHT)))
}

impl RemoteObject {
    /// Opens `url` (one HEAD request): its size and ETag.
    pub fn open(url: &ObjectUrl) -> Result<Arc<Self>, StorageError> {
        let store = store(url)?;
        let path = Path::from(url.key.as_str());
        let name = url.to_string();
        let (client, key, endpoint) = (store.client.clone(), path.clone(), store.endpoint.clone());
        let meta = io::wait(async move {
            let started = std::time::Instant::now();
            let meta = client.head(&key).await;
            crate::meters::request("head", meta.is_ok(), started.elapsed(), 0);
            meta
        })
            .map_err(|e| StorageError::new(&name, ErrorKind::Unavailable, e.to_string()))?
            .map_err(|e| StorageError::from_store(&name, &endpoint, e))?;
        let node = local_copy::shared_dir().and_then(|root| {
            let key = format!("{name} {} {}", meta.e_tag.as_deref().unwrap_or(""), meta.size);
            NodeChunks::open(root, &key, meta.size, chunks_of(0..meta.size).end)
        });
        let cache = if node.is_some() { None } else { local_copy::file() };
        let map = cache.as_ref().and_then(|file| map_whole(file, meta.size));
        Ok(Arc::new(Self {
            url: name,
            store,
            path,
            size: meta.size,
            etag: meta.e_tag,
            cache,
            map,
            node,
            kept: AtomicU64::new(0),
            on_disk: AtomicU64::new(0),
            hinted: AtomicU64::new(u64::MAX),
            ahead: AtomicU64::new(0),
            hint_end: AtomicU64::new(u64::MAX),
            chunks: Mutex::default(),
            pieces: Mutex::default(),
            pieces_held: AtomicUsize::new(0),
            pieces_made: AtomicUsize::new(0),
            pieces_allowed: AtomicUsize::new(PIECES),
        }))
    }

    /// The object's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its size in bytes, as opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Tells the object that its samples are read `samples` at a time: a
    /// worker's first batch of a shuffled read is then fetched sample by
    /// sample whole, however large (up to [`MOST_PIECES`] samples), rather
    /// than its first [`PIECES`] samples only, the rest waiting for their
    /// chunks.
    pub fn read_in_batches_of(&self, samples: usize) {
        self.pieces_allowed.fetch_max(samples.min(MOST_PIECES), Ordering::AcqRel);
    }

    /// Whether every chunk is in the cache file: nothing is left to fetch
    /// (a later epoch), so a prefetch has nothing to do.
    pub fn is_here_whole(&self) -> bool {
        self.on_disk.load(Ordering::Acquire) == chunks_of(0..self.size).end
    }

    /// Copies the bytes at `offset` into `dst`, fetching the chunks they
    /// span that are not here yet.
    pub fn read_at(self: &Arc<Self>, offset: u64, dst: &mut [u8]) -> Result<(), StorageError> {
        let Some(end) = offset.checked_add(dst.len() as u64).filter(|&e| e <= self.size) else {
            let end = offset.saturating_add(dst.len() as u64);
            return Err(StorageError::changed(&self.url, &format!("bytes {offset}..{end} are past its end ({} bytes)", self.size)));
        };
        if let Some(map) = self.mapping().filter(|_| self.is_here_whole()) {
            // Every chunk's write completed (`on_disk` counts it after):
            // a copy out of the mapping, as from a local file's.
            let src = usize::try_from(offset).ok().and_then(|a| map.get(a..a.checked_add(dst.len())?));
            dst.copy_from_slice(src.ok_or_else(|| self.lost("the mapping is short"))?);
            crate::meters::chunk_read();
            return Ok(());
        }
        if let Some(piece) = self.take_piece(offset, dst.len() as u64) {
            match piece.bytes.wait(&self.url) {
                Ok(bytes) if bytes.len() == dst.len() => {
                    // Not a read out of a chunk: not counted in the local
                    // copy's hit ratio (a read that came from the store).
                    dst.copy_from_slice(&bytes);
                    return Ok(());
                }
                // Changed since the open: as a chunk's read would fail.
                Err(e) if e.kind == ErrorKind::Changed => return Err(e),
                // Any other failure: the chunks have the bytes too.
                _ => {}
            }
        }
        let mut at = offset;
        for index in chunks_of(offset..end) {
            let chunk_end = end.min((index + 1) * CHUNK);
            let into = &mut dst[(at - offset) as usize..(chunk_end - offset) as usize];
            crate::meters::chunk_read();
            match self.slot(index).wait(&self.url)? {
                Held::OnDisk => match self.mapping() {
                    Some(map) => {
                        let src = usize::try_from(at).ok().and_then(|a| map.get(a..a.checked_add(into.len())?));
                        into.copy_from_slice(src.ok_or_else(|| self.lost("the mapping is short"))?);
                    }
                    None => {
                        let file = self.cache.as_ref().ok_or_else(|| self.lost("no cache file"))?;
                        file.read_exact_at(into, at).map_err(|e| self.lost(&e.to_string()))?;
                    }
                },
                Held::InMemory(bytes) => {
                    let from = (at - index * CHUNK) as usize;
                    let src = bytes.get(from..from + into.len()).ok_or_else(|| self.lost("a chunk is short"))?;
                    into.copy_from_slice(src);
                }
            }
            at = chunk_end;
        }
        Ok(())
    }

    /// Starts fetching the chunks `range` spans that are not here or on
    /// their way, and when `range` follows the hint before it, the
    /// [`READ_AHEAD`] chunks after them; returns at once.
    pub fn prefetch(self: &Arc<Self>, range: Range<u64>) {
        if self.is_here_whole() {
            return;
        }
        let range = range.start.min(self.size)..range.end.min(self.size);
        let chunks = chunks_of(range.clone());
        if chunks.is_empty() {
            return;
        }
        // Not where the hint before it ended (or just before, as
        // overlapping windows start): a shuffled read, whose sample is
        // fetched on its own too while its chunks come, in the object's
        // first batches. In order, the chunk is fetched ahead instead.
        let last_end = self.hint_end.swap(range.end, Ordering::AcqRel);
        if !(range.start <= last_end && last_end - range.start < range.end - range.start) {
            self.fetch_piece(range);
        }
        for index in chunks.clone() {
            self.slot(index);
        }
        let before = self.hinted.swap(chunks.end, Ordering::AcqRel);
        if before != chunks.start && before != chunks.start + 1 {
            return;
        }
        // In order: the chunks up to READ_AHEAD past this hint, less those
        // the hint before it read ahead already (so each is looked up once
        // as the reader moves through the object, not on every hint).
        let last = chunks_of(0..self.size).end;
        let until = chunks.end.saturating_add(READ_AHEAD).min(last);
        let before = self.ahead.swap(until, Ordering::AcqRel);
        let from = if (chunks.end..until).contains(&before) { before } else { chunks.end };
        for index in from..until {
            self.slot(index);
        }
    }

    /// Starts fetching the bytes of `range` on their own, unless it is
    /// longer than [`PIECE`], its chunks are all here already, it is on
    /// its way, or as many pieces as allowed ([`PIECES`], or a batch's
    /// samples) were made for this object already.
    fn fetch_piece(self: &Arc<Self>, range: Range<u64>) {
        let allowed = self.pieces_allowed.load(Ordering::Acquire);
        if range.is_empty() || range.end - range.start > PIECE || self.pieces_made.load(Ordering::Acquire) >= allowed {
            return;
        }
        let chunks: Arc<[Arc<Slot>]> = chunks_of(range.clone()).map(|i| self.slot(i)).collect();
        if all_here(&chunks) {
            return;
        }
        let key = (range.start, range.end - range.start);
        let bytes = {
            let mut pieces = self.pieces.lock().unwrap_or_else(|p| p.into_inner());
            if pieces.contains_key(&key) || self.pieces_made.fetch_add(1, Ordering::AcqRel) >= allowed {
                return;
            }
            let bytes = Arc::new(crate::slot::Slot::default());
            pieces.insert(key, Piece { bytes: Arc::clone(&bytes), chunks: Arc::clone(&chunks) });
            self.pieces_held.store(pieces.len(), Ordering::Release);
            bytes
        };
        let (object, filled) = (Arc::clone(self), Arc::clone(&bytes));
        let fetched = io::spawn(async move {
            let got = match pieces_in_flight().acquire().await {
                // Its chunks came while it waited its turn: no request.
                Ok(_permit) if all_here(&chunks) => Err(StorageError::new(&object.url, ErrorKind::Unavailable, "its chunks came first")),
                Ok(_permit) => object.get_range(range).await,
                Err(e) => Err(StorageError::new(&object.url, ErrorKind::Unavailable, e.to_string())),
            };
            filled.fill(got);
        });
        if let Err(e) = fetched {
            bytes.fill(Err(StorageError::new(&self.url, ErrorKind::Unavailable, e.to_string())));
        }
    }

    /// The piece of exactly `len` bytes at `offset`, if one was fetched
    /// and its chunks are not all here yet; it is no longer kept either
    /// way, nor is any other whose chunks are all here.
    fn take_piece(&self, offset: u64, len: u64) -> Option<Piece> {
        // Set under the lock: a piece being added now is for a sample
        // hinted now, not the one read here (its hint came before).
        if self.pieces_held.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut pieces = self.pieces.lock().unwrap_or_else(|p| p.into_inner());
        let piece = pieces.remove(&(offset, len));
        // Pieces never read (their samples went to another worker) go
        // once their chunks are here.
        pieces.retain(|_, piece| !all_here(&piece.chunks));
        self.pieces_held.store(pieces.len(), Ordering::Release);
        piece.filter(|piece| !all_here(&piece.chunks))
    }

    /// The mapping chunks on disk are read through: the node's file's or
    /// this worker's own.
    fn mapping(&self) -> Option<&Mmap> {
        self.node.as_ref().map(NodeChunks::map).or(self.map.as_ref())
    }

    /// A read of the cache that failed: the bytes were here and are not.
    fn lost(&self, why: &str) -> StorageError {
        StorageError::new(&self.url, ErrorKind::Unavailable, format!("its local copy cannot be read: {why}"))
    }

    /// The slot of chunk `index`, its fetch started if it had none.
    fn slot(self: &Arc<Self>, index: u64) -> Arc<Slot> {
        let mut chunks = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        chunks.clock += 1;
        let now = chunks.clock;
        if let Some(used) = chunks.in_memory.get_mut(&index) {
            *used = now;
        }
        if let Some(slot) = chunks.slots.get(&index) {
            return Arc::clone(slot);
        }
        let slot = Arc::new(Slot::default());
        chunks.slots.insert(index, Arc::clone(&slot));
        drop(chunks);
        let (object, filled) = (Arc::clone(self), Arc::clone(&slot));
        let started = io::spawn(async move {
            // The write of a chunk (4 MB into the local copy) blocks: the
            // runtime moves its other requests to another thread meanwhile.
            let result = if object.node.is_some() {
                object.fetch_for_node(index).await
            } else {
                object.fetch(index).await.map(|bytes| tokio::task::block_in_place(|| object.keep(index, bytes)))
            };
            if result.is_err() {
                // Not kept: the next read asks again.
                object.forget(index, &filled);
            }
            filled.fill(result);
        });
        if let Err(e) = started {
            self.forget(index, &slot);
            slot.fill(Err(StorageError::new(&self.url, ErrorKind::Unavailable, e.to_string())));
        }
        slot
    }

    /// Drops chunk `index`'s slot, if it is still `slot`.
    fn forget(&self, index: u64, slot: &Arc<Slot>) {
        let mut chunks = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        if chunks.slots.get(&index).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            chunks.slots.remove(&index);
            chunks.in_memory.remove(&index);
        }
    }

    /// Puts chunk `index`'s bytes in the cache file, or in memory when the
    /// disk refuses them (evicting the least recently used beyond
    /// [`IN_MEMORY`]).
    fn keep(&self, index: u64, bytes: Bytes) -> Held {
        let len = bytes.len() as u64;
        if let Some(file) = &self.cache
            && local_copy::reserve(len)
        {
            match file.write_all_at(&bytes, index * CHUNK) {
                Ok(()) => {
                    self.kept.fetch_add(len, Ordering::AcqRel);
                    self.on_disk.fetch_add(1, Ordering::AcqRel);
                    return Held::OnDisk;
                }
                Err(e) => {
                    local_copy::release(len);
                    tracing::debug!(url = %self.url, "chunk {index} kept in memory: the cache file refused it: {e}");
                }
            }
        }
        self.keep_in_memory(index, bytes)
    }

    /// Holds chunk `index`'s bytes in memory, evicting the least recently
    /// used beyond [`IN_MEMORY`].
    fn keep_in_memory(&self, index: u64, bytes: Bytes) -> Held {
        let mut chunks = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        chunks.clock += 1;
        let now = chunks.clock;
        chunks.in_memory.insert(index, now);
        if chunks.in_memory.len() > IN_MEMORY
            && let Some((&oldest, _)) = chunks.in_memory.iter().filter(|(i, _)| **i != index).min_by_key(|(_, t)| **t)
        {
            // A read holding it keeps its bytes alive until done.
            chunks.in_memory.remove(&oldest);
            chunks.slots.remove(&oldest);
        }
        Held::InMemory(bytes)
    }

    /// Chunk `index` in the node's file: there already, fetched by the
    /// worker that claimed it while this one waited, or fetched here and
    /// put there for the others.
    async fn fetch_for_node(self: &Arc<Self>, index: u64) -> Result<Held, StorageError> {
        let node = self.node.as_ref().ok_or_else(|| self.lost("no node file"))?;
        let here = |object: &Self| {
            object.on_disk.fetch_add(1, Ordering::AcqRel);
            Ok(Held::OnDisk)
        };
        if node.is_here(index) {
            return here(self);
        }
        // While another worker fetches it, wait for it to be here; a lock
        // that cannot be had, or is held longer than a fetch with all its
        // retries can take (a worker stopped, not dead), leaves it to this
        // worker alone.
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(1);
        let claim = loop {
            match node.try_claim(index) {
                Ok(Some(claim)) => break Some(claim),
                Ok(None) if started.elapsed() < self.store.longest => {}
                Ok(None) | Err(_) => break None,
            }
            if node.is_here(index) {
                return here(self);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        };
        let Some(claim) = claim else {
            return self.fetch(index).await.map(|bytes| tokio::task::block_in_place(|| self.keep(index, bytes)));
        };
        if node.is_here(index) {
            return here(self);
        }
        let bytes = self.fetch(index).await?;
        let len = bytes.len() as u64;
        if local_copy::reserve(len) {
            match tokio::task::block_in_place(|| node.put(claim, index * CHUNK, &bytes)) {
                Ok(()) => {
                    self.kept.fetch_add(len, Ordering::AcqRel);
                    return here(self);
                }
                Err(e) => {
                    local_copy::release(len);
                    tracing::debug!(url = %self.url, "chunk {index} kept in memory: the node's file refused it: {e}");
                }
            }
        }
        Ok(self.keep_in_memory(index, bytes))
    }

    /// One ranged GET of chunk `index`, pinned to the ETag of the open.
    async fn fetch(&self, index: u64) -> Result<Bytes, StorageError> {
        crate::meters::chunk_fetch();
        let start = index * CHUNK;
        let _permit = in_flight().acquire().await.map_err(|e| StorageError::new(&self.url, ErrorKind::Unavailable, e.to_string()))?;
        self.get_range(start..(start + CHUNK).min(self.size)).await
    }

    /// One ranged GET of `start..end`, pinned to the ETag of the open.
    async fn get_range(&self, Range { start, end }: Range<u64>) -> Result<Bytes, StorageError> {
        let options = GetOptions {
            if_match: self.etag.clone(),
            range: Some(GetRange::Bounded(start..end)),
            ..GetOptions::default()
        };
        let started = std::time::Instant::now();
        let bytes = match self.store.client.get_opts(&self.path, options).await {
            Ok(r) => r.bytes().await,
            Err(e) => Err(e),
        };
        let fetched = bytes.as_ref().map_or(0, |b| b.len() as u64);
        crate::meters::request("get", bytes.is_ok(), started.elapsed(), fetched);
        let bytes = bytes.map_err(|e| match StorageError::from_store(&self.url, &self.store.endpoint, e) {
            // Gone since the open: it changed.
            e if e.kind == ErrorKind::NotFound => StorageError::changed(&self.url, "it was deleted"),
            other => other,
        })?;
        if bytes.len() as u64 != end - start {
            return Err(StorageError::changed(&self.url, &format!("bytes {start}..{end} came back as {} bytes", bytes.len())));
        }
        Ok(bytes)
    }
}

/// `file` (the local copy of an object of `size` bytes) sized to the object,
/// sparse, and mapped whole; None (reads then `pread`) when it cannot be.
fn map_whole(file: &File, size: u64) -> Option<Mmap> {
    if size == 0 || file.set_len(size).is_err() {
        return None;
    }
    // SAFETY: the file is this object's own, unlinked at creation, so no
    // other process can open, truncate or write it; this process only
    // writes whole chunks into it (`keep`) and reads through the mapping
    // only chunks whose write completed (`Held::OnDisk`), which lie within
    // the length set above: no read can fault past the end or see a write
    // in progress.
    unsafe { Mmap::map(file) }.ok()
}

/// The chunk indexes `range` spans.
fn chunks_of(range: Range<u64>) -> Range<u64> {
    if range.is_empty() {
        return 0..0;
    }
    range.start / CHUNK..(range.end - 1) / CHUNK + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_map_to_the_chunks_they_span() {
        assert_eq!(chunks_of(0..0), 0..0);
        assert_eq!(chunks_of(0..1), 0..1);
        assert_eq!(chunks_of(0..CHUNK), 0..1);
        assert_eq!(chunks_of(CHUNK - 1..CHUNK + 1), 0..2);
        assert_eq!(chunks_of(3 * CHUNK..3 * CHUNK + 5), 3..4);
    }
}
