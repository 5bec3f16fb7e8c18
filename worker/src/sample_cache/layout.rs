//! The sample cache file's layout in numbers: the header's magic and
//! words, the slots' size and states, the entries' alignment and the most
//! entries a cache holds (the table is in the [parent module's
//! docs](super)). Named once here, read by the entries' path, by the code
//! that makes and opens the file, and by the counters' read-out.

/// "LDRCACH1": the file is a sample cache of this layout.
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"LDRCACH1");
/// Bytes before the slots: the header's words, padded to a page.
pub(super) const HEADER: usize = 4096;
/// Bytes per slot: the state word and the entry's length.
pub(super) const SLOT: usize = 16;
/// Entries start at multiples of this (a cache line).
pub(super) const ALIGN: u64 = 64;
/// The most entries a cache holds (16 GiB of slots would be absurd):
/// a billion samples.
pub const MAX_ENTRIES: u64 = 1 << 30;

/// Slot states; a published slot holds `READY | offset`.
pub(super) const EMPTY: u64 = 0;
pub(super) const CLAIMED: u64 = 1;
pub(super) const NEVER: u64 = 2;
pub(super) const READY: u64 = 1 << 63;

/// The header's words, by index.
#[derive(Clone, Copy)]
#[repr(usize)]
pub(super) enum Word {
    Magic = 0,
    Entries,
    /// The allocation cursor: bytes of the data area taken.
    Next,
    /// 0 while on; otherwise why it was turned off ([`Off`]).
    Off,
    Hits,
    Misses,
    Stored,
    StoredBytes,
    /// Entries refused because the space ran out.
    Refused,
    /// Nanoseconds spent loading samples that missed, and how many.
    LoadNanos,
    Loads,
    /// Nanoseconds spent reading samples back from the cache, and how many.
    HitNanos,
    HitsTimed,
    /// Nanoseconds spent storing entries (encoding and writing), and how
    /// many.
    StoreNanos,
    StoresTimed,
}
