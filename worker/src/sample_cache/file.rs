//! A sample cache's file: made (a memfd, or an unnamed file in a
//! directory) with its header and slots' space taken up front, opened from
//! a descriptor another process made, inherited across `fork` or `exec`
//! from a trainer or `loaderctl run` ([`INHERITED`]), and mapped. Why that
//! can fail is [`CacheError`]: each message says what was wrong.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;

use memmap2::MmapOptions;
use nix::fcntl::OFlag;
use nix::sys::memfd::{MFdFlags, memfd_create};

use super::layout::{HEADER, MAGIC, MAX_ENTRIES, SLOT, Word};
use super::{SampleCache, allocate};

/// The variable a loader's trainer sets in each worker it forks, naming
/// the cache they share: `{"fd": N, "entries": M}`
/// (`python/loader/_template.py`).
pub const INHERITED: &str = "LOADER_SAMPLE_CACHE";

/// Why a cache file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Creating, sizing or mapping the file failed.
    #[error("sample cache: {0}")]
    Io(#[from] io::Error),
    /// The file is not a cache of the expected layout.
    #[error("sample cache: the file is not a sample cache of {entries} entries ({why})")]
    NotACache {
        /// Entries the caller expected.
        entries: u64,
        /// What did not match.
        why: &'static str,
    },
    /// More entries than a cache holds.
    #[error("sample cache: {0} entries is more than the {MAX_ENTRIES} a cache holds")]
    TooManyEntries(u64),
    /// The directory has no room for the cache's index.
    #[error("sample cache: {where_} has no room for the cache's index of {bytes} bytes ({source}); free space there or give another --cache-dir")]
    NoSpace {
        /// The directory (or "memory").
        where_: String,
        /// Bytes the index needs.
        bytes: u64,
        /// The file system's answer.
        source: io::Error,
    },
}

impl SampleCache {
    /// A new cache of `entries` indexes and `capacity` bytes of entries: a
    /// memfd, or an unnamed file in `dir`. The file is sparse: memory (or
    /// disk) is taken as entries are written.
    pub fn create(entries: u64, capacity: u64, dir: Option<&Path>) -> Result<Self, CacheError> {
        let data_at = data_at(entries)?;
        let file = match dir {
            None => File::from(memfd_create("loader-sample-cache", MFdFlags::MFD_CLOEXEC).map_err(io::Error::from)?),
            Some(dir) => OpenOptions::new()
                .read(true)
                .write(true)
                .mode(0o600)
                .custom_flags(OFlag::O_TMPFILE.bits() | OFlag::O_CLOEXEC.bits())
                .open(dir)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?,
        };
        let size = (data_at as u64).checked_add(capacity).ok_or(CacheError::NotACache { entries, why: "too large" })?;
        file.set_len(size)?;
        // The header and slots are written through the mapping: their
        // space is taken now, so a full directory is this one-line error
        // rather than a SIGBUS at the first store.
        if let Err(source) = allocate(&file, 0, data_at as u64) {
            if source.raw_os_error() == Some(nix::libc::ENOSPC) {
                return Err(CacheError::NoSpace { where_: location(&file), bytes: data_at as u64, source });
            }
        }
        let cache = Self::map(file, entries, data_at)?;
        cache.word(Word::Entries).store(entries, Ordering::Relaxed);
        cache.word(Word::Magic).store(MAGIC, Ordering::Release);
        Ok(cache)
    }

    /// Lets processes this one starts with `exec` inherit the cache's
    /// descriptor (it is made close-on-exec): `loaderctl run --cache`
    /// starts its workers so, naming the descriptor in [`INHERITED`]
    /// ([`variable`](Self::variable)).
    pub fn inherit_across_exec(&self) -> io::Result<()> {
        use nix::fcntl::{FcntlArg, FdFlag, fcntl};
        fcntl(self.file.as_fd(), FcntlArg::F_SETFD(FdFlag::empty())).map(drop).map_err(io::Error::from)
    }

    /// The value of [`INHERITED`] that names this cache to a worker that
    /// inherits its descriptor.
    pub fn variable(&self) -> String {
        serde_json::json!({ "fd": self.file.as_raw_fd(), "entries": self.entries }).to_string()
    }

    /// The cache another process created, of `entries` indexes, from its
    /// descriptor.
    pub fn open(file: File, entries: u64) -> Result<Self, CacheError> {
        let data_at = data_at(entries)?;
        let size = file.metadata()?.len();
        if size < data_at as u64 {
            return Err(CacheError::NotACache { entries, why: "too short" });
        }
        let cache = Self::map(file, entries, data_at)?;
        if cache.word(Word::Magic).load(Ordering::Acquire) != MAGIC {
            return Err(CacheError::NotACache { entries, why: "no magic" });
        }
        if cache.word(Word::Entries).load(Ordering::Relaxed) != entries {
            return Err(CacheError::NotACache { entries, why: "made for another number of samples" });
        }
        Ok(cache)
    }

    /// The cache this process inherited from its trainer ([`INHERITED`]),
    /// made for `entries` indexes; None when it inherited none. The
    /// descriptor is reopened, so it stays where it was.
    pub fn inherited(entries: u64) -> Result<Option<Self>, CacheError> {
        let Ok(named) = std::env::var(INHERITED) else {
            return Ok(None);
        };
        let given: serde_json::Value =
            serde_json::from_str(&named).map_err(|_| CacheError::NotACache { entries, why: "the variable is not its JSON" })?;
        let field = |name: &str| given.get(name).and_then(serde_json::Value::as_u64);
        let (Some(fd), Some(made_for)) = (field("fd"), field("entries")) else {
            return Err(CacheError::NotACache { entries, why: "the variable names no descriptor" });
        };
        if made_for != entries {
            return Err(CacheError::NotACache { entries, why: "made for another number of samples" });
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{fd}"))
            .map_err(|e| io::Error::new(e.kind(), format!("descriptor {fd}: {e}")))?;
        Self::open(file, entries).map(Some)
    }

    fn map(file: File, entries: u64, data_at: usize) -> Result<Self, CacheError> {
        let size = file.metadata()?.len();
        let map = MmapOptions::new().map_raw(&file)?;
        if (map.len() as u64) != size {
            return Err(CacheError::NotACache { entries, why: "mapped short" });
        }
        Ok(Self { capacity: size - data_at as u64, file, map, entries, data_at })
    }

    /// The file's descriptor, to hand to a worker.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Where `file` lives, for messages: its directory, or "memory" for a memfd.
pub(super) fn location(file: &File) -> String {
    match std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
        Ok(path) if path.to_string_lossy().starts_with("/memfd:") => "memory (a memfd)".to_owned(),
        Ok(path) => path.parent().map_or_else(|| path.display().to_string(), |dir| dir.display().to_string()),
        Err(_) => "the cache's file system".to_owned(),
    }
}

/// Where the data area of a cache of `entries` starts: after the header and
/// the slots, at a page boundary.
fn data_at(entries: u64) -> Result<usize, CacheError> {
    if entries > MAX_ENTRIES {
        return Err(CacheError::TooManyEntries(entries));
    }
    let end = HEADER + entries as usize * SLOT;
    Ok(end.div_ceil(4096) * 4096)
}
