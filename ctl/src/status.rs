//! `loaderctl status`: the coordinator's workers, trainer sessions and jobs,
//! from AdminService, as tables or as one JSON object (`--json`); the polls
//! that `loaderctl top` shares; and `loaderctl drain`, which tells a worker
//! to drain.

use loader_proto::pb::admin_service_client::AdminServiceClient;
use loader_proto::pb::dataset_spec::Kind;
use loader_proto::pb::{
    CacheUse, DrainWorkerRequest, Dtype, JobInfo, ListJobsRequest, ListSessionsRequest, ListWorkersRequest,
    ConsumerProgress, SessionInfo, WorkerInfo,
};
use serde_json::json;
use tonic::Code;
use loader_process::grpc::Channel;

use super::table::render;
use super::{DrainArgs, StatusArgs};
use loader_client::LoaderError;
use loader_client::connect::{self, attempt};

/// What `status` shows: one poll of the three AdminService lists.
#[derive(Debug, Default, Clone)]
pub(crate) struct Status {
    /// ListWorkers.
    pub(crate) workers: Vec<WorkerInfo>,
    /// ListSessions.
    pub(crate) sessions: Vec<SessionInfo>,
    /// ListJobs.
    pub(crate) jobs: Vec<JobInfo>,
}

/// Prints the tables, or the JSON object, on stdout.
pub(crate) fn run(args: &StatusArgs) -> anyhow::Result<()> {
    let address = connect::normalize(&args.coordinator);
    let status = runtime()?.block_on(async {
        let mut admin = admin(&address).await?;
        poll(&mut admin, &address).await
    })?;
    if args.json {
        println!("{}", status_json(&status));
    } else {
        print!("{}", render_status(&status, if args.all { usize::MAX } else { SHOWN }));
    }
    Ok(())
}

/// Tells the worker to drain and prints one line; an unknown worker is an
/// error.
pub(crate) fn drain(args: &DrainArgs) -> anyhow::Result<()> {
    let address = connect::normalize(&args.coordinator);
    let worker = args.worker;
    runtime()?.block_on(async {
        let mut admin = admin(&address).await?;
        match attempt(
            &address,
            "DrainWorker",
            admin.drain_worker(DrainWorkerRequest { worker_id: worker }),
        )
        .await
        {
            Err(e) if e.code() == Some(Code::NotFound) => Err(anyhow::anyhow!(
                "coordinator {address} has no worker with id {worker}; `loaderctl status` lists the workers"
            )),
            other => other.map(drop).map_err(anyhow::Error::from),
        }
    })?;
    println!(
        "worker {worker} is draining: it finishes the batches it holds, takes no new tasks, then deregisters and exits"
    );
    Ok(())
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, LoaderError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| LoaderError::Runtime(e.to_string()))
}

/// A client of the coordinator's AdminService, connected (bounded).
pub(crate) async fn admin(address: &str) -> Result<AdminServiceClient<Channel>, LoaderError> {
    let channel = connect::coordinator(address, loader_process::security::Role::Admin).await?;
    Ok(AdminServiceClient::new(channel).max_decoding_message_size(usize::MAX))
}

/// Lists workers, sessions and jobs, one bounded call each.
pub(crate) async fn poll(admin: &mut AdminServiceClient<Channel>, address: &str) -> Result<Status, LoaderError> {
    let workers = attempt(
        address,
        "ListWorkers",
        admin.list_workers(ListWorkersRequest {}),
    )
    .await?
    .workers;
    let sessions = attempt(
        address,
        "ListSessions",
        admin.list_sessions(ListSessionsRequest {}),
    )
    .await?
    .sessions;
    let jobs = attempt(address, "ListJobs", admin.list_jobs(ListJobsRequest {}))
        .await?
        .jobs;
    Ok(Status {
        workers,
        sessions,
        jobs,
    })
}

/// The JSON object of `status --json`. The field names are an interface
/// for scripts (listed in the flag's help): add, never rename.
fn status_json(status: &Status) -> serde_json::Value {
    let workers: Vec<serde_json::Value> = status
        .workers
        .iter()
        .map(|w| {
            json!({
                "worker_id": w.worker_id,
                "address": w.address,
                "node": w.node,
                "outstanding": w.outstanding,
                "delivered": w.delivered,
                "delivered_samples": w.delivered_samples,
                "busy": w.busy,
                "last_seen_ms": w.last_seen_ms,
                "draining": w.draining,
                "pid": w.pid,
                "storage": super::storage::json(w.storage.as_ref()),
            })
        })
        .collect();
    let sessions: Vec<serde_json::Value> = status
        .sessions
        .iter()
        .map(|s| {
            json!({
                "session_id": s.session_id,
                "job_id": s.job_id,
                "consumer": s.consumer,
                "node": s.node,
                "ring": s.ring,
                "last_seen_ms": s.last_seen_ms,
                "stall_ms": s.stall_ms,
            })
        })
        .collect();
    let jobs: Vec<serde_json::Value> = status
        .jobs
        .iter()
        .map(|info| {
            let job = info.job.clone().unwrap_or_default();
            let spec = job.spec.unwrap_or_default();
            let consumers: Vec<serde_json::Value> = info
                .consumers
                .iter()
                .map(|c| {
                    json!({
                        "consumer": c.consumer,
                        "assigned": c.assigned,
                        "delivered": c.delivered,
                        "resent": c.resent,
                        "consumed": c.consumed,
                        "total": c.total,
                        "subscribes_to": c.subscribes_to,
                        "left": c.left,
                        "assigned_alone": c.assigned_alone,
                    })
                })
                .collect();
            json!({
                "job_id": job.job_id,
                "name": spec.name,
                "dataset": dataset(&spec.dataset.and_then(|d| d.kind)),
                "num_samples": job.num_samples,
                "batch_size": spec.batch_size,
                "batches_per_epoch": job.batches_per_epoch,
                "error": (!info.error.is_empty()).then_some(&info.error),
                "shared": spec.shared.is_some(),
                "subscribers": info.consumers.iter().filter(|c| c.subscribes_to.is_some() && !c.left).count(),
                "cache": info.cache.as_ref().map(|c| json!({
                    "hits": c.hits,
                    "misses": c.misses,
                    "hit_ratio": hit_ratio(c),
                    "stored_bytes": c.stored_bytes,
                    "refused": c.refused,
                    "off": (!c.off.is_empty()).then_some(&c.off),
                })),
                "consumers": consumers,
            })
        })
        .collect();
    json!({ "workers": workers, "sessions": sessions, "jobs": jobs })
}

fn ago(ms: u64) -> String {
    format!("{:.1}s ago", ms as f64 / 1000.0)
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}

/// Rows of each table shown unless `--all`: a deployment of thousands of
/// workers and ranks would print a screen per hundred of them. The rows
/// shown are those an operator looks for first (see `render_status`); the
/// counts are of all.
const SHOWN: usize = 40;

/// Ranks listed one by one in a job's row, unless `--all`; more are summed
/// up.
const RANKS_SHOWN: usize = 8;

/// The tables, each with at most `shown` rows: workers holding the most
/// undelivered batches first (draining ones before all), then their reads
/// from stores if any, sessions that stalled longest first; a last line
/// says how many were left out.
fn render_status(status: &Status, shown: usize) -> String {
    let Status {
        workers,
        sessions,
        jobs,
    } = status;
    let listed_workers = first_by(workers, shown, |w| {
        (std::cmp::Reverse(w.draining), std::cmp::Reverse(w.outstanding), w.worker_id)
    });
    let listed_sessions = first_by(sessions, shown, |s| (std::cmp::Reverse(s.stall_ms), s.session_id));
    let left_out = match (workers.len() - listed_workers.len(), sessions.len() - listed_sessions.len()) {
        (0, 0) => String::new(),
        (w, s) => format!("\n({w} workers and {s} sessions not listed: --all lists every one, --json gives them to scripts)\n"),
    };
    // Nothing, not an empty table, when no worker read from a store.
    let storage = match super::storage::status_table(workers, shown) {
        table if table.is_empty() => table,
        table => format!("\n{table}"),
    };
    format!(
        "WORKERS ({})\n{}{storage}\nSESSIONS ({})\n{}\nJOBS ({})\n{}{left_out}",
        workers.len(),
        worker_table(&listed_workers),
        sessions.len(),
        session_table(&listed_sessions),
        jobs.len(),
        job_table(jobs, shown),
    )
}

/// The `shown` items a table lists: all of them, in the coordinator's
/// order, when they fit; else the first `shown` by `key`, the ones an
/// operator looks for first.
fn first_by<T, K: Ord>(items: &[T], shown: usize, key: impl FnMut(&&T) -> K) -> Vec<&T> {
    let mut listed: Vec<&T> = items.iter().collect();
    if listed.len() > shown {
        listed.sort_by_key(key);
        listed.truncate(shown);
    }
    listed
}

/// The WORKERS table.
fn worker_table(workers: &[&WorkerInfo]) -> String {
    let rows: Vec<Vec<String>> = workers
        .iter()
        .map(|w| {
            vec![
                w.worker_id.to_string(),
                w.address.clone(),
                w.node.clone(),
                w.outstanding.to_string(),
                w.delivered.to_string(),
                ago(w.last_seen_ms),
                yes_no(w.draining),
            ]
        })
        .collect();
    render(&["ID", "ADDRESS", "NODE", "OUTSTANDING", "DELIVERED", "LAST SEEN", "DRAINING"], &rows)
}

/// The SESSIONS table.
fn session_table(sessions: &[&SessionInfo]) -> String {
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|s| {
            vec![
                s.session_id.to_string(),
                s.job_id.to_string(),
                s.consumer.to_string(),
                s.node.clone(),
                yes_no(s.ring),
                ago(s.last_seen_ms),
                format!("{:.1}s", s.stall_ms as f64 / 1000.0),
            ]
        })
        .collect();
    render(&["ID", "JOB", "CONSUMER", "NODE", "RING", "LAST SEEN", "STALL"], &rows)
}

/// The JOBS table: every job, its ranks listed one by one up to
/// `RANKS_SHOWN` (all when `shown` is unbounded), else summed up.
fn job_table(jobs: &[JobInfo], shown: usize) -> String {
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|info| {
            let job = info.job.clone().unwrap_or_default();
            let spec = job.spec.unwrap_or_default();
            // A shared stream's trainers are its subscribers (its ranks
            // only name what they receive): those still there.
            let listed: Vec<ConsumerProgress> = match spec.shared {
                Some(_) => info.consumers.iter().filter(|c| c.subscribes_to.is_some() && !c.left).cloned().collect(),
                None => info.consumers.clone(),
            };
            let consumers = if listed.len() > RANKS_SHOWN && shown != usize::MAX {
                ranks_summed(&listed)
            } else {
                ranks_listed(&listed)
            };
            let sharing = spec.shared.as_ref().map_or_else(|| "-".to_owned(), |_| subscribers(&info.consumers));
            vec![
                job.job_id.to_string(),
                or_dash(&spec.name),
                dataset(&spec.dataset.and_then(|d| d.kind)),
                job.num_samples.to_string(),
                job.batches_per_epoch.to_string(),
                sharing,
                cache_use(info.cache.as_ref()),
                consumers,
                or_dash(&info.error),
            ]
        })
        .collect();
    let headers = [
        "ID",
        "NAME",
        "DATASET",
        "N",
        "BATCHES/EPOCH",
        "SUBSCRIBERS",
        "CACHE",
        "RANK:DELIVERED/RESENT/CONSUMED/TOTAL",
        "ERROR",
    ];
    render(&headers, &rows)
}

/// A job's ranks one by one: `rank:distinct/resent/consumed/total`.
fn ranks_listed(consumers: &[ConsumerProgress]) -> String {
    consumers
        .iter()
        .map(|c| {
            // Distinct batches delivered, and those delivered once
            // more, apart: a re-sent copy is dropped by the trainer.
            let distinct = c.delivered.saturating_sub(c.resent);
            format!("{}:{}/{}/{}/{}", c.consumer, distinct, c.resent, c.consumed, c.total)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A shared stream's subscribers still there, and the share of the
/// batches handed out to its subscribers that were made for several at
/// once (the rest were made for one alone: a late joiner's first part, one
/// trailing the others, a batch made again after a worker died).
fn subscribers(consumers: &[ConsumerProgress]) -> String {
    let subs = consumers.iter().filter(|c| c.subscribes_to.is_some());
    let live = subs.clone().filter(|c| !c.left).count();
    let assigned: u64 = subs.clone().map(|c| c.assigned).sum();
    let alone: u64 = subs.map(|c| c.assigned_alone).sum();
    if assigned == 0 {
        return live.to_string();
    }
    let shared = 100.0 * assigned.saturating_sub(alone) as f64 / assigned as f64;
    format!("{live} ({shared:.0}% made once)")
}

/// Of a job's sample cache reads, the share that found their entry (None
/// before any read).
fn hit_ratio(cache: &CacheUse) -> Option<f64> {
    let reads = cache.hits.saturating_add(cache.misses);
    (reads > 0).then(|| cache.hits as f64 / reads as f64)
}

/// A job's sample cache, in a cell: its hit ratio and the bytes its
/// workers kept, or why it is off; `-` when no worker used one.
pub(crate) fn cache_use(cache: Option<&CacheUse>) -> String {
    let Some(cache) = cache else { return "-".into() };
    if !cache.off.is_empty() {
        return format!("off: {}", cache.off);
    }
    let kept = cache.stored_bytes as f64 / 1e6;
    match hit_ratio(cache) {
        Some(ratio) => format!("{:.0}% hits, {kept:.0} MB", 100.0 * ratio),
        None => "on".into(),
    }
}

/// `text`, or `-` for an empty cell.
fn or_dash(text: &str) -> String {
    if text.is_empty() { "-".into() } else { text.to_owned() }
}

/// A job's ranks summed up: how many, distinct batches delivered, re-sent,
/// consumed and in all, and the rank furthest behind.
fn ranks_summed(consumers: &[ConsumerProgress]) -> String {
    let sum = |f: fn(&ConsumerProgress) -> u64| consumers.iter().map(f).sum::<u64>();
    let behind = consumers.iter().min_by_key(|c| (c.consumed, c.consumer));
    format!(
        "{} ranks: {}/{}/{}/{} (slowest rank {}: {}/{})",
        consumers.len(),
        sum(|c| c.delivered.saturating_sub(c.resent)),
        sum(|c| c.resent),
        sum(|c| c.consumed),
        sum(|c| c.total),
        behind.map_or(0, |c| c.consumer),
        behind.map_or(0, |c| c.consumed),
        behind.map_or(0, |c| c.total),
    )
}

fn dataset(kind: &Option<Kind>) -> String {
    let dtype = |d: i32| Dtype::try_from(d).map_or("?", Dtype::short_name);
    match kind {
        Some(Kind::Synthetic(s)) => {
            let shape = s
                .shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join("x");
            format!("synthetic {shape} {}", dtype(s.dtype))
        }
        Some(Kind::Tokens(t)) => format!(
            "tokens {} ctx {} {}",
            t.path,
            t.context_length,
            dtype(t.dtype)
        ),
        Some(Kind::ImageFolder(f)) => format!("image_folder {} ({} samples)", f.path, f.num_samples),
        Some(Kind::Webdataset(w)) => format!("webdataset {} shards", w.shards.len()),
        Some(Kind::Npy(n)) => {
            let names: Vec<&str> = n.arrays.iter().map(|a| a.name.as_str()).collect();
            format!("npy {} ({} rows)", names.join(","), n.num_samples)
        }
        Some(Kind::Parquet(p)) => format!(
            "parquet {} ({} files, {} rows)",
            p.columns.join(","),
            p.files.len(),
            p.num_samples
        ),
        Some(Kind::Custom(c)) => format!("custom {} ({} samples)", c.name, c.num_samples),
        Some(Kind::Mix(m)) => {
            let total: f64 = m.sources.iter().map(|s| s.weight).sum();
            let parts: Vec<String> = m
                .sources
                .iter()
                .map(|s| format!("{} {:.0}%", s.name, 100.0 * s.weight / total.max(f64::MIN_POSITIVE)))
                .collect();
            format!("mix {} ({} per epoch)", parts.join(", "), m.samples_per_epoch)
        }
        None => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use loader_proto::pb::{ConsumerProgress, DatasetSpec, Job, JobSpec, SyntheticSpec};

    use super::*;

    /// One worker, one session and one job of the test below.
    fn sample() -> Status {
        let mut status = Status::default();
        status.workers.push(WorkerInfo { worker_id: 7, address: "http://w:1".into(), busy: 0.25, ..Default::default() });
        status.sessions.push(SessionInfo { session_id: 9, job_id: 3, stall_ms: 1500, ..Default::default() });
        status.jobs.push(JobInfo {
            job: Some(Job {
                job_id: 3,
                spec: Some(JobSpec { name: "demo".into(), batch_size: 8, ..Default::default() }),
                num_samples: 100,
                batches_per_epoch: 13,
            }),
            consumers: vec![ConsumerProgress { consumer: 0, delivered: 5, consumed: 4, total: 13, ..Default::default() }],
            error: String::new(),
            cache: None,
        });
        status
    }

    #[test]
    fn json_names_every_field() {
        let v = status_json(&sample());
        let keys = |v: &serde_json::Value| {
            let mut keys: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
            keys.sort();
            keys
        };
        assert_eq!(keys(&v), ["jobs", "sessions", "workers"]);
        assert_eq!(
            keys(&v["workers"][0]),
            [
                "address", "busy", "delivered", "delivered_samples", "draining", "last_seen_ms", "node",
                "outstanding", "pid", "storage", "worker_id"
            ]
        );
        assert_eq!(v["workers"][0]["worker_id"], 7);
        assert_eq!(v["workers"][0]["busy"], 0.25);
        assert_eq!(v["workers"][0]["storage"], serde_json::Value::Null, "read nothing from a store");
        assert_eq!(
            keys(&v["sessions"][0]),
            ["consumer", "job_id", "last_seen_ms", "node", "ring", "session_id", "stall_ms"]
        );
        assert_eq!(v["sessions"][0]["stall_ms"], 1500);
        assert_eq!(
            keys(&v["jobs"][0]),
            [
                "batch_size", "batches_per_epoch", "cache", "consumers", "dataset", "error", "job_id", "name",
                "num_samples", "shared", "subscribers"
            ]
        );
        assert_eq!(v["jobs"][0]["name"], "demo");
        assert_eq!(v["jobs"][0]["error"], serde_json::Value::Null);
        assert_eq!(
            keys(&v["jobs"][0]["consumers"][0]),
            ["assigned", "assigned_alone", "consumed", "consumer", "delivered", "left", "resent", "subscribes_to", "total"]
        );
        assert_eq!(v["jobs"][0]["consumers"][0]["consumed"], 4);
        assert_eq!(v["jobs"][0]["shared"], false);
        assert_eq!(v["jobs"][0]["consumers"][0]["subscribes_to"], serde_json::Value::Null);
    }

    /// A shared stream lists its subscribers still there, not its rank, and
    /// how much of what they were handed was made once for several.
    #[test]
    fn a_shared_stream_lists_its_subscribers() {
        let mut status = sample();
        let job = &mut status.jobs[0];
        if let Some(spec) = job.job.as_mut().and_then(|j| j.spec.as_mut()) {
            spec.shared = Some(Default::default());
        }
        let sub = |consumer: u32, left: bool, alone: u64| ConsumerProgress {
            consumer,
            assigned: 10,
            delivered: 10,
            consumed: 9,
            total: 13,
            subscribes_to: Some(0),
            left,
            assigned_alone: alone,
            ..Default::default()
        };
        job.consumers = vec![ConsumerProgress { consumer: 0, total: 13, ..Default::default() }, sub(1, false, 0), sub(2, true, 10), sub(3, false, 5)];
        let out = render_status(&status, SHOWN);
        assert!(out.contains("2 (50% made once)"), "{out}");
        assert!(out.contains("1:10/0/9/13 3:10/0/9/13") && !out.contains("0:0/0/0/13"), "{out}");
        let v = status_json(&status);
        assert_eq!((v["jobs"][0]["shared"].clone(), v["jobs"][0]["subscribers"].clone()), (true.into(), 2.into()));
    }

    /// A job's sample cache: its hit ratio and bytes kept, why it is off,
    /// or a dash when no worker used one; the same in JSON.
    #[test]
    fn a_jobs_sample_cache_shows_its_hits() {
        let mut status = sample();
        let cell = |status: &Status| {
            let out = render_status(status, SHOWN);
            let header = out.lines().find(|l| l.contains("CACHE")).expect("jobs header").to_owned();
            let at = header.find("CACHE").expect("column");
            let row = out.lines().skip_while(|l| !l.contains("CACHE")).nth(1).expect("job row").to_owned();
            row[at..].split("  ").next().unwrap_or_default().trim().to_owned()
        };
        assert_eq!(cell(&status), "-");
        assert_eq!(status_json(&status)["jobs"][0]["cache"], serde_json::Value::Null);
        status.jobs[0].cache = Some(CacheUse { hits: 870, misses: 130, stored_bytes: 750_000_000, ..Default::default() });
        assert_eq!(cell(&status), "87% hits, 750 MB");
        let v = status_json(&status);
        assert_eq!((v["jobs"][0]["cache"]["hit_ratio"].clone(), v["jobs"][0]["cache"]["off"].clone()), (0.87.into(), serde_json::Value::Null));
        status.jobs[0].cache = Some(CacheUse { misses: 40, off: "does-not-pay".into(), ..Default::default() });
        assert_eq!(cell(&status), "off: does-not-pay");
        assert_eq!(status_json(&status)["jobs"][0]["cache"]["off"], "does-not-pay");
        status.jobs[0].cache = Some(CacheUse::default());
        assert_eq!(cell(&status), "on", "used, nothing read yet");
    }

    /// A worker that read from a store adds a STORAGE table under the
    /// workers' and a `storage` object to its JSON; without one, status
    /// prints what it always did.
    #[test]
    fn reads_from_stores_show_under_the_workers() {
        let mut status = sample();
        let plain = render_status(&status, SHOWN);
        assert!(!plain.contains("STORAGE"), "{plain}");
        assert!(plain.contains("\n\nSESSIONS (1)\n"), "{plain}");
        status.workers[0].storage = Some(loader_proto::pb::StorageUse {
            requests: 40,
            bytes: 12_000_000,
            chunk_reads: 10,
            chunk_fetches: 4,
            latency_buckets: vec![0, 0, 0, 0, 30, 10],
            ..Default::default()
        });
        let out = render_status(&status, SHOWN);
        let storage = out.find("STORAGE (1 worker read from stores; totals since they started)").expect("a storage table");
        assert!(out.find("WORKERS (1)").is_some_and(|w| w < storage) && out.find("SESSIONS (1)").is_some_and(|s| s > storage), "{out}");
        let row: Vec<&str> = out.lines().find(|l| l.starts_with("7 ") && l.contains("12.0")).expect("the worker's row").split_whitespace().collect();
        assert_eq!(row, ["7", "40", "12.0", "0", "0", "60%", "-", "<16ms", "<32ms"], "{out}");
        assert!(out.contains("<32ms\n\nSESSIONS (1)\n"), "one blank line before the sessions: {out}");
        let v = status_json(&status);
        assert_eq!((v["workers"][0]["storage"]["requests"].clone(), v["workers"][0]["storage"]["bytes"].clone()), (40.into(), 12_000_000.into()));
    }

    #[test]
    fn renders_workers_and_jobs() {
        let workers = vec![WorkerInfo {
            worker_id: 1,
            address: "http://127.0.0.1:7070".into(),
            node: "n1".into(),
            outstanding: 2,
            delivered: 10,
            last_seen_ms: 250,
            draining: true,
            busy: 0.5,
            delivered_samples: 640,
            pid: 4242,
            storage: None,
        }];
        let sessions = vec![SessionInfo {
            session_id: 4294967297,
            job_id: 3,
            consumer: 1,
            node: "trainer-node".into(),
            ring: true,
            last_seen_ms: 1200,
            stall_ms: 3400,
        }];
        let spec = JobSpec {
            name: "demo".into(),
            dataset: Some(DatasetSpec {
                kind: Some(Kind::Synthetic(SyntheticSpec {
                    num_samples: 100,
                    shape: vec![3, 4],
                    dtype: Dtype::U8 as i32,
                    cost_ns: 0,
                    wait_ns_by_epoch: Vec::new(),
                })),
            }),
            ..Default::default()
        };
        let jobs = vec![JobInfo {
            job: Some(Job {
                job_id: 3,
                spec: Some(spec),
                num_samples: 100,
                batches_per_epoch: 2,
            }),
            consumers: vec![ConsumerProgress {
                consumer: 0,
                assigned: 2,
                delivered: 3,
                consumed: 1,
                total: 2,
                resent: 1,
                ..Default::default()
            }],
            error: String::new(),
            cache: None,
        }];
        let out = render_status(
            &Status {
                workers,
                sessions,
                jobs,
            },
            SHOWN,
        );
        assert!(out.contains("http://127.0.0.1:7070"), "{out}");
        assert!(
            out.contains("0.2s ago") || out.contains("0.3s ago"),
            "{out}"
        );
        assert!(out.contains("synthetic 3x4 uint8"), "{out}");
        assert!(out.contains("0:2/1/1/2"), "{out}");
        let lines: Vec<&str> = out.lines().collect();
        let header = lines
            .iter()
            .position(|l| l.starts_with("ID  ADDRESS"))
            .expect("workers");
        assert!(lines[header].ends_with("DRAINING"), "{out}");
        assert!(lines[header + 1].ends_with("yes"), "{out}");
        let sessions = lines
            .iter()
            .position(|l| *l == "SESSIONS (1)")
            .expect("sessions");
        let columns: Vec<&str> = lines[sessions + 2].split_whitespace().collect();
        assert_eq!(
            columns,
            [
                "4294967297",
                "3",
                "1",
                "trainer-node",
                "yes",
                "1.2s",
                "ago",
                "3.4s"
            ],
            "{out}"
        );
    }

    #[test]
    fn large_deployments_are_summed_up_unless_all_is_asked() {
        let workers: Vec<WorkerInfo> = (0..100u64)
            .map(|i| WorkerInfo { worker_id: i, outstanding: i % 7, draining: i == 3, ..Default::default() })
            .collect();
        let sessions: Vec<SessionInfo> =
            (0..50u64).map(|i| SessionInfo { session_id: i, stall_ms: i * 10, ..Default::default() }).collect();
        let jobs = vec![JobInfo {
            job: Some(Job { job_id: 1, ..Default::default() }),
            consumers: (0..20u32)
                .map(|c| ConsumerProgress { consumer: c, delivered: 10, consumed: 10 - u64::from(c % 3), total: 10, ..Default::default() })
                .collect(),
            error: String::new(),
            cache: None,
        }];
        let status = Status { workers, sessions, jobs };
        let out = render_status(&status, SHOWN);
        assert!(out.starts_with("WORKERS (100)\n"), "{out}");
        assert!(out.contains("SESSIONS (50)"), "{out}");
        assert!(out.contains("(60 workers and 10 sessions not listed: --all lists every one"), "{out}");
        assert!(out.contains("20 ranks: 200/0/181/200 (slowest rank 2: 8/10)"), "{out}");
        let lines: Vec<&str> = out.lines().collect();
        // The draining worker first, then those holding the most.
        assert!(lines[2].starts_with('3'), "{out}");
        assert!(lines[3].split_whitespace().nth(1) == Some("6"), "{out}");
        let all = render_status(&status, usize::MAX);
        assert!(!all.contains("not listed") && all.contains("19:10/0/9/10"), "{all}");
        assert_eq!(all.lines().filter(|l| l.starts_with(char::is_numeric)).count(), 100 + 50 + 1);
    }
}
