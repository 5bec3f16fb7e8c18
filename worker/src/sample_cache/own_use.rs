//! One thread's own use of sample caches: the header's counters sum over
//! every co-located worker, these over one thread of one, so that a
//! worker's producer can tell which job a hit, a miss or a stored entry was
//! for (its heartbeats report that per job). Also the reason a cache this
//! thread used was found off, which is how a job learns of it. Counted by
//! the entries' path in the [parent module](super), as thread-locals: no
//! lock and no shared write per sample.

use super::off::Off;

/// One thread's own use of sample caches (see [`own_use`]): the header's
/// counters sum over every co-located worker, these over one thread of
/// one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnUse {
    /// Reads that found their entry.
    pub hits: u64,
    /// Reads that loaded their sample.
    pub misses: u64,
    /// Bytes of the entries this thread stored.
    pub stored_bytes: u64,
    /// Entries refused because the space ran out.
    pub refused: u64,
}

impl OwnUse {
    /// What was counted between `earlier` and `self`.
    pub fn since(&self, earlier: &OwnUse) -> OwnUse {
        OwnUse {
            hits: self.hits.saturating_sub(earlier.hits),
            misses: self.misses.saturating_sub(earlier.misses),
            stored_bytes: self.stored_bytes.saturating_sub(earlier.stored_bytes),
            refused: self.refused.saturating_sub(earlier.refused),
        }
    }

    /// Adds `more` to these counts.
    pub fn add(&mut self, more: &OwnUse) {
        self.hits += more.hits;
        self.misses += more.misses;
        self.stored_bytes += more.stored_bytes;
        self.refused += more.refused;
    }

    /// Nothing was counted.
    pub fn is_empty(&self) -> bool {
        *self == OwnUse::default()
    }
}

thread_local! {
    /// This thread's [`OwnUse`].
    static OWN: std::cell::Cell<OwnUse> = const { std::cell::Cell::new(OwnUse { hits: 0, misses: 0, stored_bytes: 0, refused: 0 }) };
    /// The [`Off`] code a cache this thread used was last found off with
    /// (0: none since [`take_off_seen`]).
    pub(super) static OFF_SEEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// This thread's own use of sample caches since it started: a worker's
/// producer thread reads every sample it makes on itself (a Python
/// dataset's `__getitem__` too), so the counts that move while it makes a
/// job's batch are that job's.
pub fn own_use() -> OwnUse {
    OWN.with(std::cell::Cell::get)
}

/// Why a cache this thread read or stored through was off, if one was
/// since the last call (and forgets it): a cache turned off records no
/// use, so its job learns of it this way.
pub fn take_off_seen() -> Option<Off> {
    Off::of(OFF_SEEN.with(|off| off.replace(0)))
}

/// Adds to this thread's [`OwnUse`].
pub(super) fn own(count: impl FnOnce(&mut OwnUse)) {
    OWN.with(|own| {
        let mut used = own.get();
        count(&mut used);
        own.set(used);
    });
}
