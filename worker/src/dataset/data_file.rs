//! [`DataFile`]: one dataset file's bytes, read the same way whether the
//! file is on local disk or an object in a store.
//!
//! A local file is mapped (`crate::mapped`): a read is a copy out of the
//! page cache, and a file that changes under the mapping is the job's
//! corrupt-sample error, not a SIGBUS. An object (`s3://bucket/key`) is read
//! in chunks kept on local disk (`loader_storage::object`): a read is a
//! copy out of its chunks, and an object that changes since the open is the
//! same corrupt-sample error. Datasets (tokens, npy, WebDataset shards) see
//! one interface: `read_at` a range, `prefetch` the ranges read next.

use std::fs::File;
use std::sync::Arc;

use loader_storage::{ObjectUrl, RemoteObject};

use super::{DatasetError, prefetch};
use crate::mapped::MappedFile;

/// A dataset file, mapped or in a store.
#[derive(Debug)]
pub(crate) enum DataFile {
    /// A local file, mapped whole.
    Mapped { map: MappedFile, path: String },
    /// An object, read in chunks.
    Object(Arc<RemoteObject>),
}

impl DataFile {
    /// Opens `name` (a path, or an object's URL) for a `kind` dataset.
    pub(crate) fn open(kind: &'static str, name: &str) -> Result<Self, DatasetError> {
        if loader_storage::is_url(name) {
            let object = ObjectUrl::parse(name).and_then(|url| RemoteObject::open(&url));
            return object.map(DataFile::Object).map_err(|e| DatasetError::storage(kind, e));
        }
        let open_err = |source| DatasetError::Open { kind, path: name.to_owned(), source };
        let file = File::open(name).map_err(open_err)?;
        Ok(DataFile::Mapped { map: MappedFile::map(&file).map_err(open_err)?, path: name.to_owned() })
    }

    /// Its length in bytes, as opened.
    pub(crate) fn len(&self) -> u64 {
        match self {
            DataFile::Mapped { map, .. } => map.bytes().len() as u64,
            DataFile::Object(object) => object.size(),
        }
    }

    /// The file's name, as the spec gives it.
    pub(crate) fn name(&self) -> &str {
        match self {
            DataFile::Mapped { path, .. } => path,
            DataFile::Object(object) => object.url(),
        }
    }

    /// Whether `len` bytes at `offset` lie within the file.
    pub(crate) fn holds(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len())
    }

    /// Copies the `dst.len()` bytes at `offset` into `dst`. The caller checks
    /// the range with [`holds`](Self::holds) first; a range past the end is
    /// the file's change (it was opened longer).
    pub(crate) fn read_at(&self, kind: &'static str, offset: u64, dst: &mut [u8]) -> Result<(), DatasetError> {
        match self {
            DataFile::Mapped { map, path } => {
                let bytes = usize::try_from(offset)
                    .ok()
                    .and_then(|start| map.bytes().get(start..start.checked_add(dst.len())?));
                let Some(bytes) = bytes else {
                    return Err(DatasetError::Corrupt {
                        path: path.clone(),
                        reason: format!("bytes {offset}..+{} are past the end of the file", dst.len()),
                    });
                };
                dst.copy_from_slice(bytes);
                self.intact()
            }
            DataFile::Object(object) => object.read_at(offset, dst).map_err(|e| DatasetError::storage(kind, e)),
        }
    }

    /// The `len` bytes at `offset`, in a buffer of their own.
    pub(crate) fn read_vec(&self, kind: &'static str, offset: u64, len: u64) -> Result<Vec<u8>, DatasetError> {
        let len = usize::try_from(len).map_err(|_| DatasetError::Corrupt {
            path: self.name().to_owned(),
            reason: format!("a member of {len} bytes is too large"),
        })?;
        let mut bytes = vec![0; len];
        self.read_at(kind, offset, &mut bytes)?;
        Ok(bytes)
    }

    /// The `len` bytes at `offset` of a mapped file, borrowed (None for an
    /// object, or a range the mapping does not hold). Whoever reads them
    /// checks [`intact`](Self::intact) afterwards.
    pub(crate) fn mapped(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let DataFile::Mapped { map, .. } = self else { return None };
        let start = usize::try_from(offset).ok()?;
        map.bytes().get(start..start.checked_add(usize::try_from(len).ok()?)?)
    }

    /// Whether every read of a mapping so far found the file as it was
    /// (`crate::mapped`); an object's reads say so themselves.
    pub(crate) fn intact(&self) -> Result<(), DatasetError> {
        match self {
            DataFile::Mapped { map, path } => map.intact().map_err(|c| DatasetError::changed(path, c)),
            DataFile::Object(_) => Ok(()),
        }
    }

    /// Hints that the `len` bytes at `offset` are read soon: a mapping's
    /// pages are touched, an object's chunks asked for.
    pub(crate) fn prefetch(&self, offset: u64, len: usize) {
        match self {
            DataFile::Mapped { map, .. } => {
                let range = usize::try_from(offset).ok().and_then(|s| map.bytes().get(s..s.checked_add(len)?));
                if let Some(bytes) = range {
                    prefetch::bytes(bytes);
                }
            }
            DataFile::Object(object) => object.prefetch(offset..offset.saturating_add(len as u64)),
        }
    }

    /// Tells an object that its samples are read `samples` at a time (a
    /// shuffled read's first batch is then fetched sample by sample whole,
    /// `loader_storage::object`); a mapping needs nothing.
    pub(crate) fn read_in_batches_of(&self, samples: usize) {
        if let DataFile::Object(object) = self {
            object.read_in_batches_of(samples);
        }
    }

    /// The object, for a file in a store.
    pub(crate) fn object(&self) -> Option<&Arc<RemoteObject>> {
        match self {
            DataFile::Object(object) => Some(object),
            DataFile::Mapped { .. } => None,
        }
    }

    /// Whether reads may wait on a network (and are worth asking for all at
    /// once, a batch at a time): an object not yet here whole.
    pub(crate) fn may_fetch(&self) -> bool {
        matches!(self, DataFile::Object(object) if !object.is_here_whole())
    }
}
