//! The blobs the coordinator holds for jobs (`JobSpec.blobs`, see
//! `loader_proto::blob`): uploaded by trainers in chunks before they submit
//! a job that needs them, read by workers in chunks, in memory within a
//! byte budget (`loader-server --blob-budget`).
//!
//! An upload appends chunks in order, hashing as they come, so the SHA-256
//! is checked the moment the last byte arrives, with no second pass. Any
//! caller may add the next chunk of an upload (the bytes are named by their
//! hash, so ranks uploading the same blob at once share the work); a chunk
//! at another offset stores nothing and is told where the upload stands.
//!
//! The budget counts held blobs and uploads in progress (an upload reserves
//! its whole size when it starts). When a new upload does not fit, blobs no
//! unfinished job references go first (least recently used first), then
//! uploads nobody has added to for [`STALE_UPLOAD`]; if it still does not
//! fit, it is refused naming the sizes. A coordinator that restarts holds no
//! blob until its trainers upload again (they do when they reopen).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use loader_process::blobs::Sha256;
use loader_proto::blob::{MAX_CHUNK, is_sha256_hex};
use loader_job::footprint::human_bytes;
use prost::bytes::Bytes;

use crate::error::CoordinatorError;

/// The blob budget unless `--blob-budget` says otherwise.
pub(crate) const DEFAULT_BUDGET: u64 = 4 << 30;

/// An upload nobody added a chunk to for this long may be dropped to make
/// room for another.
pub(crate) const STALE_UPLOAD: Duration = Duration::from_secs(120);

/// Every blob held or being uploaded, by SHA-256.
#[derive(Debug)]
pub(crate) struct BlobStore {
    /// Bytes that held blobs and uploads in progress may take together.
    budget: u64,
    inner: Mutex<Store>,
}

#[derive(Debug, Default)]
struct Store {
    held: HashMap<String, Held>,
    uploads: HashMap<String, Upload>,
}

#[derive(Debug)]
struct Held {
    bytes: Bytes,
    /// Last read or uploaded, for eviction order.
    used: Instant,
}

#[derive(Debug)]
struct Upload {
    /// The whole blob's size, reserved from the budget.
    size: u64,
    /// The bytes so far (capacity `size`).
    bytes: Vec<u8>,
    /// Their hash so far.
    sha: Sha256,
    /// The last chunk's arrival.
    touched: Instant,
}

/// Where an upload stands after a `PutBlob` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PutOutcome {
    /// The whole blob is held, its hash checked.
    pub(crate) held: bool,
    /// Where the next chunk starts.
    pub(crate) next_offset: u64,
}

/// One `PutBlob` call.
#[derive(Debug, Clone)]
pub(crate) struct Chunk {
    /// The blob's SHA-256 (64 lowercase hex digits).
    pub(crate) sha256: String,
    /// The whole blob's size.
    pub(crate) size: u64,
    /// Where `data` starts.
    pub(crate) offset: u64,
    /// At most `MAX_CHUNK` bytes; empty to ask.
    pub(crate) data: Bytes,
}

impl BlobStore {
    /// An empty store that holds at most `budget` bytes.
    pub(crate) fn new(budget: u64) -> Self {
        Self { budget, inner: Mutex::new(Store::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True when the blob `sha256` of `size` bytes is held whole.
    pub(crate) fn holds(&self, sha256: &str, size: u64) -> bool {
        self.lock().held.get(sha256).is_some_and(|h| h.bytes.len() as u64 == size)
    }

    /// Applies one `PutBlob` call at `now`; `in_use` holds the hashes that
    /// unfinished jobs reference, which eviction keeps.
    pub(crate) fn put(&self, chunk: Chunk, in_use: &HashSet<String>, now: Instant) -> Result<PutOutcome, CoordinatorError> {
        let Chunk { sha256, size, offset, data } = chunk;
        check_name(&sha256)?;
        if data.len() > MAX_CHUNK {
            return Err(bad(format!(
                "blob {sha256}: a chunk of {} bytes is over the {MAX_CHUNK} one call may carry",
                data.len()
            )));
        }
        if offset.saturating_add(data.len() as u64) > size {
            return Err(bad(format!(
                "blob {sha256}: {} bytes at offset {offset} run past its size of {size}",
                data.len()
            )));
        }
        let mut store = self.lock();
        if let Some(held) = store.held.get_mut(&sha256) {
            let len = held.bytes.len() as u64;
            if len != size {
                return Err(bad(format!("blob {sha256} is held with {len} bytes, not {size}")));
            }
            held.used = now;
            return Ok(PutOutcome { held: true, next_offset: size });
        }
        if !store.uploads.contains_key(&sha256) {
            self.make_room(&mut store, &sha256, size, in_use, now)?;
            let capacity = usize::try_from(size).map_err(|_| bad(format!("blob {sha256}: {size} bytes")))?;
            let upload = Upload { size, bytes: Vec::with_capacity(capacity), sha: Sha256::default(), touched: now };
            store.uploads.insert(sha256.clone(), upload);
            crate::meters::blob_bytes(store.used());
        }
        let Some(upload) = store.uploads.get_mut(&sha256) else {
            return Err(bad(format!("blob {sha256}: upload vanished")));
        };
        if upload.size != size {
            return Err(bad(format!("blob {sha256} is being uploaded with {} bytes, not {size}", upload.size)));
        }
        let at = upload.bytes.len() as u64;
        if offset != at || data.is_empty() {
            // A repeated chunk, one from a second uploader, or a question.
            if at < size {
                return Ok(PutOutcome { held: false, next_offset: at });
            }
        } else {
            upload.bytes.extend_from_slice(&data);
            upload.sha.update(&data);
            upload.touched = now;
        }
        if (upload.bytes.len() as u64) < size {
            return Ok(PutOutcome { held: false, next_offset: upload.bytes.len() as u64 });
        }
        let Some(done) = store.uploads.remove(&sha256) else {
            return Err(bad(format!("blob {sha256}: upload vanished")));
        };
        let got = done.sha.finish();
        if got != sha256 {
            return Err(CoordinatorError::BlobMismatch { sha256, got });
        }
        tracing::info!(sha256, size, "blob held");
        store.held.insert(sha256, Held { bytes: Bytes::from(done.bytes), used: now });
        crate::meters::blob_bytes(store.used());
        Ok(PutOutcome { held: true, next_offset: size })
    }

    /// Frees room for an upload of `size` bytes of `sha256`, or refuses it.
    fn make_room(
        &self,
        store: &mut Store,
        sha256: &str,
        size: u64,
        in_use: &HashSet<String>,
        now: Instant,
    ) -> Result<(), CoordinatorError> {
        if size > self.budget {
            return Err(CoordinatorError::BlobTooLarge {
                sha256: sha256.to_owned(),
                size: human_bytes(size),
                budget: human_bytes(self.budget),
            });
        }
        if store.used() + size <= self.budget {
            return Ok(());
        }
        let mut unused: Vec<(Instant, String)> =
            store.held.iter().filter(|(k, _)| !in_use.contains(*k)).map(|(k, h)| (h.used, k.clone())).collect();
        unused.sort();
        for (_, key) in unused {
            store.held.remove(&key);
            tracing::info!(sha256 = key, "blob dropped: no unfinished job needs it and another needs the room");
            if store.used() + size <= self.budget {
                return Ok(());
            }
        }
        let stale: Vec<String> =
            store.uploads.iter().filter(|(_, u)| now.duration_since(u.touched) >= STALE_UPLOAD).map(|(k, _)| k.clone()).collect();
        for key in stale {
            store.uploads.remove(&key);
            tracing::info!(sha256 = key, "stalled blob upload dropped to make room");
            if store.used() + size <= self.budget {
                return Ok(());
            }
        }
        Err(CoordinatorError::BlobBudgetFull {
            sha256: sha256.to_owned(),
            size: human_bytes(size),
            used: human_bytes(store.used()),
            budget: human_bytes(self.budget),
        })
    }

    /// Up to `max_bytes` (at most `MAX_CHUNK`; 0 means that) of the blob
    /// `sha256` from `offset`, and the blob's size.
    pub(crate) fn get(&self, sha256: &str, offset: u64, max_bytes: u32, now: Instant) -> Result<(Bytes, u64), CoordinatorError> {
        check_name(sha256)?;
        let mut store = self.lock();
        let held = store.held.get_mut(sha256).ok_or_else(|| CoordinatorError::UnknownBlob(sha256.to_owned()))?;
        held.used = now;
        let size = held.bytes.len() as u64;
        if offset > size {
            return Err(bad(format!("blob {sha256} has {size} bytes; offset {offset} is past its end")));
        }
        let want = if max_bytes == 0 { MAX_CHUNK } else { (max_bytes as usize).min(MAX_CHUNK) };
        let start = offset as usize;
        let end = start + want.min(held.bytes.len() - start);
        Ok((held.bytes.slice(start..end), size))
    }
}

impl Store {
    /// Bytes held and reserved by uploads.
    fn used(&self) -> u64 {
        self.held.values().map(|h| h.bytes.len() as u64).sum::<u64>() + self.uploads.values().map(|u| u.size).sum::<u64>()
    }
}

fn check_name(sha256: &str) -> Result<(), CoordinatorError> {
    if is_sha256_hex(sha256) {
        Ok(())
    } else {
        Err(bad(format!("blob name {sha256:?} is not a SHA-256 in 64 lowercase hex digits")))
    }
}

fn bad(message: String) -> CoordinatorError {
    CoordinatorError::BadBlobRequest(message)
}

#[cfg(test)]
mod tests;
