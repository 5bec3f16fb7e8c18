//! [`ObjectReader`]: an object read as a file is (`Read + Seek`), for code
//! that walks a file from its start: a tar shard's member index, an npy
//! header, a Parquet footer. Reads come out of the object's chunks
//! (`crate::object`), and the next few chunks are asked for ahead of the
//! reader, so a sequential walk keeps requests in flight.

use std::io::{self, Read, Seek, SeekFrom};
use std::sync::Arc;

use crate::object::{CHUNK, RemoteObject};

/// Chunks asked for ahead of a sequential reader.
const READ_AHEAD: u64 = 4;

/// A position in an object, read through its chunks.
#[derive(Debug)]
pub struct ObjectReader {
    object: Arc<RemoteObject>,
    pos: u64,
}

impl ObjectReader {
    /// Reads `object` from its start.
    pub fn new(object: Arc<RemoteObject>) -> Self {
        Self { object, pos: 0 }
    }

    /// The object read.
    pub fn object(&self) -> &Arc<RemoteObject> {
        &self.object
    }
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let size = self.object.size();
        if self.pos >= size || buf.is_empty() {
            return Ok(0);
        }
        // Up to the end of the chunk the position is in: one wait at most.
        let chunk_end = (self.pos / CHUNK + 1) * CHUNK;
        let n = (buf.len() as u64).min(size - self.pos).min(chunk_end - self.pos) as usize;
        self.object.prefetch(chunk_end..chunk_end + READ_AHEAD * CHUNK);
        self.object.read_at(self.pos, &mut buf[..n]).map_err(io::Error::other)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for ObjectReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let size = self.object.size();
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => size.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start of the object"))?;
        Ok(self.pos)
    }
}
