//! Prometheus metrics on every process: a real `loader-server` and two
//! `loader-worker` processes with `--metrics-listen 127.0.0.1:0`, a trainer
//! (the Rust SDK, in this process) with `metrics_listen`, every `/metrics`
//! scraped over plain HTTP and parsed as the Prometheus text format. Also
//! the one-line usage errors of a bad command line (`--metrics-listen`,
//! and a worker's `LOADER_STORAGE_CACHE_SHARED`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use loader_client::{Batch, Dtype, JobSpec, Loader, LoaderError, spec};
use loader_e2e::scrape::{metrics_addr, scrape, sum};
use loader_e2e::{Cluster, Proc, Scope, binary, needs, run, wait_for};

/// Bound on every wait for a metric to move.
const PATIENCE: Duration = Duration::from_secs(30);


/// [`sum`] over several processes.
fn sum_over(addrs: &[SocketAddr], name: &str, labels: &[(&str, &str)]) -> f64 {
    addrs.iter().map(|&a| sum(&scrape(a), name, labels)).sum()
}

/// Polls `value` (a metric) until `done` holds for it; panics after
/// [`PATIENCE`], saying the last value.
fn wait_for_metric(what: &str, mut value: impl FnMut() -> f64, done: impl Fn(f64) -> bool) -> f64 {
    wait_for(what, PATIENCE, || {
        let v = value();
        if done(v) { Ok(v) } else { Err(format!("still {v}")) }
    })
}

/// A real Prometheus server (Debian's `prometheus`) scraping `targets`
/// every second, started by the test.
struct Prometheus {
    /// Its HTTP API.
    addr: SocketAddr,
    /// The server, killed with the scope.
    _proc: Proc,
    /// Its configuration and storage.
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts it; `Err` says what this machine lacks (pass it to `needs`).
    fn start(scope: &Scope, targets: &[SocketAddr]) -> Result<Prometheus, String> {
        let version = Command::new("prometheus").arg("--version").output();
        if !version.is_ok_and(|out| out.status.success()) {
            return Err("no `prometheus` binary (Debian: apt-get install prometheus)".into());
        }
        let dir = tempfile::tempdir().expect("temporary directory");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, scrape_timeout: 1s}}\n\
                 scrape_configs: [{{job_name: loader, static_configs: [{{targets: [{}]}}]}}]\n",
                targets.join(", ")
            ),
        )
        .expect("write the configuration");
        // A free port: Prometheus does not print the port it picked.
        let addr = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port");
        let mut command = Command::new("prometheus");
        command
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn");
        let proc = Proc::spawn_capturing_stderr(scope, "prometheus", command, false);
        Ok(Prometheus { addr, _proc: proc, _dir: dir })
    }

    /// The value of an instant query that yields one number; NaN while it
    /// yields none (or Prometheus is not up yet).
    fn query(&self, query: &str) -> f64 {
        let Some(json) = self.answer(query) else { return f64::NAN };
        json["data"]["result"][0]["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
    }

    /// Prometheus' JSON answer to an instant query (`status` is `error`,
    /// with the reason, for a query it cannot parse); None while it is not
    /// up.
    fn answer(&self, query: &str) -> Option<serde_json::Value> {
        let encoded: String = query
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() || b == b'_' { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        let mut stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("read timeout");
        // HTTP/1.0: the answer comes whole, not chunked.
        write!(stream, "GET /api/v1/query?query={encoded} HTTP/1.0\r\n\r\n").expect("send the query");
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        // 503 "Service Unavailable" while it starts (loads its storage):
        // not up yet, like a refused connection.
        if head.split_whitespace().nth(1) == Some("503") {
            return None;
        }
        Some(serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}")))
    }
}

/// Reads every batch left; returns how many.
fn consume(batches: impl IntoIterator<Item = Result<Batch, LoaderError>>) -> u64 {
    let mut n = 0;
    for batch in batches {
        batch.expect("batch");
        n += 1;
    }
    n
}

fn job(name: &str, samples: u64, sample_bytes: u64, cost_ns: u64) -> JobSpec {
    spec::synthetic(samples, &[sample_bytes], Dtype::U8)
        .name(name)
        .batch_size(16)
        .shuffle(7)
        .cost_ns(cost_ns)
        .build()
        .expect("spec")
}

/// One test, one trainer process: the trainer's endpoint and recorder are
/// this process's, so the three jobs run one after the other on one cluster
/// and are told apart by their `job` label.
#[test]
fn every_process_serves_metrics_that_add_up() {
    run(Duration::from_secs(240), |scope: Scope| {
        let cluster = Cluster::builder().workers(2).ttl_ms(3000).metrics().start(&scope);
        let server = metrics_addr(&cluster.server);
        let workers: Vec<SocketAddr> = cluster.workers.iter().map(metrics_addr).collect();
        let builder = || Loader::builder(cluster.url()).metrics_listen("127.0.0.1:0");

        // A whole job: what the workers delivered is what the trainer consumed.
        let loader = builder().job(job("whole", 2000, 256, 0)).build().expect("loader");
        let trainer = loader.metrics_addr().expect("the trainer serves metrics");
        let total = loader.total_batches();
        let whole = loader.job().job_id.to_string();
        assert_eq!(consume(loader), total);
        let labels = [("job_id", whole.as_str())];
        let delivered = sum_over(&workers, "loader_worker_batches_delivered_total", &labels);
        assert_eq!(delivered, total as f64, "the workers' delivered batches");
        let trainer_scrape = scrape(trainer);
        assert_eq!(
            sum(&trainer_scrape, "loader_trainer_batches_consumed_total", &[("job_id", &whole), ("rank", "0")]),
            total as f64
        );
        assert_eq!(sum(&trainer_scrape, "loader_trainer_samples_consumed_total", &labels), 2000.0);
        assert_eq!(sum_over(&workers, "loader_worker_samples_delivered_total", &labels), 2000.0);
        let worker_scrape = scrape(workers[0]);
        let stages: Vec<&str> = worker_scrape
            .samples
            .iter()
            .filter(|s| s.metric == "loader_worker_stage_seconds" && s.labels.get("job_id") == Some(whole.as_str()))
            .filter_map(|s| s.labels.get("stage"))
            .collect();
        for stage in ["read", "collate", "deliver"] {
            assert!(stages.contains(&stage), "stage {stage} in {stages:?}");
        }
        assert!(worker_scrape.samples.iter().any(|s| s.metric == "loader_worker_busy_ratio"));
        wait_for_metric(
            "the coordinator's worker gauge",
            || sum(&scrape(server), "loader_coordinator_workers", &[]),
            |v| v == 2.0,
        );
        let mut targets = workers.clone();
        targets.extend([server, trainer]);
        let prometheus = needs(Prometheus::start(&scope, &targets));
        let delivered = format!("sum(loader_worker_batches_delivered_total{{job_id=\"{whole}\"}})");
        let consumed = format!("sum(loader_trainer_batches_consumed_total{{job_id=\"{whole}\"}})");
        wait_for_metric("targets up in Prometheus", || prometheus.query("sum(up)"), |v| v == targets.len() as f64);
        wait_for_metric("delivered batches in Prometheus", || prometheus.query(&delivered), |v| v == total as f64);
        wait_for_metric("consumed batches in Prometheus", || prometheus.query(&consumed), |v| v == total as f64);
        // Every query of the Grafana dashboard parses and runs.
        for expr in dashboard_queries() {
            let expr = expr.replace("$job_id", ".*");
            let answer = prometheus.answer(&expr).expect("Prometheus answers");
            assert_eq!(answer["status"], "success", "dashboard query {expr}: {answer}");
        }

        // A trainer that stops reading: its batches wait at the workers (for
        // a free ring slot, or for a stream credit), and the workers' blocked
        // time rises while it does not read. The batches (1 MiB) are large
        // enough that the trainer takes fewer of them ahead than the
        // workers may make.
        for (name, shared_memory, transport) in [("stops-shm", true, "shm"), ("stops-grpc", false, "grpc")] {
            let loader =
                builder().shared_memory(shared_memory).job(job(name, 1600, 64 << 10, 0)).build().expect("loader");
            let total = loader.total_batches();
            let id = loader.job().job_id.to_string();
            let mut batches = loader.into_iter();
            for _ in 0..3 {
                batches.next().expect("a batch").expect("batch");
            }
            let labels = [("job_id", id.as_str()), ("transport", transport)];
            let blocked = || sum_over(&workers, "loader_worker_blocked_seconds_total", &labels);
            let first = wait_for_metric(&format!("{name}: the workers' blocked time"), blocked, |v| v > 0.0);
            wait_for_metric(&format!("{name}: the workers' blocked time, later"), blocked, |v| v > first);
            let rest = consume(batches);
            assert_eq!(3 + rest, total, "{name}");
        }

        // A trainer that waits for slow workers sees its own stall, and the
        // coordinator learns it from the session's heartbeats.
        let loader = builder().job(job("slow", 1280, 256, 4_000_000)).build().expect("loader");
        let slow = loader.job().job_id.to_string();
        let total = loader.total_batches();
        assert_eq!(consume(loader), total);
        let labels = [("job_id", slow.as_str())];
        let stall = sum(&scrape(trainer), "loader_trainer_stall_seconds_total", &labels);
        assert!(stall > 0.0, "the trainer's stall: {stall}");
        wait_for_metric(
            "the coordinator's stall",
            || sum(&scrape(server), "loader_coordinator_trainer_stall_seconds_total", &labels),
            |v| v > 0.0,
        );
    });
}

/// Runs `command` (binary `name`), which must refuse its command line:
/// it exits by itself with the status of a usage error (2, as clap's own
/// are), having started nothing (no `listening` line), and its stderr is
/// one line, `NAME: error: ...`, returned.
fn usage_error(scope: &Scope, name: &str, command: Command) -> String {
    let mut proc = Proc::spawn_capturing_stderr(scope, name, command, false);
    let status = proc.wait_exit(Duration::from_secs(20)).expect("exits by itself");
    assert_eq!(status.code(), Some(2), "{name}");
    // `wait_exit` returned once the readers had every line.
    let stderr = proc.stderr();
    assert_eq!(stderr.len(), 1, "{name}: {stderr:?}");
    assert!(stderr[0].starts_with(&format!("{name}: error: ")), "{stderr:?}");
    assert!(proc.stdout().iter().all(|l| !l.starts_with("listening")), "{name} started: {:?}", proc.stdout());
    stderr[0].clone()
}

/// A bad `--metrics-listen` is one line naming the flag, and the process
/// exits at once with the status of a usage error.
#[test]
fn a_bad_metrics_address_is_a_one_line_error() {
    run(Duration::from_secs(60), |scope: Scope| {
        let mut server = Command::new(binary("loader-server"));
        server.args(["--listen", "127.0.0.1:0", "--metrics-listen", "localhost:9464"]);
        let mut worker = Command::new(binary("loader-worker"));
        worker.args(["--coordinator", "http://127.0.0.1:1", "--listen", "127.0.0.1:0", "--metrics-listen", "9464"]);
        for (name, command) in [("loader-server", server), ("loader-worker", worker)] {
            let line = usage_error(&scope, name, command);
            assert!(line.contains("--metrics-listen"), "{line}");
            assert!(line.contains("invalid metrics address"), "{line}");
        }
    });
}

/// A worker's `LOADER_STORAGE_CACHE_SHARED` that is not a boolean
/// (`maybe`) is refused the same way, naming the flag it stands for,
/// rather than read as off: the worker does not start with a local copy
/// nobody chose.
#[test]
fn a_bad_storage_cache_shared_is_a_one_line_error() {
    run(Duration::from_secs(60), |scope: Scope| {
        let mut worker = Command::new(binary("loader-worker"));
        worker.args(["--coordinator", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"]).env("LOADER_STORAGE_CACHE_SHARED", "maybe");
        let line = usage_error(&scope, "loader-worker", worker);
        assert!(line.contains("--storage-cache-shared") || line.contains("LOADER_STORAGE_CACHE_SHARED"), "{line}");
        assert!(line.contains("'maybe'") && line.contains("value was not a boolean"), "{line}");
    });
}

/// The PromQL of every panel of `deploy/grafana/loader-dashboard.json`.
fn dashboard_queries() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/loader-dashboard.json");
    let text = std::fs::read_to_string(path).expect("read the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let queries: Vec<String> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("a target's expr").to_owned())
        .collect();
    assert!(!queries.is_empty(), "the dashboard has queries");
    queries
}

/// The dashboard queries only metrics the operations guide documents (the
/// guide's tables are checked against real scrapes above).
#[test]
fn the_dashboard_queries_documented_metrics() {
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md")).expect("guide");
    let mut seen = 0;
    for query in dashboard_queries() {
        for word in query.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !word.starts_with("loader_") {
                continue;
            }
            let metric = word.trim_end_matches("_bucket");
            assert!(guide.contains(&format!("| `{metric}` |")), "the dashboard queries {metric}, which docs/operations.md does not list");
            seen += 1;
        }
    }
    assert!(seen >= 10, "only {seen} metric references found in the dashboard");
}
