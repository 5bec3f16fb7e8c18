//! Bounded polling: every wait in these tests has a deadline and says what
//! it was waiting for when it gives up.

use std::time::{Duration, Instant};

/// Pause between polls.
const POLL: Duration = Duration::from_millis(10);

/// Polls `done` until it is true; panics naming `what` after `limit`.
/// Returns how long it took.
pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    loop {
        if done() {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(POLL);
    }
}
