//! `loaderctl top`: a live view of a deployment, redrawn every interval.
//! Workers: samples and batches delivered per second, how busy the
//! producer was, the queue (batches assigned, not yet delivered); when any
//! read from an object store, their requests and MB per second from the
//! store, failures, retries, hit ratios and latency (`storage`). Sessions:
//! the share of time the trainer waited for batches (stall), and its
//! watermark. Jobs: progress, delivery rate and the ETA at that rate.
//!
//! Rates are differences between polls of the coordinator's AdminService.
//! A worker's or session's counters change only when it heartbeats (a
//! session every lease TTL / 3), so their rates are taken between the
//! heartbeats the polls saw (poll time less `last_seen_ms`), not between
//! the polls: a poll that saw no new heartbeat keeps the rate shown last,
//! instead of showing 0 and then double. A job's counters add up many
//! processes' reports; its rate is taken between polls. Until a second
//! report (or poll) there is no rate (`-`). `--once` takes two polls one
//! interval apart and prints the second frame as plain text, which is what
//! scripts and tests read.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use loader_client::connect;
use loader_proto::pb::{ConsumerProgress, JobInfo};

use super::TopArgs;
use super::signals;
use super::status::{self, Status};
use super::storage;
use super::table::render;
use super::terminal::{Input, Screen};

/// Shortest interval: polls are three unary calls each.
const MIN_INTERVAL_S: f64 = 0.1;
/// Longest interval.
const MAX_INTERVAL_S: f64 = 3600.0;
/// How often keys and signals are looked at between redraws.
const TICK: Duration = Duration::from_millis(50);
/// Heartbeat times derived from two polls closer than this are the same
/// heartbeat (the polls' own timing jitters by a few milliseconds).
const SAME_REPORT: Duration = Duration::from_millis(50);

/// One poll and when it came back.
#[derive(Debug, Clone)]
struct Poll {
    status: Status,
    at: Instant,
}

/// Runs the live view until q, Ctrl-C or SIGTERM (or prints one frame with
/// `--once`).
pub(crate) fn run(args: &TopArgs) -> anyhow::Result<()> {
    let interval = args.interval;
    let address = connect::normalize(&args.coordinator);
    let runtime = status::runtime()?;
    let mut admin = runtime.block_on(status::admin(&address))?;
    let mut poll = || {
        let status = runtime.block_on(status::poll(&mut admin, &address))?;
        Ok::<_, loader_client::LoaderError>(Poll {
            status,
            at: Instant::now(),
        })
    };
    let mut view = View::default();
    let first = view.frame(&address, &poll()?);
    if args.once {
        std::thread::sleep(interval);
        print!("{}", view.frame(&address, &poll()?));
        return Ok(());
    }
    signals::watch()?;
    let screen = Screen::open()?;
    screen.draw(&first);
    while wait(&screen, interval) {
        match poll() {
            Ok(now) => screen.draw(&view.frame(&address, &now)),
            // The coordinator may be restarting: say so and keep polling.
            Err(e) => screen.draw(&format!(
                "{}\n\n{e}\nretrying every {}s (q quits)\n",
                title(&address),
                interval.as_secs_f64()
            )),
        }
    }
    Ok(())
}

/// `--interval SECONDS`: a finite number within bounds (clap makes the
/// error one line, naming the flag).
pub(crate) fn parse_interval(s: &str) -> Result<Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && (MIN_INTERVAL_S..=MAX_INTERVAL_S).contains(&x) => {
            Ok(Duration::from_secs_f64(x))
        }
        _ => Err(format!("not a number of seconds from {MIN_INTERVAL_S} to {MAX_INTERVAL_S}; e.g. --interval 0.5")),
    }
}

/// Waits one interval (redrawing the frame at once if the terminal is
/// resized); false as soon as q was typed or SIGINT/SIGTERM arrived.
fn wait(screen: &Screen, interval: Duration) -> bool {
    let deadline = Instant::now() + interval;
    loop {
        if signals::check().is_err() {
            return false;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        match screen.input(left.min(TICK)) {
            Some(Input::Quit) => return false,
            Some(Input::Resized) => screen.redraw(),
            None => {}
        }
    }
}

fn title(address: &str) -> String {
    format!("loaderctl top  {address}")
}

/// `now - before` per second over `seconds`, unless the counter went back
/// (a restarted coordinator counts from zero).
fn rate(before: u64, now: u64, seconds: f64) -> Option<f64> {
    (seconds > 0.0 && now >= before).then(|| (now - before) as f64 / seconds)
}

/// The latest report of one worker or session that rates are measured from.
#[derive(Debug, Clone, Copy)]
struct Report {
    /// When it heartbeated, by this machine's clock.
    at: Instant,
    /// What it reported: a worker its samples and batches delivered, a
    /// session its stall milliseconds (and 0).
    counters: [u64; 2],
    /// Per second since the report before, as shown last.
    rates: Option<[f64; 2]>,
}

/// The reports of one kind of process (workers or sessions), by id.
#[derive(Debug, Default)]
struct Reports(HashMap<u64, Report>);

impl Reports {
    /// Rates of `counters` of process `id`, which it reported `ago` before
    /// the poll at `polled`: since its previous report, or as last shown
    /// when it has not reported since.
    fn rates(
        &mut self,
        id: u64,
        polled: Instant,
        ago: u64,
        counters: [u64; 2],
    ) -> Option<[f64; 2]> {
        let at = polled
            .checked_sub(Duration::from_millis(ago))
            .unwrap_or(polled);
        let Some(last) = self.0.get_mut(&id) else {
            self.0.insert(
                id,
                Report {
                    at,
                    counters,
                    rates: None,
                },
            );
            return None;
        };
        let gap = at.saturating_duration_since(last.at);
        if gap >= SAME_REPORT {
            let seconds = gap.as_secs_f64();
            let rates = rate(last.counters[0], counters[0], seconds).zip(rate(
                last.counters[1],
                counters[1],
                seconds,
            ));
            *last = Report {
                at,
                counters,
                rates: rates.map(|(a, b)| [a, b]),
            };
        }
        last.rates
    }

    /// Forgets the processes no longer listed.
    fn keep(&mut self, ids: &[u64]) {
        self.0.retain(|id, _| ids.contains(id));
    }
}

/// What rates are measured from, carried from frame to frame.
#[derive(Debug, Default)]
struct View {
    workers: Reports,
    /// The workers' requests to stores and bytes fetched.
    storage: Reports,
    sessions: Reports,
    /// Each job's distinct delivered batches at the previous poll, and when.
    jobs: HashMap<u64, (Instant, u64)>,
}

fn per_second(rate: Option<f64>) -> String {
    match rate {
        None => "-".into(),
        Some(r) if r >= 100.0 => format!("{r:.0}"),
        Some(r) => format!("{r:.1}"),
    }
}

fn percent(fraction: f64) -> String {
    format!("{:.0}%", (fraction * 100.0).clamp(0.0, 100.0))
}

/// A duration for the ETA column: `42s`, `12m05s`, `3h07m`.
fn clock(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s / 60 % 60),
    }
}

/// The consumers a job's progress counts: its ranks, or on a shared stream
/// its subscribers still there (all of them once none is).
fn counted(info: &JobInfo) -> Vec<&ConsumerProgress> {
    let shared = info.job.as_ref().and_then(|j| j.spec.as_ref()).is_some_and(|s| s.shared.is_some());
    if !shared {
        return info.consumers.iter().collect();
    }
    let subscribers: Vec<&ConsumerProgress> = info.consumers.iter().filter(|c| c.subscribes_to.is_some()).collect();
    let live: Vec<&ConsumerProgress> = subscribers.iter().copied().filter(|c| !c.left).collect();
    if live.is_empty() { subscribers } else { live }
}

/// A job's batches summed over the consumers it counts: (distinct
/// delivered, consumed, total).
fn job_batches(info: &JobInfo) -> (u64, u64, u64) {
    counted(info).into_iter().fold((0, 0, 0), |(d, c, t), p| {
        (
            d + p.delivered.saturating_sub(p.resent),
            c + p.consumed,
            t + p.total,
        )
    })
}

impl View {
    /// One frame of the poll `now`: the three tables, with rates.
    fn frame(&mut self, address: &str, now: &Poll) -> String {
        let Status { workers, sessions, jobs } = &now.status;
        let worker_rows = self.worker_rows(now);
        let storage = self.storage_table(now);
        let session_rows = self.session_rows(now);
        let job_rows = self.job_rows(now);
        format!(
            "{}\n\nWORKERS ({})\n{}{storage}\nSESSIONS ({})\n{}\nJOBS ({})\n{}",
            title(address),
            workers.len(),
            render(&["ID", "ADDRESS", "SAMPLES/S", "BATCHES/S", "BUSY", "QUEUE", "DRAINING"], &worker_rows),
            sessions.len(),
            render(&["ID", "JOB", "RANK", "NODE", "STALL", "WATERMARK"], &session_rows),
            jobs.len(),
            render(&["ID", "NAME", "PROGRESS", "BATCHES/S", "SAMPLES/S", "CACHE", "ETA"], &job_rows),
        )
    }

    /// The workers' table: delivery rates since the last poll.
    fn worker_rows(&mut self, now: &Poll) -> Vec<Vec<String>> {
        let workers = &now.status.workers;
        let rows = workers
            .iter()
            .map(|w| {
                let rates = self.workers.rates(w.worker_id, now.at, w.last_seen_ms, [w.delivered_samples, w.delivered]);
                vec![
                    w.worker_id.to_string(),
                    w.address.clone(),
                    per_second(rates.map(|r| r[0])),
                    per_second(rates.map(|r| r[1])),
                    percent(w.busy),
                    w.outstanding.to_string(),
                    if w.draining { "yes" } else { "no" }.into(),
                ]
            })
            .collect();
        self.workers.keep(&workers.iter().map(|w| w.worker_id).collect::<Vec<_>>());
        rows
    }

    /// The workers' reads from stores, after their table: requests and MB
    /// per second between heartbeats (the sum's are its workers' added up),
    /// then their totals; nothing when no worker read from a store.
    fn storage_table(&mut self, now: &Poll) -> String {
        let workers = &now.status.workers;
        let readers = storage::readers(workers);
        let rates: Vec<Option<[f64; 2]>> =
            readers.iter().map(|(w, t)| self.storage.rates(w.worker_id, now.at, w.last_seen_ms, [t.requests, t.bytes])).collect();
        self.storage.keep(&readers.iter().map(|(w, _)| w.worker_id).collect::<Vec<_>>());
        if readers.is_empty() {
            return String::new();
        }
        let summed = rates.iter().flatten().copied().reduce(|a, b| [a[0] + b[0], a[1] + b[1]]);
        let row = |id: Option<u64>, rates: Option<[f64; 2]>, t: &loader_storage::StorageTotals| {
            let mut cells = vec![
                storage::label(id),
                per_second(rates.map(|r| r[0])),
                per_second(rates.map(|r| r[1] / 1e6)),
                t.requests.to_string(),
            ];
            cells.extend(storage::totals_cells(t));
            cells
        };
        let rows: Vec<Vec<String>> = storage::sum(&readers)
            .map(|all| row(None, summed, &all))
            .into_iter()
            .chain(readers.iter().zip(&rates).map(|((w, t), r)| row(Some(w.worker_id), *r, t)))
            .collect();
        let headers: Vec<&str> = ["WORKER", "REQUESTS/S", "MB/S", "REQUESTS"].into_iter().chain(storage::TOTALS_HEADERS).collect();
        format!("\n{}\n{}", storage::title(readers.len()), render(&headers, &rows))
    }

    /// The sessions' table: stall as a share of the time since the last
    /// poll, and their consumer's watermark.
    fn session_rows(&mut self, now: &Poll) -> Vec<Vec<String>> {
        let Status { sessions, jobs, .. } = &now.status;
        let watermarks: HashMap<(u64, u32), (u64, u64)> = jobs
            .iter()
            .flat_map(|j| {
                let job_id = j.job.as_ref().map_or(0, |job| job.job_id);
                j.consumers.iter().map(move |c| ((job_id, c.consumer), (c.consumed, c.total)))
            })
            .collect();
        let rows = sessions
            .iter()
            .map(|s| {
                // Stall milliseconds per second, as a share of the second.
                let stall = self.sessions.rates(s.session_id, now.at, s.last_seen_ms, [s.stall_ms, 0]);
                vec![
                    s.session_id.to_string(),
                    s.job_id.to_string(),
                    s.consumer.to_string(),
                    s.node.clone(),
                    stall.map_or_else(|| "-".into(), |r| percent(r[0] / 1000.0)),
                    watermarks
                        .get(&(s.job_id, s.consumer))
                        .map_or_else(|| "-".into(), |(consumed, total)| format!("{consumed}/{total}")),
                ]
            })
            .collect();
        self.sessions.keep(&sessions.iter().map(|s| s.session_id).collect::<Vec<_>>());
        rows
    }

    /// The jobs' table: progress, rates since the last poll and the time
    /// left at that rate.
    fn job_rows(&mut self, now: &Poll) -> Vec<Vec<String>> {
        let mut delivered_now = HashMap::new();
        let rows = now
            .status
            .jobs
            .iter()
            .map(|info| {
                let job = info.job.clone().unwrap_or_default();
                let spec = job.spec.unwrap_or_default();
                let (delivered, consumed, total) = job_batches(info);
                delivered_now.insert(job.job_id, (now.at, delivered));
                let batches = self
                    .jobs
                    .get(&job.job_id)
                    .and_then(|&(at, before)| rate(before, delivered, now.at.saturating_duration_since(at).as_secs_f64()));
                let eta = if !info.error.is_empty() {
                    "failed".into()
                } else if consumed >= total {
                    "done".into()
                } else {
                    match batches {
                        Some(r) if r > 0.0 => clock(total.saturating_sub(delivered) as f64 / r),
                        _ => "-".into(),
                    }
                };
                let name = if spec.name.is_empty() { "-".into() } else { spec.name.clone() };
                let live = info.consumers.iter().filter(|c| c.subscribes_to.is_some() && !c.left).count();
                vec![
                    job.job_id.to_string(),
                    if spec.shared.is_some() { format!("{name} [{live} subscribers]") } else { name },
                    format!("{consumed}/{total} ({:.1}%)", 100.0 * consumed as f64 / total.max(1) as f64),
                    per_second(batches),
                    per_second(batches.map(|r| r * f64::from(spec.batch_size))),
                    crate::status::cache_use(info.cache.as_ref()),
                    eta,
                ]
            })
            .collect();
        self.jobs = delivered_now;
        rows
    }
}

#[cfg(test)]
mod tests {
    use loader_proto::pb::{Job, JobSpec, SessionInfo, WorkerInfo};

    use super::*;

    fn job(consumed: u64, delivered: u64, resent: u64) -> JobInfo {
        JobInfo {
            job: Some(Job {
                job_id: 3,
                spec: Some(JobSpec {
                    name: "train".into(),
                    batch_size: 64,
                    ..Default::default()
                }),
                num_samples: 64_000,
                batches_per_epoch: 1000,
            }),
            consumers: vec![ConsumerProgress {
                consumer: 0,
                consumed,
                delivered,
                resent,
                total: 1000,
                assigned: 0,
                ..Default::default()
            }],
            error: String::new(),
            cache: None,
        }
    }

    /// A poll at `at` of one worker, one session and `job`; the worker and
    /// session heartbeated `ago` ms before it.
    fn poll(at: Instant, ago: u64, delivered: u64, stall_ms: u64, job: JobInfo) -> Poll {
        Poll {
            status: Status {
                workers: vec![WorkerInfo {
                    worker_id: 7,
                    address: "http://w:1".into(),
                    delivered,
                    delivered_samples: delivered * 64,
                    busy: 0.5,
                    outstanding: 12,
                    last_seen_ms: ago,
                    ..Default::default()
                }],
                sessions: vec![SessionInfo {
                    session_id: 9,
                    job_id: 3,
                    consumer: 0,
                    node: "n".into(),
                    stall_ms,
                    last_seen_ms: ago,
                    ..Default::default()
                }],
                jobs: vec![job],
            },
            at,
        }
    }

    /// The cells of the row under `header` whose first cell is `id`.
    fn row(frame: &str, header: &str, id: &str) -> Vec<String> {
        frame
            .lines()
            .skip_while(|l| !l.starts_with(header))
            .skip(2)
            .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .find(|cells| cells.first().map(String::as_str) == Some(id))
            .unwrap_or_else(|| panic!("no row {id} under {header} in\n{frame}"))
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn rates_are_deltas_between_reports() {
        let t0 = Instant::now();
        let mut view = View::default();
        let first = view.frame("http://c:1", &poll(t0, 0, 100, 1000, job(90, 100, 0)));
        assert_eq!(
            row(&first, "WORKERS", "7")[2..4],
            ["-", "-"],
            "no rate from one report: {first}"
        );
        assert_eq!(row(&first, "SESSIONS", "9")[4], "-", "{first}");
        assert_eq!(row(&first, "JOBS", "3")[6], "-", "{first}");

        let f = view.frame(
            "http://c:1",
            &poll(t0 + secs(2), 0, 300, 1500, job(290, 310, 10)),
        );
        assert_eq!(
            row(&f, "WORKERS", "7"),
            ["7", "http://w:1", "6400", "100", "50%", "12", "no"],
            "{f}"
        );
        // 500 ms of stall in 2 s.
        assert_eq!(
            row(&f, "SESSIONS", "9"),
            ["9", "3", "0", "n", "25%", "290/1000"],
            "{f}"
        );
        // 200 distinct batches in 2 s; 700 left at 100/s.
        assert_eq!(
            row(&f, "JOBS", "3"),
            ["3", "train", "290/1000", "(29.0%)", "100", "6400", "-", "7s"],
            "{f}"
        );
    }

    #[test]
    fn rates_are_measured_between_heartbeats_not_polls() {
        let t0 = Instant::now();
        let mut view = View::default();
        view.frame("http://c:1", &poll(t0, 0, 100, 1000, job(0, 0, 0)));
        // Polled 3 s later, but the last heartbeat was 1 s after the first:
        // 1 s of reports.
        let f = view.frame(
            "http://c:1",
            &poll(t0 + secs(3), 2000, 200, 1250, job(0, 0, 0)),
        );
        assert_eq!(row(&f, "WORKERS", "7")[3], "100", "{f}");
        assert_eq!(row(&f, "SESSIONS", "9")[4], "25%", "{f}");
        // No heartbeat since: the rates shown last, not zero.
        let f = view.frame(
            "http://c:1",
            &poll(t0 + secs(4), 3000, 200, 1250, job(0, 0, 0)),
        );
        assert_eq!(row(&f, "WORKERS", "7")[3], "100", "{f}");
        assert_eq!(row(&f, "SESSIONS", "9")[4], "25%", "{f}");
    }

    #[test]
    fn finished_and_failed_jobs_say_so() {
        let t0 = Instant::now();
        let mut failed = job(10, 10, 0);
        failed.error = "bad sample".into();
        let f = View::default().frame("http://c:1", &poll(t0, 0, 0, 0, job(1000, 1000, 0)));
        assert_eq!(row(&f, "JOBS", "3")[7], "done", "{f}");
        let f = View::default().frame("http://c:1", &poll(t0, 0, 0, 0, failed));
        assert_eq!(row(&f, "JOBS", "3")[7], "failed", "{f}");
    }

    /// A shared stream's progress is its subscribers' (its rank itself
    /// never consumes), and its row says how many are there.
    #[test]
    fn a_shared_stream_counts_its_subscribers() {
        let mut shared = job(0, 0, 0);
        if let Some(spec) = shared.job.as_mut().and_then(|j| j.spec.as_mut()) {
            spec.shared = Some(Default::default());
        }
        let sub = |consumer, consumed, left| ConsumerProgress {
            consumer,
            consumed,
            delivered: consumed,
            total: 1000,
            subscribes_to: Some(0),
            left,
            ..Default::default()
        };
        shared.consumers.extend([sub(1, 1000, false), sub(2, 1000, false), sub(3, 10, true)]);
        let f = View::default().frame("http://c:1", &poll(Instant::now(), 0, 0, 0, shared));
        let line = f.lines().rev().find(|l| l.starts_with("3 ")).expect("the job's row");
        assert!(line.contains("train [2 subscribers]") && line.contains("2000/2000") && line.ends_with("done"), "{f}");
    }

    /// A job's row says how its sample cache does.
    #[test]
    fn a_jobs_row_shows_its_sample_cache() {
        let mut cached = job(0, 0, 0);
        cached.cache = Some(loader_proto::pb::CacheUse { hits: 3, misses: 1, stored_bytes: 2_000_000, ..Default::default() });
        let f = View::default().frame("http://c:1", &poll(Instant::now(), 0, 0, 0, cached));
        assert!(f.contains("CACHE") && f.contains("75% hits, 2 MB"), "{f}");
    }

    /// A worker that read from a store: its requests and MB per second
    /// between heartbeats, then its totals; nothing when none did.
    #[test]
    fn a_workers_reads_from_stores_show_with_rates() {
        let t0 = Instant::now();
        let with_storage = |at: Instant, requests: u64, bytes: u64| {
            let mut p = poll(at, 0, 0, 0, job(0, 0, 0));
            p.status.workers[0].storage = Some(loader_proto::pb::StorageUse {
                requests,
                bytes,
                chunk_reads: 50,
                chunk_fetches: 5,
                latency_buckets: vec![0, 0, 0, 0, 0, requests],
                ..Default::default()
            });
            p
        };
        let plain = View::default().frame("http://c:1", &poll(t0, 0, 0, 0, job(0, 0, 0)));
        assert!(!plain.contains("STORAGE"), "{plain}");
        let mut view = View::default();
        let first = view.frame("http://c:1", &with_storage(t0, 100, 10_000_000));
        assert_eq!(row(&first, "STORAGE", "7"), ["7", "-", "-", "100", "0", "0", "90%", "-", "<32ms", "<32ms"], "{first}");
        let f = view.frame("http://c:1", &with_storage(t0 + secs(2), 300, 50_000_000));
        // 200 requests and 40 MB in 2 s.
        assert_eq!(row(&f, "STORAGE", "7"), ["7", "100", "20.0", "300", "0", "0", "90%", "-", "<32ms", "<32ms"], "{f}");
        let storage = f.find("STORAGE (1 worker").expect("table");
        assert!(f.find("WORKERS").is_some_and(|w| w < storage) && f.find("SESSIONS").is_some_and(|s| s > storage), "{f}");
    }

    #[test]
    fn intervals_and_clocks() {
        assert_eq!(parse_interval("1").ok(), Some(Duration::from_secs(1)));
        assert_eq!(parse_interval("0.5").ok(), Some(Duration::from_millis(500)));
        for bad in ["0", "-1", "abc", "nan", "inf", "1e9", ""] {
            let e = parse_interval(bad).expect_err(bad).to_string();
            assert!(e.starts_with("not a number of seconds") && !e.contains('\n'), "{e}");
        }
        assert_eq!(clock(7.0), "7s");
        assert_eq!(clock(725.0), "12m05s");
        assert_eq!(clock(3.0 * 3600.0 + 420.0), "3h07m");
    }
}
