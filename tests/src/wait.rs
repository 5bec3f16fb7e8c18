//! Bounded polling, the one wait loop of these tests: every wait has a
//! deadline and says what it was waiting for when it gives up. Helpers
//! (a process's exit, a trainer's progress, an admin poll) wait through it
//! too, so its pace and its bound are the same everywhere.

use std::time::{Duration, Instant};

/// First pause between polls: a condition that is nearly true is seen at
/// once (a timing a test measures stays close to the truth).
const FIRST_POLL: Duration = Duration::from_millis(1);

/// Longest pause between polls: the pause doubles up to it, so a long wait
/// on an expensive check (a `/metrics` scrape, a `loaderctl` run) does not
/// take the 2 cores from the processes under test.
const LAST_POLL: Duration = Duration::from_millis(50);

/// Polls `check` until it gives `Ok`; after `limit`, `Err` with what the
/// last check said. For waits whose caller decides what a timeout means (a
/// process still running); [`wait_for`] panics instead.
pub fn poll<T>(limit: Duration, mut check: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let started = Instant::now();
    let mut pause = FIRST_POLL;
    loop {
        let last = match check() {
            Ok(value) => return Ok(value),
            Err(last) => last,
        };
        let left = limit.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(last);
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(LAST_POLL);
    }
}

/// Polls `check` until it gives `Ok(value)` and returns the value; panics
/// after `limit`, naming `what` and what the last check said (`Err`).
pub fn wait_for<T>(what: &str, limit: Duration, check: impl FnMut() -> Result<T, String>) -> T {
    poll(limit, check).unwrap_or_else(|last| panic!("{what}: not within {limit:?} ({last})"))
}

/// Polls `done` until it is true; panics naming `what` after `limit`.
/// Returns how long it took.
pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    wait_for(what, limit, || if done() { Ok(()) } else { Err("not yet".to_owned()) });
    started.elapsed()
}
