//! Why a sample cache was turned off: the reason a worker writes into the
//! header's off switch, its name in the protocol and the Python half, and
//! how the worker log says it. A turned-off cache stays off for every
//! worker that uses it; the first reason stays.

/// Why a cache was turned off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Off {
    /// Reading a sample back cost about as much as loading it.
    DoesNotPay,
    /// A sample could not be stored or read back (its codec failed).
    Failed,
    /// The job reads each sample once: nothing would be read back.
    OneEpoch,
    /// The cache's file system ran out of space (a full `--cache-dir`).
    NoSpace,
}

impl Off {
    pub(super) fn code(self) -> u64 {
        match self {
            Off::DoesNotPay => 1,
            Off::Failed => 2,
            Off::OneEpoch => 3,
            Off::NoSpace => 4,
        }
    }

    pub(super) fn of(code: u64) -> Option<Off> {
        match code {
            0 => None,
            1 => Some(Off::DoesNotPay),
            3 => Some(Off::OneEpoch),
            4 => Some(Off::NoSpace),
            _ => Some(Off::Failed),
        }
    }

    /// Its name in the protocol (`CacheUse.off`) and in the Python half
    /// (`SampleCache.turn_off`).
    pub fn name(self) -> &'static str {
        match self {
            Off::DoesNotPay => "does-not-pay",
            Off::Failed => "failed",
            Off::OneEpoch => "one-epoch",
            Off::NoSpace => "no-space",
        }
    }

    /// The reason named `name` (see [`name`](Self::name)).
    pub fn named(name: &str) -> Option<Off> {
        [Off::DoesNotPay, Off::Failed, Off::OneEpoch, Off::NoSpace].into_iter().find(|off| off.name() == name)
    }

    /// How the worker log and `cache_stats` say it.
    pub fn describe(self) -> &'static str {
        match self {
            Off::DoesNotPay => "storing and reading samples back cost about as much as loading them",
            Off::Failed => "a sample could not be stored in or read from the cache",
            Off::OneEpoch => "the job has one epoch: no sample is read twice",
            Off::NoSpace => "its directory ran out of space: nothing more is stored, samples load as without a cache",
        }
    }
}
