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
//! Three bounds keep it from waiting for reports that will not come: never
//! more than the batches the job still owes; a hold deadline of twice the
//! time those reports took lately (a worker that stops, or batches that
//! come over gRPC instead); and after a hold ran out, no more than came
//! within it, twice as many after each wait whose reports all came (a
//! worker descheduled for a moment costs a wait or two). Grants are
//! not reports: workers short of tasks (large batches, whose windows hold
//! two or three) or held up behind a gap in the order send fewer, and a
//! plan that counted on them slept to its deadline with the slots full and
//! unread; counting such a wait as the workers' pace made the next hold
//! longer still (8 workers of 38.5 MB batches: 3.7 GB/s with the hold at
//! 50 ms, 15 GB/s with these bounds, `docs/benchmarks.md`). Until a rate is
//! known, whenever only one report can come, and when reports come more
//! than a millisecond apart (a wake-up is then at most 2% of their time),
//! it wakes for each.

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
/// Reports further apart than this are each worth a wake-up: one costs
/// 15-20 µs of CPU (see [`crate::doorbell`]), at most 2% of the time
/// between them, and sleeping through several would only leave the
/// workers' slots full and unread for longer.
const MODERATE_BELOW: Duration = Duration::from_millis(1);

/// What one wait asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Filled reports to wake for.
    pub reports: u64,
    /// Read what is there by then, whatever came; `None` for one report.
    pub hold: Option<Duration>,
}

/// The consumer's estimate of how fast reports come.
#[derive(Debug)]
pub struct Pace {
    /// Smoothed time between two filled reports while the consumer waited.
    per_report: Option<Duration>,
    /// When the consumer started waiting, if it is.
    waiting_since: Option<Instant>,
    /// The wait under way: the reports it asked for, and when its hold
    /// runs out (`None`: no hold).
    asked: Option<(u64, Option<Instant>)>,
    /// Most reports a wake-up asks for now. A hold that ran out before its
    /// reports came says fewer can come than the grants suggest (workers
    /// short of tasks, or their batches held up behind a gap in the order):
    /// the next wait asks for what came, and each wait whose reports all
    /// came lets the next ask for twice as many, up to
    /// `MAX_REPORTS_PER_WAKE`.
    cap: u32,
}

impl Default for Pace {
    fn default() -> Self {
        Self {
            per_report: None,
            waiting_since: None,
            asked: None,
            cap: MAX_REPORTS_PER_WAKE,
        }
    }
}

impl Pace {
    /// The plan for a wait, with `in_flight` grants the workers know of and
    /// `owed` batches the job has yet to deliver to this consumer.
    #[inline]
    pub fn plan(&self, in_flight: u32, owed: u64) -> Plan {
        let (num, den) = SLEEP_THROUGH;
        let reports = u64::from((in_flight.saturating_mul(num) / den).min(self.cap)).min(owed);
        match self.per_report {
            Some(per) if reports > 1 && per < MODERATE_BELOW => Plan {
                reports,
                hold: Some((per * 2 * reports as u32).clamp(HOLD_MIN, HOLD_MAX)),
            },
            _ => Plan {
                reports: 1,
                hold: None,
            },
        }
    }

    /// The consumer starts waiting at `now` for what `plan` asks.
    #[inline]
    pub fn waiting(&mut self, now: Instant, plan: Plan) {
        self.waiting_since.get_or_insert(now);
        self.asked = Some((plan.reports, plan.hold.map(|hold| now + hold)));
    }

    /// A read at `now` found `filled` reports. Only the time spent waiting
    /// counts: a consumer busy elsewhere says nothing about its workers.
    #[inline]
    pub fn read(&mut self, now: Instant, filled: u64) {
        let asked = self.asked.take();
        if let Some((reports, Some(hold_at))) = asked
            && filled < reports
            && now >= hold_at
        {
            // The hold ran out first. Ask for what came from now on; and
            // take no sample: the wait's length was the hold's, not the
            // workers' pace (counting it would lengthen the next hold,
            // which would run out again, longer).
            self.cap = u32::try_from(filled).unwrap_or(u32::MAX).clamp(1, MAX_REPORTS_PER_WAKE);
            self.waiting_since = None;
            return;
        }
        if filled == 0 {
            // Woken by something else (an event, a tick): the wait goes on.
            self.asked = asked;
            return;
        }
        let Some(since) = self.waiting_since.take() else {
            return;
        };
        if asked.is_some_and(|(reports, _)| filled >= reports) {
            self.cap = (self.cap * 2).min(MAX_REPORTS_PER_WAKE);
        }
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
    /// Reports this far apart are moderated.
    const PER: Duration = Duration::from_micros(900);
    const ONE: Plan = Plan {
        reports: 1,
        hold: None,
    };

    #[test]
    fn a_hold_that_runs_out_asks_for_what_came_and_takes_no_sample() {
        let mut pace = Pace::default();
        let t = Instant::now();
        pace.waiting(t, ONE);
        pace.read(t + Duration::from_micros(100), 1);
        let plan = pace.plan(16, 1000);
        assert_eq!(plan.reports, 12);
        let per = pace.per_report;
        // Only 3 of the 12 came before the hold ran out.
        pace.waiting(t, plan);
        pace.read(t + plan.hold.unwrap(), 3);
        assert_eq!(pace.per_report, per, "the hold's length is not the workers' pace");
        assert_eq!(pace.plan(16, 1000).reports, 3);
        // Every report asked for came: twice as many next time, up to the
        // most.
        for want in [6, 12] {
            let plan = pace.plan(16, 1000);
            pace.waiting(t, plan);
            pace.read(t + Duration::from_micros(50), plan.reports);
            assert_eq!(pace.plan(16, 1000).reports, want);
        }
        pace.waiting(t, pace.plan(16, 1000));
        pace.read(t + Duration::from_micros(50), 12);
        assert_eq!(pace.plan(16, 1000).reports, 12, "never past the most");
        // Nothing by the hold: one at a time.
        let plan = pace.plan(16, 1000);
        pace.waiting(t, plan);
        pace.read(t + plan.hold.unwrap(), 0);
        assert_eq!(pace.plan(16, 1000), ONE);
    }

    #[test]
    fn a_wake_up_ended_early_by_something_else_changes_nothing() {
        let mut pace = Pace::default();
        let t = Instant::now();
        pace.waiting(t, ONE);
        pace.read(t + Duration::from_micros(100), 1);
        let plan = pace.plan(16, 1000);
        pace.waiting(t, plan);
        // Woken by an event before the hold, with fewer reports than asked.
        pace.read(t + Duration::from_micros(10), 0);
        pace.read(t + Duration::from_micros(20), 2);
        assert_eq!(pace.plan(16, 1000).reports, 12, "the most stays");
    }

    #[test]
    fn reports_far_apart_are_each_worth_a_wake_up() {
        let mut pace = Pace::default();
        let t = Instant::now();
        pace.waiting(t, ONE);
        pace.read(t + 3 * MS, 1);
        assert_eq!(pace.plan(16, 1000), ONE);
    }

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
        pace.waiting(t, ONE);
        pace.read(t + 2 * PER, 2);
        assert_eq!(
            pace.plan(10, 1000),
            Plan {
                reports: 7,
                hold: Some(14 * PER)
            }
        );
        assert_eq!(pace.plan(64, 1000).reports, u64::from(MAX_REPORTS_PER_WAKE));
        assert_eq!(
            pace.plan(16, 3),
            Plan {
                reports: 3,
                hold: Some(6 * PER)
            },
            "owed"
        );
        assert_eq!(
            pace.plan(3, 1000),
            Plan {
                reports: 2,
                hold: Some(4 * PER)
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
        pace.waiting(t, ONE);
        pace.waiting(t + MS, ONE);
        pace.read(t + 8 * MS, 4);
        assert_eq!(pace.per_report, Some(2 * MS), "from the first wait");
        pace.waiting(t + 10 * MS, ONE);
        pace.read(t + 10 * MS + Duration::from_micros(500), 1);
        assert_eq!(
            pace.per_report,
            Some((2 * MS * 3 + Duration::from_micros(500)) / 4)
        );
        let mut slow = Pace::default();
        slow.per_report = Some(Duration::from_micros(990));
        assert_eq!(slow.plan(16, 100).hold, Some(HOLD_MAX.min(Duration::from_micros(990) * 24)));
        slow.per_report = Some(Duration::from_micros(9_000));
        assert_eq!(slow.plan(16, 100), ONE, "far apart: no hold at all");
        let mut fast = Pace::default();
        fast.waiting(t, ONE);
        fast.read(t + Duration::from_micros(10), 10);
        assert_eq!(fast.plan(16, 100).hold, Some(HOLD_MIN));
    }
}
