//! [`MappedFile`]: a read-only mapping of a dataset file that cannot take
//! the worker down when the file changes under it.
//!
//! Token, npy and tar files are read through `mmap`: a sample is one copy
//! from the page cache into the batch, with no system call. The price of a
//! mapping is that a page past the file's end faults with SIGBUS, and
//! SIGBUS kills the process: a file truncated or replaced by a data
//! pipeline while a job reads it, an NFS hiccup or a disk error used to
//! kill every worker reading it, and with them every other job they served.
//!
//! The fast path stays a plain copy. What changes is what a fault does:
//! every mapping is registered in a fixed table, and a SIGBUS handler
//! (installed once, chained to whatever handler was there) that finds the
//! faulting address in a registered mapping maps one anonymous page of
//! zeros over the faulting page and counts the fault on that mapping; the
//! interrupted copy then completes, reading zeros. A dataset checks
//! [`MappedFile::intact`] after each read (one atomic load) and turns a
//! counted fault into the job's corrupt-sample error naming the file and
//! the offset, so the job fails or skips per its `on_corrupt` while the
//! worker and its other jobs go on. Once faulted, a mapping stays
//! "changed": its later reads are errors too (its zero pages would
//! otherwise read as data). A fault at an address no mapping here holds is
//! handed to the previous handler, as if this one were not there.
//!
//! Alternatives measured against this in docs/reliability.md: `pread` per
//! sample costs a system call per row (1,024 a batch of npy rows), and a
//! size check before each read still races the truncation.

use std::fs::File;
use std::io;
use std::sync::{Once, OnceLock};
use std::sync::atomic::{AtomicUsize, Ordering};

use memmap2::Mmap;
use nix::libc;

/// Mappings that can be registered at once; a file mapped beyond them is
/// mapped unguarded (said once in the log). Zero-initialized, so the
/// table costs no memory until used.
const SLOTS: usize = 1 << 16;

/// One registered mapping: `[start, start + len)`, and its faults.
struct Slot {
    /// Start address; 0 for a free slot. Written last when registering,
    /// first when unregistering, so the handler never pairs it with a
    /// stale `len`.
    start: AtomicUsize,
    /// Length in bytes.
    len: AtomicUsize,
    /// 1 + the offset of the first faulting page; 0 while intact.
    fault: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot { start: AtomicUsize::new(0), len: AtomicUsize::new(0), fault: AtomicUsize::new(0) };

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];

/// Slots ever used: the handler scans only these.
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// The page size, read once before the handler can run.
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// The handler that was installed before ours, for faults not ours.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

static INSTALL: Once = Once::new();

/// A read-only mapping of a whole file, registered with the SIGBUS guard.
#[derive(Debug)]
pub(crate) struct MappedFile {
    /// Dropped after the slot is freed (field order: see `Drop`).
    map: Mmap,
    /// The table slot, or None when the table was full.
    slot: Option<usize>,
}

/// A mapping that faulted: the file changed under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Changed {
    /// The offset in the file of the first page that could not be read.
    pub(crate) offset: u64,
}

impl MappedFile {
    /// Maps `file` read-only and registers the mapping.
    pub(crate) fn map(file: &File) -> io::Result<Self> {
        install();
        // SAFETY: a read-only private mapping of a file this process
        // opened. Another process may truncate or rewrite the file while it
        // is mapped: reads then see the new bytes or fault, and a fault is
        // turned into zeros plus a counted change by the guard (module
        // docs), never a crash.
        let map = unsafe { Mmap::map(file) }?;
        let slot = register(map.as_ptr() as usize, map.len());
        Ok(Self { map, slot })
    }

    /// The file's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Ok while no read of this mapping faulted; otherwise where the file
    /// stopped being readable. Call it after reading a sample: a read that
    /// faulted copied zeros.
    #[inline]
    pub(crate) fn intact(&self) -> Result<(), Changed> {
        match self.slot.map_or(0, |s| TABLE[s].fault.load(Ordering::Acquire)) {
            0 => Ok(()),
            at => Err(Changed { offset: (at - 1) as u64 }),
        }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        if let Some(s) = self.slot {
            let slot = &TABLE[s];
            slot.start.store(0, Ordering::Release);
            slot.len.store(0, Ordering::Release);
            slot.fault.store(0, Ordering::Release);
        }
        // `map` unmaps after this, replaced pages included.
    }
}

/// Claims a free slot for `[start, start + len)`.
fn register(start: usize, len: usize) -> Option<usize> {
    if start == 0 || len == 0 {
        return None;
    }
    for (i, slot) in TABLE.iter().enumerate() {
        // `len` doubles as the claim: a slot is taken once its len is set.
        if slot.len.compare_exchange(0, len, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            slot.fault.store(0, Ordering::Release);
            slot.start.store(start, Ordering::Release);
            HIGH.fetch_max(i + 1, Ordering::AcqRel);
            return Some(i);
        }
    }
    static FULL: Once = Once::new();
    FULL.call_once(|| {
        tracing::warn!("{SLOTS} dataset files are mapped at once: later ones are not guarded against changing under the worker");
    });
    None
}

/// Installs the SIGBUS handler, once per process.
fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: zeroed sigactions are valid values to fill in; the
        // handler only uses async-signal-safe operations (atomics, mmap as
        // a raw system call, sigaction). The previous handler is read
        // first and kept before ours is installed, so the handler always
        // finds it.
        unsafe {
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
                return;
            }
            let _ = PREVIOUS.set(previous);
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
        }
    });
}

/// The SIGBUS handler (module docs).
extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = PAGE.load(Ordering::Relaxed);
    let high = HIGH.load(Ordering::Acquire);
    for slot in &TABLE[..high] {
        let start = slot.start.load(Ordering::Acquire);
        let len = slot.len.load(Ordering::Acquire);
        if start == 0 || addr < start || addr - start >= len {
            continue;
        }
        let at = addr & !(page - 1);
        // SAFETY: `at` is the page holding the faulting address, inside a
        // mapping this process registered and still holds (a slot is freed
        // before its mapping is unmapped); MAP_FIXED replaces that one page
        // of it with zeros, which the mapping's owner unmaps with the rest.
        let replaced = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if replaced != libc::MAP_FAILED {
            // `start` is page-aligned (mmap's), so `at >= start`.
            let _ = slot.fault.compare_exchange(0, at - start + 1, Ordering::AcqRel, Ordering::Relaxed);
            return;
        }
        break;
    }
    // Not ours (or the page could not be replaced): as if this handler
    // were not installed.
    match PREVIOUS.get() {
        Some(prev) if prev.sa_sigaction != libc::SIG_DFL && prev.sa_sigaction != libc::SIG_IGN => {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: a handler installed with SA_SIGINFO takes these.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(signal, info, context);
            } else {
                // SAFETY: a plain handler takes the signal number.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(signal);
            }
        }
        _ => {
            // The default action: restore it and return, so the faulting
            // access runs again and the signal kills the process as it
            // would have.
            // SAFETY: a zeroed sigaction with SIG_DFL is valid.
            unsafe {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests;
