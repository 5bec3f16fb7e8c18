//! The ring's shared memory, and the only `unsafe` of the trainer's side of
//! the shared-memory transport.
//!
//! One sealed memfd holds every slot, then the doorbell page
//! ([`crate::doorbell`]); the trainer maps it shared and keeps the
//! descriptor only to pass it to workers. The mapping is writable because
//! a held slot is the trainer's own memory: the Python SDK hands it to torch
//! through DLPack, and torch has no read-only tensors, so over a read-only
//! mapping an in-place op (`x.sub_(mean)`) would kill the trainer with
//! SIGSEGV. Rust code here never writes it. A [`SlotView`] is the single
//! way to read a slot: it exists only for a slot the book holds for the user
//! (filled, not granted to any worker), covers only the bytes the worker
//! reported, and gives the slot back to the book when dropped.

use std::fs::File;
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};

use super::RingError;
use super::book::SlotRelease;
use crate::doorbell::Doorbell;
use crate::frame::RingGeometry;

/// Name of the memfd, as `/proc/<pid>/fd` and `/proc/<pid>/maps` show it
/// (`/memfd:loader-ring (deleted)`). Never a path: nothing to clean up.
pub(crate) const MEMFD_NAME: &str = "loader-ring";

/// The ring's memfd, mapped (shared, writable) in this process.
#[derive(Debug)]
pub(crate) struct RingMemory {
    /// The one descriptor of the ring in this process; lent to workers over
    /// SCM_RIGHTS (the kernel duplicates it into theirs).
    file: File,
    /// Shared. Raw because workers write slots this process does not hold:
    /// no `&[u8]` may cover more than one held slot.
    map: MmapRaw,
    /// Where the slots lie; the doorbell page follows them, and
    /// `file_len_with_doorbell()` equals `map.len()`.
    geometry: RingGeometry,
}

impl RingMemory {
    /// Creates the memfd, sizes it, seals its size and maps it. The geometry
    /// must be valid (see [`super::RingConfig::geometry`]).
    pub(crate) fn create(geometry: RingGeometry) -> Result<Arc<Self>, RingError> {
        let len = geometry
            .file_len_with_doorbell()
            .and_then(|l| usize::try_from(l).ok())
            .ok_or_else(|| {
                RingError::Config("the ring's size overflows this address space".into())
            })?;
        let fd = memfd_create(
            MEMFD_NAME,
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )
        .map_err(|e| RingError::Memory(format!("memfd_create: {e}")))?;
        let file = File::from(fd);
        file.set_len(len as u64)
            .map_err(|e| RingError::Memory(format!("cannot size the ring to {len} bytes: {e}")))?;
        // A worker that shrank the file under our mapping would turn every
        // read of the lost pages into SIGBUS; sealed, no one can.
        let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
        fcntl(&file, FcntlArg::F_ADD_SEALS(seals))
            .map_err(|e| RingError::Memory(format!("cannot seal the ring's memfd: {e}")))?;
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| RingError::Memory(format!("cannot map the ring: {e}")))?;
        if map.len() != len {
            return Err(RingError::Memory(
                "the kernel mapped a different length".into(),
            ));
        }
        let memory = Arc::new(Self {
            file,
            map,
            geometry,
        });
        memory.doorbell().disarm();
        Ok(memory)
    }

    /// The descriptor to pass to a worker.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Slot size and count.
    pub(crate) fn geometry(&self) -> RingGeometry {
        self.geometry
    }

    /// The doorbell words, after the slots.
    pub(crate) fn doorbell(&self) -> &Doorbell {
        // The ring's size was checked to fit; the page follows the slots.
        let offset = self.geometry.total_len().unwrap_or(0) as usize;
        // SAFETY: `create` mapped `file_len_with_doorbell()` bytes, so the
        // doorbell page (DOORBELL_LEN >= size_of::<Doorbell>() bytes at
        // `offset`) lies inside the mapping, which `self.map` keeps alive
        // for the lifetime of the reference. `offset` is a multiple of the
        // slot size, itself a multiple of the page size, and the mapping is
        // page-aligned, so the pointer is aligned for `Doorbell`. Its fields
        // are atomics, the only way either process touches those bytes (a
        // fresh memfd is zeroed: `reported` starts at 0; `wake_at` 0 would
        // only ask for one early wake-up, and it is written before any
        // worker attaches).
        unsafe { &*self.map.as_ptr().add(offset).cast::<Doorbell>() }
    }

    /// Address range of the whole mapping, to tell ring-backed bytes apart.
    pub(crate) fn address_range(&self) -> Range<usize> {
        let start = self.map.as_ptr() as usize;
        start..start + self.map.len()
    }
}

/// The first `len` bytes of one held slot. Dropping it gives the slot back
/// to the book, which grants it again with a new generation.
#[derive(Debug)]
pub(crate) struct SlotView {
    /// Keeps the mapping alive for as long as the view.
    memory: Arc<RingMemory>,
    /// Bytes of the batch in the mapping: inside one slot.
    range: Range<usize>,
    /// Holds the slot for the view; returns it to the book on drop.
    _release: SlotRelease,
}

/// Why a view of a slot cannot be made: the book's range does not fit the
/// ring. Only a bug could cause it; it is checked anyway because a wrong
/// range would be an out-of-bounds read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bytes {start}..{end} lie outside slot {slot} of the ring")]
pub(crate) struct OutsideSlot {
    /// Slot named.
    pub(crate) slot: u32,
    /// Start of the requested bytes, in the ring.
    pub(crate) start: usize,
    /// End of the requested bytes, in the ring.
    pub(crate) end: usize,
}

/// The bytes `[..len]` of `slot` in a ring of `geometry`, or None when they
/// do not lie inside that slot. Pure, so it is tested on its own.
pub(crate) fn slot_bytes(geometry: RingGeometry, slot: u32, len: u64) -> Option<Range<usize>> {
    let whole = geometry.slot_range(slot)?;
    let len = usize::try_from(len).ok()?;
    let end = whole.start.checked_add(len)?;
    (end <= whole.end).then_some(whole.start..end)
}

impl SlotView {
    /// A view of the first `len` bytes of the slot `release` holds. The
    /// caller (the book) guarantees the slot is held for the user: filled
    /// and granted to no worker.
    pub(crate) fn new(
        memory: Arc<RingMemory>,
        release: SlotRelease,
        len: u64,
    ) -> Result<Self, OutsideSlot> {
        let slot = release.slot();
        let Some(range) = slot_bytes(memory.geometry, slot, len) else {
            let start = memory.geometry.slot_range(slot).map_or(0, |r| r.start);
            return Err(OutsideSlot {
                slot,
                start,
                end: start.saturating_add(len as usize),
            });
        };
        if range.end > memory.map.len() {
            return Err(OutsideSlot {
                slot,
                start: range.start,
                end: range.end,
            });
        }
        Ok(Self {
            memory,
            range,
            _release: release,
        })
    }
}

impl AsRef<[u8]> for SlotView {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `range` was checked in `new` to lie inside one slot and
        // inside the mapping (`range.end <= map.len()`), and `self.memory`
        // keeps that mapping alive for as long as `self`, so the pointer is
        // valid for `range.len()` bytes for the lifetime of the returned
        // slice. Rust code never writes the mapping; the user may (through a
        // DLPack tensor of a yielded batch), but only into the bytes of a
        // tensor payload, which no Rust code reads after the header was
        // parsed. The book holds the slot for this view (filled, not
        // granted) until `self.release` is dropped, so an honest worker does
        // not write these bytes either. A worker that broke the protocol could only
        // change their values, never their length or where they lie: every
        // offset the batch header gives was checked against this length when
        // the batch was parsed, and the seals keep the memfd from shrinking,
        // so no read can fault or leave the slot.
        unsafe {
            std::slice::from_raw_parts(
                self.memory.map.as_ptr().add(self.range.start),
                self.range.len(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn views_stay_inside_their_slot() {
        let g = RingGeometry {
            slot_size: 4096,
            slot_count: 3,
        };
        assert_eq!(slot_bytes(g, 0, 0), Some(0..0));
        assert_eq!(slot_bytes(g, 1, 4096), Some(4096..8192));
        assert_eq!(slot_bytes(g, 2, 100), Some(8192..8292));
        assert_eq!(slot_bytes(g, 1, 4097), None, "longer than a slot");
        assert_eq!(slot_bytes(g, 3, 1), None, "no such slot");
        assert_eq!(slot_bytes(g, u32::MAX, 1), None);
        assert_eq!(slot_bytes(g, 0, u64::MAX), None);
    }

    #[test]
    fn the_memfd_is_sealed_and_mapped() {
        let g = RingGeometry {
            slot_size: 4096,
            slot_count: 2,
        };
        let mem = RingMemory::create(g).expect("ring");
        assert_eq!(mem.address_range().len(), 8192 + 4096, "slots and doorbell");
        assert_eq!(mem.doorbell().reported(), 0);
        assert!(mem.doorbell().arm(1), "nothing reported yet");
        let file = mem.file.try_clone().expect("dup");
        assert!(file.set_len(4096).is_err(), "shrinking is sealed");
        assert!(file.set_len(4 * 4096).is_err(), "growing is sealed");
        let seals = fcntl(&file, FcntlArg::F_GET_SEALS).expect("seals");
        let want = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
        assert_eq!(SealFlag::from_bits_truncate(seals) & want, want);
        let link = std::fs::read_link(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&mem.file)
        ))
        .expect("fd link");
        assert!(
            link.to_string_lossy().starts_with("/memfd:loader-ring"),
            "{}",
            link.display()
        );
    }

    proptest! {
        /// Whatever a worker reports, a view's bytes lie inside its slot.
        #[test]
        fn slot_bytes_never_leave_the_slot(size in 1u64..1 << 20, count in 1u32..64, slot: u32, len: u64) {
            let g = RingGeometry { slot_size: size * 64, slot_count: count };
            if let Some(r) = slot_bytes(g, slot, len) {
                let whole = g.slot_range(slot).expect("slot exists");
                prop_assert!(whole.start <= r.start && r.end <= whole.end);
                prop_assert_eq!(r.len() as u64, len);
            } else {
                prop_assert!(slot >= count || len > size * 64);
            }
        }
    }
}
