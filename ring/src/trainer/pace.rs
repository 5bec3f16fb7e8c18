//! How many ring reports a waiting consumer sleeps through: the consumer's
//! interrupt moderation.
//!
//! A consumer faster than its workers waits for every batch; waking it costs
//! more CPU than everything else it does for the batch (see
//! [`crate::doorbell`]). So when it must wait, it asks to be woken
//! after several reports, like a network card that raises one interrupt per
//! few frames. That costs no throughput as long as the workers never run
//! out of slots meanwhile: it sleeps through at most three quarters of the
//! reports the workers can send on the grants they hold, so together they
//! still hold a quarter when it wakes, to write into while it reads, yields
//! and gives slots back (a small part of a batch's time). Batches are
//! yielded in bursts instead of one by one; the rate is the workers'
//! (measured: the same samples/s as waking for every report, with a third
//! of the wake-ups, `docs/benchmarks.md`). One worker can run dry while
//! another stalls; then the consumer waits for the stalled worker's batch
//! anyway (batches are yielded in order), and the hold deadline bounds the
//! rest.
//!
//! Two bounds keep it from waiting for reports that will not come: never
//! more than the batches the job still owes, and a hold deadline of twice
//! the time those reports took lately (a worker that stops, or batches that
//! come over gRPC instead). Until a rate is known, and whenever only one
//! report can come, it wakes for each.

use std::time::Duration;

use tokio::time::Instant;

/// Most reports one wake-up waits for.
pub(crate) const MAX_REPORTS_PER_WAKE: u32 = 12;
/// The share of the reports in flight a wake-up waits for: three quarters.
const SLEEP_THROUGH: (u32, u32) = (3, 4);
/// Shortest and longest hold: below a millisecond the timer costs as much as
/// the wake-ups it saves; a long hold only delays a job that stalls anyway.
const HOLD_MIN: Duration = Duration::from_millis(1);
const HOLD_MAX: Duration = Duration::from_millis(200);

/// What one wait asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Filled reports to wake for.
    pub reports: u64,
    /// Read what is there by then, whatever came; `None` for one report.
    pub hold: Option<Duration>,
}

/// The consumer's estimate of how fast reports come.
#[derive(Debug, Default)]
pub struct Pace {
    /// Smoothed time between two filled reports while the consumer waited.
    per_report: Option<Duration>,
    /// When the consumer started waiting, if it is.
    waiting_since: Option<Instant>,
}

impl Pace {
    /// The plan for a wait, with `in_flight` grants the workers know of and
    /// `owed` batches the job has yet to deliver to this consumer.
    #[inline]
    pub fn plan(&self, in_flight: u32, owed: u64) -> Plan {
        let (num, den) = SLEEP_THROUGH;
        let reports =
            u64::from((in_flight.saturating_mul(num) / den).min(MAX_REPORTS_PER_WAKE)).min(owed);
        match self.per_report {
            Some(per) if reports > 1 => Plan {
                reports,
                hold: Some((per * 2 * reports as u32).clamp(HOLD_MIN, HOLD_MAX)),
            },
            _ => Plan {
                reports: 1,
                hold: None,
            },
        }
    }

    /// The consumer starts waiting for reports at `now`.
    #[inline]
    pub fn waiting(&mut self, now: Instant) {
        self.waiting_since.get_or_insert(now);
    }

    /// A read at `now` found `filled` reports. Only the time spent waiting
    /// counts: a consumer busy elsewhere says nothing about its workers.
    #[inline]
    pub fn read(&mut self, now: Instant, filled: u64) {
        if filled == 0 {
            return;
        }
        let Some(since) = self.waiting_since.take() else {
            return;
        };
        let sample = (now - since) / u32::try_from(filled).unwrap_or(u32::MAX);
        self.per_report = Some(match self.per_report {
            // A quarter of each new sample: steady under jitter, and within
            // a few wake-ups of a new rate.
            Some(old) => (old * 3 + sample) / 4,
            None => sample,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn wakes_for_each_report_until_a_rate_is_known() {
        let pace = Pace::default();
        assert_eq!(
            pace.plan(16, 1000),
            Plan {
                reports: 1,
                hold: None
            }
        );
    }

    #[test]
    fn sleeps_through_three_quarters_of_the_reports_in_flight_within_bounds() {
        let mut pace = Pace::default();
        let t = Instant::now();
        pace.waiting(t);
        pace.read(t + 4 * MS, 2);
        assert_eq!(
            pace.plan(10, 1000),
            Plan {
                reports: 7,
                hold: Some(28 * MS)
            }
        );
        assert_eq!(pace.plan(64, 1000).reports, u64::from(MAX_REPORTS_PER_WAKE));
        assert_eq!(
            pace.plan(16, 3),
            Plan {
                reports: 3,
                hold: Some(12 * MS)
            },
            "owed"
        );
        assert_eq!(
            pace.plan(3, 1000),
            Plan {
                reports: 2,
                hold: Some(8 * MS)
            }
        );
        assert_eq!(
            pace.plan(2, 1000),
            Plan {
                reports: 1,
                hold: None
            },
            "one at a time"
        );
        assert_eq!(
            pace.plan(0, 1000),
            Plan {
                reports: 1,
                hold: None
            }
        );
        assert_eq!(pace.plan(16, 0).reports, 1, "never zero");
    }

    #[test]
    fn the_rate_follows_waits_only_and_holds_stay_bounded() {
        let mut pace = Pace::default();
        let t = Instant::now();
        pace.read(t, 5);
        assert_eq!(pace.plan(16, 100).reports, 1, "not waiting: no sample");
        pace.waiting(t);
        pace.waiting(t + MS);
        pace.read(t + 8 * MS, 4);
        assert_eq!(pace.per_report, Some(2 * MS), "from the first wait");
        pace.waiting(t + 10 * MS);
        pace.read(t + 10 * MS + Duration::from_micros(500), 1);
        assert_eq!(
            pace.per_report,
            Some((2 * MS * 3 + Duration::from_micros(500)) / 4)
        );
        pace.waiting(t);
        pace.read(t + Duration::from_secs(100), 1);
        assert_eq!(pace.plan(16, 100).hold, Some(HOLD_MAX));
        let mut fast = Pace::default();
        fast.waiting(t);
        fast.read(t + Duration::from_micros(10), 10);
        assert_eq!(fast.plan(16, 100).hold, Some(HOLD_MIN));
    }
}
