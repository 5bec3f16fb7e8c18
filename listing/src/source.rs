//! A dataset file opened to be read from its start: a local file, or an
//! object in a store (`s3://bucket/key`, through `loader_storage`), so that
//! every listing rule reads both the same way.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use loader_storage::{ObjectReader, ObjectUrl, RemoteObject};
use parquet::file::reader::{ChunkReader, Length};

use crate::ListingError;

/// A file or an object, read from a position of its own (`pread`: handles
/// that share a descriptor do not move each other's position).
#[derive(Debug)]
pub enum Source {
    /// A local file, and the position in it.
    File(File, u64),
    /// An object in a store.
    Object(ObjectReader),
}

impl Source {
    /// An object already open, read from its start.
    pub fn object(object: Arc<RemoteObject>) -> Self {
        Source::Object(ObjectReader::new(object))
    }
}

/// Opens `path` (a path, or an object's URL) and returns it with its length.
pub(crate) fn open(path: &Path) -> Result<(Source, u64), ListingError> {
    let name = path.to_string_lossy();
    if loader_storage::is_url(&name) {
        let object = ObjectUrl::parse(&name).and_then(|url| RemoteObject::open(&url));
        let object = object.map_err(|e| ListingError { path: e.url, problem: e.problem })?;
        let len = object.size();
        return Ok((Source::Object(ObjectReader::new(object)), len));
    }
    let file = File::open(path).map_err(|e| ListingError::io(path, &e))?;
    let len = file.metadata().map_err(|e| ListingError::io(path, &e))?.len();
    Ok((Source::File(file, 0), len))
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Source::File(f, pos) => {
                let n = f.read_at(buf, *pos)?;
                *pos += n as u64;
                Ok(n)
            }
            Source::Object(o) => o.read(buf),
        }
    }
}

impl Seek for Source {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        match self {
            Source::File(f, pos) => {
                let len = f.metadata()?.len();
                let to = match to {
                    SeekFrom::Start(p) => Some(p),
                    SeekFrom::End(d) => len.checked_add_signed(d),
                    SeekFrom::Current(d) => pos.checked_add_signed(d),
                };
                *pos = to.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start of the file"))?;
                Ok(*pos)
            }
            Source::Object(o) => o.seek(to),
        }
    }
}

/// A Parquet file or object, as the `parquet` crate's readers take it: the
/// footer and the column chunks a reader asks for, read with `pread` from a
/// local file or out of an object's chunks.
#[derive(Debug)]
pub enum ParquetSource {
    /// A local file.
    File(File),
    /// An object in a store.
    Object(Arc<RemoteObject>),
}

impl ParquetSource {
    /// Opens `path` (a path, or an object's URL).
    pub fn open(path: &Path) -> Result<Self, ListingError> {
        let name = path.to_string_lossy();
        if loader_storage::is_url(&name) {
            let object = ObjectUrl::parse(&name).and_then(|url| RemoteObject::open(&url));
            return object.map(ParquetSource::Object).map_err(|e| ListingError { path: e.url, problem: e.problem });
        }
        File::open(path).map(ParquetSource::File).map_err(|e| ListingError::io(path, &e))
    }

    /// Another handle on the same file or object, for a reader that takes
    /// one of its own (a duplicated descriptor, read only with `pread`; the
    /// same object and chunks).
    pub fn share(&self) -> io::Result<Self> {
        Ok(match self {
            ParquetSource::File(f) => ParquetSource::File(f.try_clone()?),
            ParquetSource::Object(o) => ParquetSource::Object(Arc::clone(o)),
        })
    }
}

impl Length for ParquetSource {
    fn len(&self) -> u64 {
        match self {
            ParquetSource::File(f) => f.metadata().map_or(0, |m| m.len()),
            ParquetSource::Object(o) => o.size(),
        }
    }
}

impl ChunkReader for ParquetSource {
    type T = Source;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Source> {
        let mut read = match self {
            ParquetSource::File(f) => Source::File(f.try_clone()?, 0),
            ParquetSource::Object(o) => Source::Object(ObjectReader::new(Arc::clone(o))),
        };
        read.seek(SeekFrom::Start(start))?;
        Ok(read)
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let mut bytes = vec![0; length];
        match self {
            ParquetSource::File(f) => f.read_exact_at(&mut bytes, start)?,
            ParquetSource::Object(o) => {
                // Every chunk of a column chunk asked for at once.
                o.prefetch(start..start.saturating_add(length as u64));
                o.read_at(start, &mut bytes).map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?;
            }
        }
        Ok(Bytes::from(bytes))
    }
}
