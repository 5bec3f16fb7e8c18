//! A dataset file opened to be read from its start: a local file, or an
//! object in a store (`s3://bucket/key`, through `loader_storage`), so that
//! every listing rule reads both the same way.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use loader_storage::{ObjectReader, ObjectUrl, RemoteObject};

use crate::ListingError;

/// A file or an object, positioned at its start.
#[derive(Debug)]
pub(crate) enum Source {
    File(File),
    Object(ObjectReader),
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
    Ok((Source::File(file), len))
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Source::File(f) => f.read(buf),
            Source::Object(o) => o.read(buf),
        }
    }
}

impl Seek for Source {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        match self {
            Source::File(f) => f.seek(to),
            Source::Object(o) => o.seek(to),
        }
    }
}
