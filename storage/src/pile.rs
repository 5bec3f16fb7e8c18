//! [`Pile`]: many small objects (an image folder's images) kept in one
//! file of the local copy, so a job's later epochs read them from local
//! disk instead of fetching each again.
//!
//! One unlinked file per pile (a dataset's life), appended to as objects
//! arrive, with an index of where each sits; bytes taken from the local
//! copy's budget (`crate::local_copy`) and given back when the pile goes.
//! An object that does not fit the budget is simply not kept.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Mutex, OnceLock};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::{ObjectUrl, StorageError, get_many, local_copy};

/// Small objects kept on local disk.
#[derive(Debug)]
pub struct Pile {
    /// Made when the first object is kept; None inside when none could be
    /// made: nothing is kept.
    file: OnceLock<Option<File>>,
    /// Where each kept object sits: (offset, length), by URL.
    index: Mutex<HashMap<String, (u64, u64)>>,
    /// The file's end: where the next object goes.
    end: AtomicU64,
}

impl Default for Pile {
    fn default() -> Self {
        Self { file: OnceLock::new(), index: Mutex::default(), end: AtomicU64::new(0) }
    }
}

impl Pile {
    /// The bytes of every object of `objects` (its URL and the ETag it must
    /// have), in order: kept ones from local disk, the others fetched at
    /// once (`crate::get_many`) and kept while the budget allows.
    pub fn get_many(&self, objects: &[(ObjectUrl, Option<String>)]) -> Vec<Result<Bytes, StorageError>> {
        let names: Vec<String> = objects.iter().map(|(u, _)| u.to_string()).collect();
        let mut out: Vec<Option<Result<Bytes, StorageError>>> = names.iter().map(|n| self.read(n)).collect();
        let missing: Vec<usize> = (0..objects.len()).filter(|&i| out[i].is_none()).collect();
        let wanted: Vec<_> = missing.iter().map(|&i| objects[i].clone()).collect();
        for (i, fetched) in missing.into_iter().zip(get_many(&wanted)) {
            if let Ok(bytes) = &fetched {
                self.keep(&names[i], bytes);
            }
            out[i] = Some(fetched);
        }
        out.into_iter()
            .zip(&names)
            .map(|(r, n)| r.unwrap_or_else(|| Err(StorageError::new(n.as_str(), crate::ErrorKind::Unavailable, "not read"))))
            .collect()
    }

    /// The kept bytes of `name`, if kept and readable.
    fn read(&self, name: &str) -> Option<Result<Bytes, StorageError>> {
        let (offset, len) = *self.index.lock().unwrap_or_else(|p| p.into_inner()).get(name)?;
        let file = self.file.get()?.as_ref()?;
        let mut bytes = vec![0; usize::try_from(len).ok()?];
        // A local read that fails is a fetch, not an error.
        file.read_exact_at(&mut bytes, offset).ok()?;
        Some(Ok(Bytes::from(bytes)))
    }

    /// Appends `bytes` as `name`'s, if the budget allows.
    fn keep(&self, name: &str, bytes: &Bytes) {
        let Some(file) = self.file.get_or_init(local_copy::file) else { return };
        let len = bytes.len() as u64;
        if !local_copy::reserve(len) {
            return;
        }
        let offset = self.end.fetch_add(len, Ordering::AcqRel);
        match file.write_all_at(bytes, offset) {
            Ok(()) => {
                self.index.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_owned(), (offset, len));
            }
            Err(e) => tracing::debug!("{name} not kept on local disk: {e}"),
        }
    }
}

impl Drop for Pile {
    fn drop(&mut self) {
        local_copy::release(self.end.load(Ordering::Acquire));
    }
}
