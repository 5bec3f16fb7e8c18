//! The counters of a sample cache, summed over every worker that uses it,
//! as the trainer and `cache_stats` read them back from the file's header.
//! The entries' path in the [parent module](super) counts into those words;
//! this module only reads them.

use std::sync::atomic::Ordering;

use super::SampleCache;
use super::layout::Word;
use super::off::Off;

/// The counters of a cache, summed over every worker using it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Indexes the cache has a slot for.
    pub entries: u64,
    /// Bytes of entries it may hold.
    pub capacity: u64,
    /// Reads that found their entry.
    pub hits: u64,
    /// Reads that loaded their sample.
    pub misses: u64,
    /// Entries stored.
    pub stored: u64,
    /// Bytes of the entries stored.
    pub stored_bytes: u64,
    /// Entries refused because the space ran out.
    pub refused: u64,
    /// Nanoseconds spent loading the samples of misses.
    pub load_nanos: u64,
    /// Misses whose load was timed.
    pub loads: u64,
    /// Nanoseconds spent reading entries back.
    pub hit_nanos: u64,
    /// Reads back that were timed.
    pub hits_timed: u64,
    /// Nanoseconds spent storing entries.
    pub store_nanos: u64,
    /// Stores that were timed.
    pub stores_timed: u64,
    /// Why it was turned off, if it was.
    pub off: Option<Off>,
}

impl SampleCache {
    /// Every worker's counters.
    pub fn stats(&self) -> Stats {
        let w = |word| self.word(word).load(Ordering::Relaxed);
        Stats {
            entries: self.entries,
            capacity: self.capacity,
            hits: w(Word::Hits),
            misses: w(Word::Misses),
            stored: w(Word::Stored),
            stored_bytes: w(Word::StoredBytes),
            refused: w(Word::Refused),
            load_nanos: w(Word::LoadNanos),
            loads: w(Word::Loads),
            hit_nanos: w(Word::HitNanos),
            hits_timed: w(Word::HitsTimed),
            store_nanos: w(Word::StoreNanos),
            stores_timed: w(Word::StoresTimed),
            off: Off::of(w(Word::Off)),
        }
    }
}
