//! The ring's doorbell: two words in a page after the slots, shared by the
//! trainer and its co-located workers, that let a trainer waiting for
//! batches sleep until several reports are on the sockets instead of waking
//! for each one.
//!
//! Why: on the machines Loader runs on (virtual machines, mostly), putting a
//! thread to sleep and waking it costs it some 15-20 µs of CPU, more than
//! everything else the trainer does for a batch. A worker's report on the
//! socket would wake a trainer that polls the socket every time. Instead the
//! trainer watches its sockets only for hang-ups and sleeps on an eventfd;
//! before it sleeps it writes `wake_at` here, the count of reports it wants
//! to find when it wakes; each worker, after writing a report to its socket,
//! adds one to `reported` and writes the eventfd only when the count reached
//! `wake_at` (one of them: the word is reset by whoever rings).
//!
//! The words are hints, not the protocol: reports are still read from the
//! sockets and checked there, and the trainer never sleeps past its own
//! deadline. A worker that scribbles on them can only delay or hasten a
//! wake-up, never make a batch out of nothing.
//!
//! Both sides use [`Doorbell`] through a reference into their mapping of the
//! page (the `unsafe` cast lives with each side's mapping); the logic here
//! is plain atomics, tested with threads.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes the doorbell takes after the slots in the memfd: one page, so the
/// slots keep their alignment and the words their own cache lines.
pub const DOORBELL_LEN: u64 = 4096;

// The words fit the page, and a page-aligned address is aligned for them.
const _: () = assert!(
    std::mem::size_of::<Doorbell>() as u64 <= DOORBELL_LEN
        && std::mem::align_of::<Doorbell>() as u64 <= DOORBELL_LEN
);

/// `wake_at` when the trainer is not waiting for a count.
const NOT_WAITING: u64 = u64::MAX;

/// The shared words, at the start of the doorbell page. `repr(C)` with the
/// words on separate cache lines: workers bump one while the trainer writes
/// the other.
#[derive(Debug)]
#[repr(C, align(64))]
pub struct Doorbell {
    /// Filled reports the workers have written to their sockets, all
    /// workers together. Only grows (wrapping is 2^64 reports away).
    reported: AtomicU64,
    _pad: [u64; 7],
    /// The count at which the trainer wants the eventfd written, or
    /// `NOT_WAITING`.
    wake_at: AtomicU64,
}

impl Default for Doorbell {
    fn default() -> Self {
        Self {
            reported: AtomicU64::new(0),
            _pad: [0; 7],
            wake_at: AtomicU64::new(NOT_WAITING),
        }
    }
}

impl Doorbell {
    /// Worker side, after a filled report went into the socket: counts it.
    /// True when this worker must write the eventfd (the trainer sleeps and
    /// the count it waits for is reached; only one caller gets true).
    pub fn count_report(&self) -> bool {
        let n = self.reported.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
        let want = self.wake_at.load(Ordering::SeqCst);
        n >= want
            && self
                .wake_at
                .compare_exchange(want, NOT_WAITING, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
    }

    /// Trainer side: filled reports counted so far. A report counted before
    /// this load is in its socket before it.
    pub fn reported(&self) -> u64 {
        self.reported.load(Ordering::SeqCst)
    }

    /// Trainer side, before sleeping: asks to be woken when `reported`
    /// reaches `target`. False when it already has: do not sleep (nothing
    /// is left armed).
    pub fn arm(&self, target: u64) -> bool {
        self.wake_at.store(target, Ordering::SeqCst);
        // Pairs with `count_report`: either that sees `wake_at`, or this
        // sees its count.
        if self.reported.load(Ordering::SeqCst) >= target {
            self.disarm();
            return false;
        }
        true
    }

    /// Trainer side, after waking for any reason: no eventfd write wanted.
    pub fn disarm(&self) {
        self.wake_at.store(NOT_WAITING, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    use super::*;

    #[test]
    fn rings_once_when_the_count_is_reached_and_not_before() {
        let bell = Doorbell::default();
        assert!(!bell.count_report(), "nobody waits");
        assert!(bell.arm(3));
        assert!(!bell.count_report(), "2 of 3");
        assert!(bell.count_report(), "3 of 3: ring");
        assert!(!bell.count_report(), "rung already");
        assert_eq!(bell.reported(), 4);
        assert!(!bell.arm(4), "already there: do not sleep");
        assert!(!bell.count_report(), "arm refused, so nothing is armed");
        assert!(bell.arm(6));
        bell.disarm();
        assert!(!bell.count_report(), "disarmed");
    }

    /// Two workers count reports while the trainer arms and sleeps over and
    /// over: it is never left asleep with its count reached (each wait is
    /// bounded; a lost wake-up shows as a timeout with the count reached).
    #[test]
    fn no_wake_up_is_lost_between_arming_and_counting() {
        const REPORTS: u64 = 20_000;
        let bell = Arc::new(Doorbell::default());
        let rung = Arc::new((Mutex::new(false), Condvar::new()));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (bell, rung) = (Arc::clone(&bell), Arc::clone(&rung));
                std::thread::spawn(move || {
                    for _ in 0..REPORTS / 2 {
                        if bell.count_report() {
                            let (flag, cv) = &*rung;
                            *flag.lock().expect("lock") = true;
                            cv.notify_one();
                        }
                    }
                })
            })
            .collect();
        let mut seen = 0;
        let mut lost = 0;
        while seen < REPORTS {
            let target = (seen + 1 + seen % 3).min(REPORTS);
            if bell.arm(target) {
                let (flag, cv) = &*rung;
                let mut woken = flag.lock().expect("lock");
                let deadline = Duration::from_secs(5);
                while !*woken {
                    let (w, t) = cv.wait_timeout(woken, deadline).expect("wait");
                    woken = w;
                    if t.timed_out() {
                        if bell.reported() >= target {
                            lost += 1;
                        }
                        break;
                    }
                }
                *woken = false;
                bell.disarm();
            }
            seen = seen.max(bell.reported().min(target));
        }
        for w in workers {
            w.join().expect("worker");
        }
        assert_eq!(lost, 0, "wake-ups lost");
        assert_eq!(bell.reported(), REPORTS);
    }
}
