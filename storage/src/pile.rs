//! [`Pile`]: many small objects (an image folder's images) kept in one
//! file of the local copy, so a job's later epochs read them from local
//! disk instead of fetching each again.
//!
//! One unlinked file per pile (a dataset's life), appended to as objects
//! arrive (on the storage runtime's thread, each as its response ends),
//! with an index of where each sits; bytes taken from the local
//! copy's budget (`crate::local_copy`) and given back when the pile goes.
//! An object that does not fit the budget is simply not kept. With a
//! shared local copy, the pile is the node's (`crate::node_pile`): every
//! worker on it reads what any of them fetched.
//!
//! A worker knows the batches it makes next (its queued ranges), so their
//! objects can be fetched while it decodes the one at hand:
//! [`Pile::prefetch`] starts their GETs, whose bytes wait in memory (at
//! most [`AHEAD`] objects) until [`Pile::get_many`] asks for them.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::error::ErrorKind;
use crate::local_copy::Room;
use crate::node_pile::NodePile;
use crate::slot::Slot;
use crate::{ObjectUrl, StorageError, io, listing, local_copy};

/// Objects fetched ahead of need and not yet asked for, at most: their
/// bytes wait in memory (a few batches of images: tens of MB).
pub const AHEAD: usize = 512;
/// How long an object fetched ahead waits to be asked for before it
/// counts as stale: a batch fetched ahead and never made here (its range
/// went to another worker) must not stop the fetches of the next.
const STALE: Duration = Duration::from_secs(30);

/// Small objects kept on local disk.
#[derive(Debug)]
pub struct Pile {
    /// What is kept, shared with the fetches on their way: each keeps its
    /// object as it arrives.
    kept: Arc<Kept>,
    /// Objects fetched ahead of need, by key, until asked for.
    coming: Mutex<Coming>,
}

/// The objects a pile keeps, and where.
#[derive(Debug)]
struct Kept {
    /// Made when the first object is kept, with its disk space; None
    /// inside when none could be made: nothing is kept.
    file: OnceLock<Option<(File, Room)>>,
    /// Where each kept object sits: (offset, length), by key.
    index: Mutex<HashMap<u128, (u64, u64)>>,
    /// The file's end: where the next object goes.
    end: AtomicU64,
    /// The node's pile, when the local copy is shared: used instead of
    /// the file above.
    node: Option<NodePile>,
}

impl Default for Pile {
    fn default() -> Self {
        Self::with(None)
    }
}

impl Pile {
    /// The pile of the folder `folder` (its URL and the version of its
    /// listing): the node's when the local copy is shared, else this
    /// worker's own.
    pub fn of_folder(folder: &str) -> Self {
        Self::with(local_copy::shared_dir().and_then(|root| NodePile::open(root, folder)))
    }

    fn with(node: Option<NodePile>) -> Self {
        let kept = Kept { file: OnceLock::new(), index: Mutex::default(), end: AtomicU64::new(0), node };
        Self { kept: Arc::new(kept), coming: Mutex::default() }
    }

    /// Every object of `objects` (its URL and the ETag it must have), in
    /// order, to be read when its turn comes ([`Got::bytes`]): those on
    /// their way (fetched ahead) from their fetch, kept ones from local
    /// disk, the others from a fetch started here, in order.
    ///
    /// Nothing here waits for the store: a batch's first images are
    /// decoded while its last ones arrive. A worker's first batches, whose
    /// fetches cannot have started ahead, then begin with their first
    /// image, not their slowest.
    pub fn get_many<'a>(&'a self, objects: &[&'a Object]) -> Vec<Got<'a>> {
        self.kept.refresh();
        let keys: Vec<u128> = objects.iter().map(|o| key(o)).collect();
        // An object fetched ahead has been kept by now, most likely, but
        // its bytes are still in memory: taken from there, not read back.
        let mut slots: Vec<Option<Arc<Slot<Bytes>>>> = {
            let mut coming = self.coming();
            keys.iter().map(|&k| coming.take(k)).collect()
        };
        let mut started: Vec<(Object, u128, Arc<Slot<Bytes>>)> = Vec::new();
        let got = keys
            .into_iter()
            .zip(objects)
            .zip(slots.iter_mut())
            .map(|((key, &object), slot)| match slot.take() {
                Some(slot) => Got(Read::Coming { object, slot }),
                None if self.kept.holds(key) => Got(Read::Kept { pile: self, object }),
                None => {
                    let slot = Arc::new(Slot::default());
                    started.push((object.clone(), key, Arc::clone(&slot)));
                    Got(Read::Coming { object, slot })
                }
            })
            .collect();
        start(&self.kept, started);
        got
    }

    /// Starts fetching the objects `wanted` (indexes into `objects`) that
    /// are neither kept nor on their way, while fewer than [`AHEAD`] wait;
    /// returns at once.
    ///
    /// One task per call is started from here; the fetches' own tasks, and
    /// the copies of each object's URL and ETag they take, are made on the
    /// storage runtime's thread, which also frees them. Made here, one set
    /// per object, they were freed on that thread into this thread's malloc
    /// arena (1-2% of a worker's epoch from a store).
    pub fn prefetch(&self, objects: &Arc<[Object]>, wanted: impl IntoIterator<Item = usize>) {
        let mut started: Vec<(usize, u128, Arc<Slot<Bytes>>)> = Vec::new();
        self.kept.refresh();
        {
            let mut coming = self.coming();
            for i in wanted {
                let Some(object) = objects.get(i) else { continue };
                let key = key(object);
                if coming.slots.contains_key(&key) || self.kept.holds(key) {
                    continue;
                }
                let slot = Arc::new(Slot::default());
                if !coming.add(key, Arc::clone(&slot)) {
                    break;
                }
                started.push((i, key, slot));
            }
        }
        if started.is_empty() {
            return;
        }
        let started = Arc::new(started);
        let (all, each, kept) = (Arc::clone(objects), Arc::clone(&started), Arc::clone(&self.kept));
        let spawned = io::spawn(async move {
            for (i, key, slot) in each.iter() {
                tokio::spawn(fetch_and_keep(Arc::clone(&kept), all[*i].clone(), *key, Arc::clone(slot)));
            }
        });
        if let Err(e) = spawned {
            for (i, _, slot) in started.iter() {
                slot.fill(Err(StorageError::new(objects[*i].0.to_string(), ErrorKind::Unavailable, e.to_string())));
            }
        }
    }

    fn coming(&self) -> MutexGuard<'_, Coming> {
        self.coming.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Kept {
    /// Sees what the node's other workers kept since last asked (a shared
    /// local copy; else nothing to do).
    fn refresh(&self) {
        if let Some(node) = &self.node {
            node.refresh();
        }
    }

    /// Whether the object named `key` is kept (on this machine's shared
    /// copy, as of its last refresh, or in this worker's own).
    fn holds(&self, key: u128) -> bool {
        match &self.node {
            Some(node) => node.holds(key),
            None => self.index.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&key),
        }
    }

    /// The kept bytes of the object named `key`, if kept and readable.
    fn read(&self, key: u128) -> Option<Result<Bytes, StorageError>> {
        if let Some(node) = &self.node {
            return node.read(key).map(Ok);
        }
        let (offset, len) = *self.index.lock().unwrap_or_else(|p| p.into_inner()).get(&key)?;
        let (file, _) = self.file.get()?.as_ref()?;
        let mut bytes = vec![0; usize::try_from(len).ok()?];
        // A local read that fails is a fetch, not an error.
        file.read_exact_at(&mut bytes, offset).ok()?;
        Some(Ok(Bytes::from(bytes)))
    }

    /// Keeps `bytes` as the object named `key`'s, if the budget allows.
    fn keep(&self, key: u128, bytes: &Bytes) {
        if let Some(node) = &self.node {
            return node.keep(key, bytes);
        }
        let made = self.file.get_or_init(|| {
            local_copy::file().map(|file| {
                let room = Room::of(&file);
                (file, room)
            })
        });
        let Some((file, room)) = made else { return };
        let len = bytes.len() as u64;
        if !local_copy::reserve(len) {
            return;
        }
        let offset = self.end.fetch_add(len, Ordering::AcqRel);
        room.make(file, offset + len);
        match file.write_all_at(bytes, offset) {
            Ok(()) => {
                self.index.lock().unwrap_or_else(|p| p.into_inner()).insert(key, (offset, len));
            }
            Err(e) => tracing::debug!("object {key:032x} not kept on local disk: {e}"),
        }
    }
}

/// Fetches one object, keeps it (while the budget allows), then answers
/// `slot`.
///
/// Kept here, on the storage runtime's thread, as soon as it arrives:
/// its bytes are still in the CPU's cache then, and the copy into the
/// page cache reads them from there. Kept when a producer took them, a
/// batch or more later, the copy read them from memory again: the writes
/// took 5.5% of the core that read 12,800 images from a store, 2.4% here
/// (`perf`, two workers on one core).
async fn fetch_and_keep(kept: Arc<Kept>, (url, etag): Object, key: u128, slot: Arc<Slot<Bytes>>) {
    let got = listing::fetch(url, etag).await;
    if let Ok(bytes) = &got {
        kept.keep(key, bytes);
    }
    slot.fill(got);
}

/// One object of a batch asked for with [`Pile::get_many`], read when
/// its turn comes ([`Got::bytes`]).
///
/// An object kept on local disk is read only then: a batch's images then
/// take one buffer at a time, as when they are read from a local folder,
/// not 64 buffers of ~150 KB each held together until the batch is made.
/// One on its way from the store is waited for only then.
#[derive(Debug)]
pub struct Got<'a>(Read<'a>);

/// Where a [`Got`] object's bytes come from.
#[derive(Debug)]
enum Read<'a> {
    /// Kept on local disk.
    Kept {
        /// The pile that keeps it.
        pile: &'a Pile,
        /// Its URL and the ETag it must have.
        object: &'a Object,
    },
    /// Fetched from the store (ahead, or when the batch asked for it).
    Coming {
        /// Its URL and the ETag it must have.
        object: &'a Object,
        /// Its fetch's answer.
        slot: Arc<Slot<Bytes>>,
    },
}

impl Got<'_> {
    /// The object's bytes: its fetch's answer (kept by then, while the
    /// budget allows); or read from local disk when kept there, and
    /// fetched (not kept again) when the local copy cannot give them
    /// after all. Counted as read where it was read from (the local copy,
    /// or the store), when it is read.
    pub fn bytes(self) -> Result<Bytes, StorageError> {
        match self.0 {
            Read::Coming { object, slot } => {
                crate::meters::object_read(false);
                slot.wait(&object.0.to_string())
            }
            Read::Kept { pile, object } => {
                let read = pile.kept.read(key(object));
                crate::meters::object_read(read.is_some());
                read.unwrap_or_else(|| crate::get(&object.0, object.1.clone()))
            }
        }
    }
}

/// Starts the fetches of `objects` (each with its key), each keeping its
/// object in `kept` and answering its slot; returns at once. Where the
/// storage runtime cannot run them, every slot is answered with why.
fn start(kept: &Arc<Kept>, objects: Vec<(Object, u128, Arc<Slot<Bytes>>)>) {
    if objects.is_empty() {
        return;
    }
    let slots: Vec<(String, Arc<Slot<Bytes>>)> = objects.iter().map(|((url, _), _, slot)| (url.to_string(), Arc::clone(slot))).collect();
    let kept = Arc::clone(kept);
    let spawned = io::spawn(async move {
        for (object, key, slot) in objects {
            tokio::spawn(fetch_and_keep(Arc::clone(&kept), object, key, slot));
        }
    });
    if let Err(e) = spawned {
        for (url, slot) in slots {
            slot.fill(Err(StorageError::new(url, ErrorKind::Unavailable, e.to_string())));
        }
    }
}

/// An object of a pile: its URL and the ETag it must have.
pub type Object = (ObjectUrl, Option<String>);

/// How a pile names an object: the hash of its URL and the ETag it must
/// have, so that a node's pile, which outlives any one job, never serves
/// another version. Hashed as written, with no string made on the way.
fn key((url, etag): &Object) -> u128 {
    use std::fmt::Write;
    let mut h = crate::node_pile::Hasher::default();
    // Writing into a hasher cannot fail.
    let _ = write!(h, "{url} {}", etag.as_deref().unwrap_or(""));
    h.finish()
}

/// Objects fetched ahead, by key, with when they were asked for.
#[derive(Debug, Default)]
struct Coming {
    slots: HashMap<u128, (Instant, Arc<Slot<Bytes>>)>,
}

impl Coming {
    /// Adds the fetch of the object named `key`; false (not added) when [`AHEAD`] are waiting
    /// and none of them is stale: the batches asked for first are needed
    /// first, so the last asked for wait their turn.
    fn add(&mut self, key: u128, slot: Arc<Slot<Bytes>>) -> bool {
        if self.slots.len() >= AHEAD {
            let now = Instant::now();
            self.slots.retain(|_, (at, _)| now.duration_since(*at) < STALE);
            if self.slots.len() >= AHEAD {
                return false;
            }
        }
        self.slots.insert(key, (Instant::now(), slot));
        true
    }

    /// The fetch of the object named `key`, if it was fetched ahead; it is
    /// no longer.
    fn take(&mut self, key: u128) -> Option<Arc<Slot<Bytes>>> {
        self.slots.remove(&key).map(|(_, slot)| slot)
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        local_copy::release(self.end.load(Ordering::Acquire));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_fetched_ahead_wait_their_turn_past_the_bound() {
        let mut coming = Coming::default();
        let late = AHEAD as u128;
        for i in 0..late {
            assert!(coming.add(i, Arc::default()), "{i}");
        }
        assert!(!coming.add(late, Arc::default()), "the next batches' fetches wait");
        assert!(coming.take(0).is_some() && coming.take(0).is_none(), "taken once");
        assert!(coming.add(late, Arc::default()), "room again");
        // One not asked for within STALE makes room.
        coming.slots.get_mut(&1).expect("1").0 -= STALE;
        assert!(coming.add(late + 1, Arc::default()));
        assert!(coming.take(1).is_none(), "the stale one was dropped");
    }

    #[test]
    fn an_object_is_named_by_its_url_and_etag_as_the_node_pile_names_text() {
        let url = ObjectUrl::parse("s3://b/train/x.jpg").expect("url");
        let etag = Some("\"e1\"".to_owned());
        assert_eq!(key(&(url.clone(), etag.clone())), crate::node_pile::hash("s3://b/train/x.jpg \"e1\""));
        assert_eq!(key(&(url.clone(), None)), crate::node_pile::hash("s3://b/train/x.jpg "));
        assert_ne!(key(&(url.clone(), etag)), key(&(url, Some("\"e2\"".into()))), "another version is another object");
    }
}
