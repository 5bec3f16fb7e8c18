//! The ring's shared memory, and the only `unsafe` of the shared-memory
//! transport.
//!
//! The trainer owns the memfd and lends its slots to this worker one grant at
//! a time. [`Slots`] keeps the book of who holds each slot and turns a grant
//! into at most one [`SlotLease`], the single handle through which the
//! producer may write that slot. Everything the trainer says is checked here
//! against the ring's geometry before it can become a pointer: a grant naming
//! a slot outside the ring, a slot this worker still holds, or a generation
//! that does not move forward is a protocol error, never a write out of
//! bounds or two writers of one slot.

use std::collections::VecDeque;
use std::fs::File;
use std::ops::Range;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use loader_proto::ConsumerKey;
use memmap2::{MmapOptions, MmapRaw};
use tokio::sync::mpsc::UnboundedSender;

use crate::doorbell::{DOORBELL_LEN, Doorbell};
use crate::frame::{MAX_SLOTS, RingGeometry};


/// Why a ring cannot be mapped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MapError {
    /// The attach message describes an impossible ring.
    #[error("invalid ring of {count} slots of {size} bytes: {why}")]
    Geometry {
        /// Slots announced.
        count: u32,
        /// Bytes per slot announced.
        size: u64,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The memfd is smaller than the ring it should hold.
    #[error("the ring's memfd holds {have} bytes, its {count} slots of {size} bytes need {need}")]
    TooSmall {
        /// Bytes in the memfd.
        have: u64,
        /// Bytes the ring needs.
        need: u64,
        /// Slots announced.
        count: u32,
        /// Bytes per slot announced.
        size: u64,
    },
    /// fstat or mmap failed.
    #[error("cannot map the ring's memfd: {0}")]
    Io(#[from] std::io::Error),
}

/// A grant the book refuses: the trainer broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum GrantError {
    /// No such slot.
    #[error("grant of slot {slot} in a ring of {count} slots")]
    OutOfRange {
        /// Slot named.
        slot: u32,
        /// Slots in the ring.
        count: u32,
    },
    /// The slot is still granted to (or being written by) this worker.
    #[error("slot {slot} granted again before it came back")]
    AlreadyHeld {
        /// Slot named.
        slot: u32,
    },
    /// The generation did not move forward.
    #[error("slot {slot} granted with generation {generation}, after generation {last}")]
    StaleGeneration {
        /// Slot named.
        slot: u32,
        /// Generation of this grant.
        generation: u64,
        /// Generation of the slot's previous grant.
        last: u64,
    },
}

/// Takes ownership of file descriptors received with SCM_RIGHTS, so each is
/// closed exactly once (when dropped), whatever happens to the handshake.
pub(crate) fn adopt_received_fds(raw: Vec<RawFd>) -> Vec<OwnedFd> {
    raw.into_iter()
        // SAFETY: the kernel installed each of these descriptors in this
        // process for this one recvmsg call; nothing else knows or owns them,
        // so wrapping each in exactly one OwnedFd is the sole ownership.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect()
}

/// The whole ring mapped shared read-write. Unmapped when the connection and
/// every lease of it are gone.
#[derive(Debug)]
pub(crate) struct Mapping {
    /// A raw mapping: slots are handed out as `&mut` one lease at a time, so
    /// no `&mut` to the whole ring may exist.
    map: MmapRaw,
    /// Where the slots lie; `total_len()` equals `map.len()`, plus
    /// `DOORBELL_LEN` with a doorbell.
    geometry: RingGeometry,
    /// The doorbell page follows the slots.
    doorbell: bool,
}

impl Mapping {
    /// Maps `memfd` after checking that it holds the whole ring, and the
    /// doorbell page after the slots when `doorbell`.
    pub(crate) fn new(memfd: &File, geometry: RingGeometry, doorbell: bool) -> Result<Arc<Self>, MapError> {
        let bad = |why| MapError::Geometry { count: geometry.slot_count, size: geometry.slot_size, why };
        if geometry.slot_size == 0 {
            return Err(bad("slots must not be empty"));
        }
        if geometry.slot_count == 0 {
            return Err(bad("a ring needs at least one slot"));
        }
        if geometry.slot_count > MAX_SLOTS {
            return Err(bad("too many slots (the limit is 65536)"));
        }
        // Payloads are 64-byte aligned within a batch; slots must keep them
        // aligned in memory too, or zero-copy views would be misaligned.
        if !geometry.slot_size.is_multiple_of(loader_proto::batch::ALIGN as u64) {
            return Err(bad("slot size must be a multiple of 64 bytes"));
        }
        let total = match doorbell {
            true => geometry.file_len_with_doorbell(),
            false => geometry.total_len(),
        };
        let Some(total) = total else {
            return Err(bad("the ring's size overflows"));
        };
        let Ok(len) = usize::try_from(total) else {
            return Err(bad("the ring does not fit this address space"));
        };
        let have = memfd.metadata()?.len();
        if have < total {
            return Err(MapError::TooSmall {
                have,
                need: total,
                count: geometry.slot_count,
                size: geometry.slot_size,
            });
        }
        let map = MmapOptions::new().len(len).map_raw(memfd)?;
        if map.len() != len {
            return Err(bad("the kernel mapped a different length"));
        }
        Ok(Arc::new(Self { map, geometry, doorbell }))
    }

    /// The doorbell words after the slots, if the ring has them.
    pub(crate) fn doorbell(&self) -> Option<&Doorbell> {
        if !self.doorbell {
            return None;
        }
        let offset = usize::try_from(self.geometry.total_len()?).ok()?;
        debug_assert!(offset as u64 + DOORBELL_LEN <= self.map.len() as u64);
        // SAFETY: with a doorbell, `new` checked the memfd holds and mapped
        // `file_len_with_doorbell()` bytes, so the page at `offset` (the end
        // of the slots) lies inside the live mapping, which `self.map` keeps
        // mapped for the lifetime of the reference. `offset` is a multiple of
        // the slot size, itself a multiple of 64, and the mapping is
        // page-aligned, so the pointer is aligned for `Doorbell` (align 64).
        // No slot covers the page, so no lease's `&mut [u8]` aliases it; its
        // fields are atomics, the only way this process touches those bytes.
        // The trainer may write any values there: they are hints that decide
        // when it is woken, never a size or an offset.
        Some(unsafe { &*self.map.as_ptr().add(offset).cast::<Doorbell>() })
    }
}

/// What the producer tells the connection about a lease it is done with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outgoing {
    /// A batch of `len` bytes sits at the front of the slot.
    Filled {
        /// Slot written.
        slot: u32,
        /// Generation of its grant.
        generation: u64,
        /// Bytes of the batch.
        len: u64,
        /// Sequence number of the batch.
        seq: u64,
        /// Consumer the batch belongs to, for the delivery report.
        key: ConsumerKey,
        /// W3C traceparent of its delivery span, when sampled for tracing.
        traceparent: String,
    },
    /// The slot was not used (task abandoned, collate failed): it goes back.
    Returned {
        /// Slot returned.
        slot: u32,
        /// Generation of its grant.
        generation: u64,
    },
}

/// Who holds a slot right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// The trainer (never granted, or filled/returned since).
    Trainer,
    /// Granted to this worker, waiting for a batch.
    Granted,
    /// Leased to the producer, which may be writing it.
    Leased,
}

/// The book of one connection's slots.
#[derive(Debug)]
pub(crate) struct Slots {
    /// The ring leases write into.
    mapping: Arc<Mapping>,
    /// Holder of each slot, indexed by slot.
    holders: Vec<Holder>,
    /// Generation of each slot's latest grant.
    generations: Vec<Option<u64>>,
    /// Granted slots in grant order, with their generations. The producer
    /// takes the latest grant first: the trainer grants the slot freed last
    /// first (its pages mapped and warm), and slots granted long ago and
    /// never written stay untouched, so a worker writes a few slots over and
    /// over instead of faulting in every slot of its window once.
    granted: VecDeque<(u32, u64)>,
}

impl Slots {
    /// An empty book over `mapping`: every slot is the trainer's.
    pub(crate) fn new(mapping: Arc<Mapping>) -> Self {
        let count = mapping.geometry.slot_count as usize;
        Self {
            mapping,
            holders: vec![Holder::Trainer; count],
            generations: vec![None; count],
            granted: VecDeque::new(),
        }
    }

    /// Bytes per slot.
    pub(crate) fn slot_size(&self) -> u64 {
        self.mapping.geometry.slot_size
    }

    /// Records a grant from the trainer.
    pub(crate) fn grant(&mut self, slot: u32, generation: u64) -> Result<(), GrantError> {
        let count = self.mapping.geometry.slot_count;
        let i = slot as usize;
        if self.mapping.geometry.slot_range(slot).is_none() || i >= self.holders.len() {
            return Err(GrantError::OutOfRange { slot, count });
        }
        if self.holders[i] != Holder::Trainer {
            return Err(GrantError::AlreadyHeld { slot });
        }
        if let Some(last) = self.generations[i]
            && generation <= last
        {
            return Err(GrantError::StaleGeneration { slot, generation, last });
        }
        self.holders[i] = Holder::Granted;
        self.generations[i] = Some(generation);
        self.granted.push_back((slot, generation));
        Ok(())
    }

    /// Leases the latest granted slot, if any; the lease reports its end on
    /// `outgoing`.
    pub(crate) fn take(&mut self, outgoing: &UnboundedSender<Outgoing>) -> Option<SlotLease> {
        let (slot, generation) = self.granted.pop_back()?;
        // `grant` only queues slots inside the ring.
        let range = self.mapping.geometry.slot_range(slot)?;
        self.holders[slot as usize] = Holder::Leased;
        Some(SlotLease {
            mapping: Arc::clone(&self.mapping),
            slot,
            generation,
            range,
            outgoing: outgoing.clone(),
            done: false,
        })
    }

    /// The slot of a finished lease is the trainer's again. Called by the
    /// connection before it tells the trainer, so a new grant of the slot,
    /// which can only follow that message, finds the book up to date.
    pub(crate) fn settle(&mut self, slot: u32, generation: u64) {
        let i = slot as usize;
        if self.holders.get(i) == Some(&Holder::Leased) && self.generations[i] == Some(generation) {
            self.holders[i] = Holder::Trainer;
        }
    }

    /// Takes up to `count` granted slots no lease has taken, the oldest
    /// granted first (the ones a lease would take last), to give them back
    /// (the trainer asked for them).
    pub(crate) fn take_unused_upto(&mut self, count: usize) -> Vec<(u32, u64)> {
        let count = count.min(self.granted.len());
        let unused: Vec<_> = self.granted.drain(..count).collect();
        for &(slot, _) in &unused {
            self.holders[slot as usize] = Holder::Trainer;
        }
        unused
    }

    /// Takes every granted slot no lease has taken, to give them back.
    pub(crate) fn take_unused(&mut self) -> Vec<(u32, u64)> {
        let unused: Vec<_> = self.granted.drain(..).collect();
        for &(slot, _) in &unused {
            self.holders[slot as usize] = Holder::Trainer;
        }
        unused
    }
}

/// The producer's right to write one granted slot. Dropping it unused gives
/// the slot back to the trainer; [`fill`](Self::fill) reports a batch in it.
#[derive(Debug)]
pub struct SlotLease {
    /// Keeps the ring mapped while the producer writes, even if the
    /// connection ends meanwhile.
    mapping: Arc<Mapping>,
    /// The slot leased.
    slot: u32,
    /// Generation of its grant.
    generation: u64,
    /// Bytes of the slot in the mapping, from the ring's geometry.
    range: Range<usize>,
    /// Where the end of the lease is reported.
    outgoing: UnboundedSender<Outgoing>,
    /// Set once the end was reported.
    done: bool,
}

impl SlotLease {
    /// The whole slot, to collate a batch into. Holds whatever the slot held
    /// before.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let base = self.mapping.map.as_mut_ptr();
        // SAFETY: `range` comes from the geometry the mapping was created and
        // checked with (`Mapping::new`: mapped length >= geometry.total_len()),
        // so it lies inside the live mapping, which `self.mapping` keeps
        // mapped for as long as the slice (borrowed from `self`) lives. The
        // book hands out one lease per grant and refuses a new grant of a
        // slot until this lease has ended and been settled, so no other
        // reference to these bytes exists in this process; `&mut self` makes
        // this the only slice of this lease. The trainer does not touch a
        // granted slot until it is reported filled or returned; if it broke
        // that rule it would only garble its own batch: the worker never
        // reads back what it writes here.
        unsafe { std::slice::from_raw_parts_mut(base.add(self.range.start), self.range.len()) }
    }

    /// Reports a batch of `len` bytes, sequence number `seq` of `key`, at the
    /// front of the slot, with the `traceparent` of its delivery span (empty
    /// when it is not traced).
    pub fn fill(mut self, len: u64, seq: u64, key: ConsumerKey, traceparent: String) {
        self.done = true;
        let (slot, generation) = (self.slot, self.generation);
        let _ = self.outgoing.send(Outgoing::Filled { slot, generation, len, seq, key, traceparent });
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        if !self.done {
            // A closed channel means the connection is gone, and the slot
            // with it.
            let _ = self.outgoing.send(Outgoing::Returned { slot: self.slot, generation: self.generation });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use nix::sys::memfd::{MFdFlags, memfd_create};
    use proptest::prelude::*;
    use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

    use super::*;

    fn memfd(len: u64) -> File {
        let fd = memfd_create("loader-ring-slots-test", MFdFlags::MFD_CLOEXEC).expect("memfd");
        let file = File::from(fd);
        file.set_len(len).expect("size");
        file
    }

    fn ring(size: u64, count: u32) -> (File, Slots, UnboundedSender<Outgoing>, UnboundedReceiver<Outgoing>) {
        let g = RingGeometry { slot_size: size, slot_count: count };
        let file = memfd(size * u64::from(count));
        let slots = Slots::new(Mapping::new(&file, g, false).expect("map"));
        let (tx, rx) = unbounded_channel();
        (file, slots, tx, rx)
    }

    #[test]
    fn bad_geometry_and_short_memfds_are_refused() {
        let file = memfd(8192);
        let map = |size, count| Mapping::new(&file, RingGeometry { slot_size: size, slot_count: count }, false);
        assert!(map(4096, 2).is_ok());
        for (size, count) in [(0, 2), (4096, 0), (100, 2), (64, MAX_SLOTS + 1), (u64::MAX - 63, 2)] {
            assert!(matches!(map(size, count), Err(MapError::Geometry { .. })), "{size} x {count}");
        }
        let e = map(4096, 3).expect_err("too small");
        assert_eq!(e.to_string(), "the ring's memfd holds 8192 bytes, its 3 slots of 4096 bytes need 12288");
        let g = RingGeometry { slot_size: 4096, slot_count: 1 };
        let with_bell = Mapping::new(&file, g, true).expect("one slot and the doorbell page");
        assert!(with_bell.doorbell().is_some());
        assert!(Mapping::new(&file, g, false).expect("no doorbell").doorbell().is_none());
        let g = RingGeometry { slot_size: 4096, slot_count: 2 };
        let e = Mapping::new(&file, g, true).expect_err("no room for the doorbell");
        assert_eq!(e.to_string(), "the ring's memfd holds 8192 bytes, its 2 slots of 4096 bytes need 12288");
    }

    #[test]
    fn leases_write_only_their_own_slot() {
        let (file, mut slots, tx, mut rx) = ring(4096, 3);
        slots.grant(2, 0).expect("grant");
        slots.grant(1, 0).expect("grant");
        // The latest grant first: slot 1, then slot 2.
        let mut a = slots.take(&tx).expect("lease");
        let mut b = slots.take(&tx).expect("lease");
        assert!(slots.take(&tx).is_none(), "two grants, two leases");
        assert_eq!(a.bytes_mut().len(), 4096);
        a.bytes_mut().fill(0xaa);
        b.bytes_mut().fill(0xbb);
        a.fill(10, 7, (1, 0), String::new());
        drop(b);
        let mut all = vec![0u8; 3 * 4096];
        file.read_exact_at(&mut all, 0).expect("read");
        assert!(all[..4096].iter().all(|&x| x == 0), "slot 0 untouched");
        assert!(all[4096..8192].iter().all(|&x| x == 0xaa));
        assert!(all[8192..].iter().all(|&x| x == 0xbb));
        assert_eq!(rx.try_recv(), Ok(Outgoing::Filled { slot: 1, generation: 0, len: 10, seq: 7, key: (1, 0), traceparent: String::new() }));
        assert_eq!(rx.try_recv(), Ok(Outgoing::Returned { slot: 2, generation: 0 }));
    }

    #[test]
    fn protocol_violations_are_refused() {
        let (_file, mut slots, tx, _rx) = ring(64, 2);
        assert_eq!(slots.grant(2, 0), Err(GrantError::OutOfRange { slot: 2, count: 2 }));
        assert_eq!(slots.grant(u32::MAX, 0), Err(GrantError::OutOfRange { slot: u32::MAX, count: 2 }));
        slots.grant(0, 5).expect("grant");
        assert_eq!(slots.grant(0, 6), Err(GrantError::AlreadyHeld { slot: 0 }), "granted, not yet leased");
        let lease = slots.take(&tx).expect("lease");
        assert_eq!(slots.grant(0, 6), Err(GrantError::AlreadyHeld { slot: 0 }), "being written");
        lease.fill(1, 0, (1, 0), String::new());
        slots.settle(0, 5);
        assert_eq!(slots.grant(0, 5), Err(GrantError::StaleGeneration { slot: 0, generation: 5, last: 5 }));
        assert_eq!(slots.grant(0, 4), Err(GrantError::StaleGeneration { slot: 0, generation: 4, last: 5 }));
        slots.grant(0, 6).expect("a new generation after the slot came back");
        assert_eq!(slots.take_unused(), vec![(0, 6)]);
        slots.grant(0, 7).expect("returned slots can be granted again");
    }

    /// One step a trainer (honest or not) or the producer can take.
    #[derive(Debug, Clone)]
    enum Step {
        Grant(u32, u64),
        Take,
        Finish,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u32..6, 0u64..8).prop_map(|(s, g)| Step::Grant(s, g)),
            Just(Step::Take),
            Just(Step::Finish),
        ]
    }

    proptest! {
        /// Against a model of the protocol: a grant is accepted exactly when
        /// it names a slot of the ring that the trainer holds, with a newer
        /// generation; leases never overlap and stay inside their slot.
        #[test]
        fn the_book_follows_the_protocol(steps in proptest::collection::vec(step(), 0..64)) {
            const COUNT: u32 = 4;
            let (_file, mut slots, tx, mut rx) = ring(64, COUNT);
            let mut held = [false; COUNT as usize];
            let mut last: [Option<u64>; COUNT as usize] = [None; COUNT as usize];
            let mut leases: VecDeque<SlotLease> = VecDeque::new();
            for step in steps {
                match step {
                    Step::Grant(slot, generation) => {
                        let ok = slot < COUNT
                            && !held[slot as usize]
                            && last[slot as usize].is_none_or(|l| generation > l);
                        prop_assert_eq!(slots.grant(slot, generation).is_ok(), ok);
                        if ok {
                            held[slot as usize] = true;
                            last[slot as usize] = Some(generation);
                        }
                    }
                    Step::Take => {
                        if let Some(mut lease) = slots.take(&tx) {
                            prop_assert!(leases.iter().all(|l| l.slot != lease.slot));
                            let expected = (lease.slot as usize * 64)..(lease.slot as usize * 64 + 64);
                            prop_assert_eq!(&lease.range, &expected);
                            prop_assert_eq!(lease.bytes_mut().len(), 64);
                            let mark = lease.slot as u8;
                            lease.bytes_mut().fill(mark);
                            leases.push_back(lease);
                        }
                    }
                    Step::Finish => {
                        if let Some(lease) = leases.pop_front() {
                            let slot = lease.slot;
                            lease.fill(1, 0, (0, 0), String::new());
                            let Ok(Outgoing::Filled { slot: s, generation, .. }) = rx.try_recv() else {
                                return Err(TestCaseError::fail("no filled report"));
                            };
                            prop_assert_eq!(s, slot);
                            slots.settle(s, generation);
                            held[slot as usize] = false;
                        }
                    }
                }
            }
        }
    }
}
