//! Retrying a call until a deadline: the one backoff schedule of every
//! Loader process (a worker registering, a trainer connecting or calling
//! its coordinator, `loaderctl`), on `backon`.
//!
//! The schedule doubles from a first pause up to a cap, without jitter (a
//! handful of processes retry one coordinator; there is no herd to spread).
//! The deadline is wall-clock: a pause never runs past it, and the last
//! attempt starts at the deadline at the latest, so a caller's bound is its
//! own budget plus one attempt.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable};
use tokio::time::Instant;

/// The pause after a listener's `accept` fails (out of file descriptors and
/// the like) before it accepts again: such errors last until some
/// connection closes, and accepting again at once would only fill the log.
/// Every listener of every Loader process (gRPC servers, a trainer's ring
/// socket) pauses this long.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Pauses between attempts: `first`, doubling up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Pause after the first failed attempt.
    pub first: Duration,
    /// Longest pause.
    pub max: Duration,
}

impl Backoff {
    /// Pauses from `first`, doubling up to `max`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self { first, max }
    }

    /// The pauses one after another, for a caller that schedules its
    /// attempts itself (a supervisor restarting a process).
    pub fn pauses(self) -> Pauses {
        Pauses(self.schedule().build())
    }

    fn schedule(self) -> ExponentialBuilder {
        ExponentialBuilder::new()
            .with_min_delay(self.first)
            .with_max_delay(self.max)
            .with_factor(2.0)
            .without_max_times()
    }
}

/// The pauses of a [`Backoff`], in order; endless (the last one repeats).
#[derive(Debug)]
pub struct Pauses(ExponentialBackoff);

impl Iterator for Pauses {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.0.next()
    }
}

/// Runs `call` until it succeeds, fails with an error `retryable` refuses,
/// or `deadline` passes; returns the last outcome. Pauses follow `backoff`
/// and never run past `deadline`; a failure at or after it is returned.
pub async fn until<T, E, F, Fut>(
    deadline: Instant,
    backoff: Backoff,
    call: F,
    retryable: impl FnMut(&E) -> bool,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Display,
{
    call.retry(backoff.schedule())
        .sleep(tokio::time::sleep)
        .when(retryable)
        .adjust(move |_, pause| {
            let left = deadline.saturating_duration_since(Instant::now());
            pause.filter(|_| !left.is_zero()).map(|pause| pause.min(left))
        })
        .notify(|e, pause| tracing::debug!(error = %e, ?pause, "retrying"))
        .await
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    const BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(800));

    #[tokio::test(start_paused = true)]
    async fn retries_until_the_deadline_with_a_last_attempt_at_it() {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(3);
        let attempts = Cell::new(Vec::new());
        let out: Result<(), String> = until(
            deadline,
            BACKOFF,
            || {
                let mut at = attempts.take();
                at.push(start.elapsed());
                attempts.set(at);
                async { Err("refused".to_owned()) }
            },
            |_| true,
        )
        .await;
        assert_eq!(out, Err("refused".to_owned()));
        let at: Vec<u128> = attempts.take().iter().map(Duration::as_millis).collect();
        // Pauses of 50, 100, 200, 400, 800, 800 ms (tokio's timer may add a
        // millisecond to each), then a last attempt at the deadline.
        let pauses: Vec<u128> = at.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(pauses.len(), 7, "{at:?}");
        for (pause, expected) in pauses.iter().zip([50, 100, 200, 400, 800, 800]) {
            assert!((expected..=expected + 1).contains(pause), "{at:?}");
        }
        assert_eq!(at.last(), Some(&3000), "{at:?}");
    }

    #[test]
    fn pauses_double_up_to_the_cap_and_stay_there() {
        let ms: Vec<u128> = BACKOFF.pauses().take(7).map(|p| p.as_millis()).collect();
        assert_eq!(ms, vec![50, 100, 200, 400, 800, 800, 800]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fatal_error_is_returned_at_once() {
        let calls = Cell::new(0);
        let out: Result<(), String> = until(
            Instant::now() + Duration::from_secs(3),
            BACKOFF,
            || {
                calls.set(calls.get() + 1);
                async { Err("fatal".to_owned()) }
            },
            |e| e != "fatal",
        )
        .await;
        assert_eq!(out, Err("fatal".to_owned()));
        assert_eq!(calls.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn success_after_failures_is_returned() {
        let calls = Cell::new(0);
        let out = until(
            Instant::now() + Duration::from_secs(3),
            BACKOFF,
            || {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move { if n < 3 { Err("not yet".to_owned()) } else { Ok(n) } }
            },
            |_| true,
        )
        .await;
        assert_eq!(out, Ok(3));
    }
}
