//! The host's blob directory: where the blobs of jobs (files a job needs
//! beside its spec, named by their SHA-256; see `loader_proto::blob`) sit
//! once per host and user, so that a 100 MB pickled dataset is fetched once
//! per host, not once per worker, and a trainer's co-located workers read
//! the file it wrote without fetching at all.
//!
//! Where ([`default_path`]): `$LOADER_BLOB_DIR`, else
//! `$XDG_RUNTIME_DIR/loader-blobs` (per user, in memory, emptied at logout),
//! else `$TMPDIR/loader-blobs-<uid>` (`/tmp` without `TMPDIR`). Opening it
//! ([`BlobDir::open`]) creates it 0700 and refuses, in one line, a path
//! that is not a directory of this user, or one others may write to: anyone
//! who could plant a file there could choose what a worker unpickles.
//!
//! The files: `<sha256>` (64 lowercase hex digits), read-only, written only
//! whole: into a temporary file of a unique name, hashed on the way, checked
//! and renamed into place ([`BlobDir::obtain`]), so a reader never sees a
//! partial blob and writers racing on one blob cannot corrupt it (the last
//! rename wins, with the same bytes). A lock file (`<sha256>.lock`, flock)
//! makes a second worker wait for the first one's fetch instead of fetching
//! again. Nothing depends on a file staying: a trainer removes the ones it
//! wrote when its loader closes, [`BlobDir::sweep`] removes those nobody used
//! for an hour, and a worker that finds a blob gone fetches it again.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// The hash blobs are named by, the protocol's (`loader_proto::blob`):
/// re-exported here, where blob files are written and checked.
pub use loader_proto::blob::{Sha256, hash_file};

/// Environment variable naming the blob directory outright.
pub const BLOB_DIR_ENV: &str = "LOADER_BLOB_DIR";

/// How long a blob file may go unused before a sweep removes it.
pub const UNUSED_FOR: Duration = Duration::from_secs(3600);

/// Most directory entries one sweep looks at, so a worker's start stays
/// quick whatever a directory holds; later starts see the rest.
pub const SWEEP_ENTRIES: usize = 4096;

/// Prefix of temporary files (hidden, so a listing shows blobs only).
const TEMP_PREFIX: &str = ".tmp-";

/// Why the blob directory cannot be used; one line saying what to do.
#[derive(Debug, thiserror::Error)]
pub enum BlobDirError {
    /// It cannot be created or read.
    #[error("blob directory {}: {source} (set {BLOB_DIR_ENV} to a directory of yours)", path.display())]
    Io {
        /// The directory.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// It is not a private directory of this user.
    #[error("blob directory {}: {problem}; chmod it 0700 or set {BLOB_DIR_ENV} to a directory of yours", path.display())]
    NotOurs {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
}

/// The blob directory the environment names (see the module docs), from
/// the variables `var` reads, so that tests need not set any.
pub fn default_path(var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set(BLOB_DIR_ENV) {
        return dir;
    }
    if let Some(runtime) = set("XDG_RUNTIME_DIR") {
        return runtime.join("loader-blobs");
    }
    let tmp = set("TMPDIR").unwrap_or_else(|| PathBuf::from("/tmp"));
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    tmp.join(format!("loader-blobs-{uid}"))
}

/// [`default_path`] of this process's environment.
pub fn path_from_env() -> PathBuf {
    default_path(|name| std::env::var_os(name))
}

/// An open blob directory (see the module docs).
#[derive(Debug, Clone)]
pub struct BlobDir {
    path: PathBuf,
}

/// Why [`BlobDir::obtain`] could not put a blob in place.
#[derive(Debug, thiserror::Error)]
pub enum ObtainError<E> {
    /// Reading or writing the directory failed.
    #[error("blob directory {}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// What filled the blob failed.
    #[error(transparent)]
    Fill(E),
    /// The bytes written are not the blob asked for.
    #[error("blob {sha256}: received {got_size} bytes hashing to {got_sha256}, expected {size} bytes")]
    Mismatch {
        /// The blob asked for.
        sha256: String,
        /// Its size.
        size: u64,
        /// What arrived.
        got_sha256: String,
        /// How much arrived.
        got_size: u64,
    },
}

impl BlobDir {
    /// Opens (creating it 0700 if needed) the blob directory at `path`;
    /// refuses one that is not a directory of this user, or that others
    /// may write to.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, BlobDirError> {
        let path = path.into();
        let io = |source| BlobDirError::Io { path: path.clone(), source };
        match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e)),
        }
        let meta = std::fs::symlink_metadata(&path).map_err(io)?;
        let not_ours = |problem: String| BlobDirError::NotOurs { path: path.clone(), problem };
        if !meta.is_dir() {
            return Err(not_ours("not a directory (symbolic links are refused)".into()));
        }
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        if meta.uid() != uid {
            return Err(not_ours(format!("owned by uid {}, not this user (uid {uid})", meta.uid())));
        }
        // Others writing could plant a blob; others reading is the
        // choice of whoever made the directory (one made here is 0700).
        let mode = meta.mode() & 0o777;
        if mode & 0o022 != 0 {
            return Err(not_ours(format!("mode {mode:04o} lets other users write")));
        }
        Ok(Self { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the blob `sha256` lives (whether or not it is there).
    pub fn file_of(&self, sha256: &str) -> PathBuf {
        self.path.join(sha256)
    }

    /// The blob `sha256`, open, when it is here with `size` bytes; its use
    /// is recorded (modification time), so a sweep keeps it another while.
    /// The open file reads the same bytes even if the name is removed next.
    pub fn open_blob(&self, sha256: &str, size: u64) -> Option<File> {
        let file = File::open(self.file_of(sha256)).ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.len() != size {
            return None;
        }
        // Best effort: a blob whose time cannot be set is swept sooner.
        let _ = file.set_modified(SystemTime::now());
        Some(file)
    }

    /// The blob `sha256` of `size` bytes, open: the file here when it is
    /// present, else one `fill` writes (into a temporary file, hashed on
    /// the way; the bytes must hash to `sha256`), renamed into place
    /// read-only. While one process fills a blob, others asking for it wait
    /// up to `patience` for it to appear (then fill it themselves: slower,
    /// never wrong).
    pub fn obtain<E>(
        &self,
        sha256: &str,
        size: u64,
        patience: Duration,
        fill: impl FnOnce(&mut BlobWriter) -> Result<(), E>,
    ) -> Result<File, ObtainError<E>> {
        if let Some(file) = self.open_blob(sha256, size) {
            return Ok(file);
        }
        let _lock = self.lock(sha256, patience);
        if let Some(file) = self.open_blob(sha256, size) {
            return Ok(file);
        }
        let (temp, file) = self.create_temp()?;
        // Removes the temporary file on every way out but the rename.
        let mut writer = BlobWriter { file, temp: Some(temp), sha: Sha256::default() };
        fill(&mut writer).map_err(ObtainError::Fill)?;
        let (got_sha256, got_size) = (writer.sha.clone().finish(), writer.sha.len());
        if got_sha256 != sha256 || got_size != size {
            return Err(ObtainError::Mismatch { sha256: sha256.to_owned(), size, got_sha256, got_size });
        }
        writer.publish(&self.file_of(sha256))
    }

    /// Holds `<sha256>.lock` (flock), waiting up to `patience` for another
    /// holder; None when it could not be had (the caller goes on without).
    fn lock(&self, sha256: &str, patience: Duration) -> Option<File> {
        let path = self.path.join(format!("{sha256}.lock"));
        let file = OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(path).ok()?;
        let deadline = Instant::now() + patience;
        loop {
            match file.try_lock() {
                Ok(()) => return Some(file),
                Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(_) => return None,
            }
        }
    }

    /// A new temporary file of a name no other process uses.
    fn create_temp<E>(&self) -> Result<(PathBuf, File), ObtainError<E>> {
        let mut last = None;
        for attempt in 0..16u32 {
            let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
            let name = format!("{TEMP_PREFIX}{}-{nanos:08x}-{attempt}", std::process::id());
            let path = self.path.join(name);
            match OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
                Ok(file) => return Ok((path, file)),
                Err(e) => last = Some((path, e)),
            }
        }
        let (path, source) = last.unwrap_or_else(|| (self.path.clone(), io::Error::other("no attempt made")));
        Err(ObtainError::Io { path, source })
    }

    /// Removes blob files, lock files and temporary files nobody has used
    /// (modified or read) for `unused_for`, looking at `max_entries`
    /// entries at most. Returns how many files it removed.
    pub fn sweep(&self, unused_for: Duration, max_entries: usize) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.path) else { return 0 };
        let Some(cutoff) = SystemTime::now().checked_sub(unused_for) else { return 0 };
        let mut removed = 0;
        for entry in entries.take(max_entries).flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let ours = loader_like(name);
            let Ok(meta) = entry.metadata() else { continue };
            if !ours || !meta.is_file() {
                continue;
            }
            let last_use = [meta.modified(), meta.accessed()].into_iter().flatten().max();
            if last_use.is_some_and(|t| t < cutoff) && std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }
}

/// True for the names this module makes: a blob, its lock, a temporary.
fn loader_like(name: &str) -> bool {
    let blob = name.strip_suffix(".lock").unwrap_or(name);
    is_blob_name(blob) || name.starts_with(TEMP_PREFIX)
}

/// 64 lowercase hex digits: `loader_proto::blob::is_sha256_hex`, which this
/// crate, below the protocol, cannot call.
fn is_blob_name(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The temporary file a blob is written into by [`BlobDir::obtain`]'s
/// `fill`, hashed as it is written.
#[derive(Debug)]
pub struct BlobWriter {
    file: File,
    /// The temporary file, until it is renamed into place.
    temp: Option<PathBuf>,
    /// What was written so far, hashed.
    sha: Sha256,
}

impl BlobWriter {
    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.sha.len()
    }

    /// True before anything was written.
    pub fn is_empty(&self) -> bool {
        self.sha.is_empty()
    }

    /// Makes the file read-only and renames it to `to`.
    fn publish<E>(mut self, to: &Path) -> Result<File, ObtainError<E>> {
        let temp = self.temp.take().unwrap_or_default();
        let io = |source| ObtainError::Io { path: temp.clone(), source };
        self.file.set_permissions(std::fs::Permissions::from_mode(0o400)).map_err(io)?;
        std::fs::rename(&temp, to).map_err(io)?;
        File::open(to).map_err(|source| ObtainError::Io { path: to.to_path_buf(), source })
    }
}

impl Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.sha.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if let Some(temp) = self.temp.take() {
            let _ = std::fs::remove_file(temp);
        }
    }
}

#[cfg(test)]
mod tests;
