//! A store that fails, as a user sees it (issue 53: "errors, one line
//! each, nothing lost"). Real workers read a bucket of moto's S3 server
//! through a fault relay (`loader_e2e::FaultRelay`) that answers as a
//! failing store would; the submitter (this process) reads moto directly,
//! so each job is accepted and meets the fault in its workers, where a
//! store fails mid-job:
//!
//! 1. `503 Slow Down` to the workers' first requests, then answers: the
//!    store's client retries them with backoff, the batches wait, and the
//!    job completes with every batch once and the local file's bytes; the
//!    workers' `/metrics` count no failed request, and each 503 as an
//!    attempt retried.
//! 2. `503` to every request: the job fails, and the trainer's error is one
//!    line naming the object and the store that failed, within the
//!    (shortened) retry budget; the workers count failed requests.
//! 3. `403 AccessDenied`: one line, "access denied", naming the object, at
//!    the trainer and at submission (`loaderctl consume`).
//! 4. Silence (a request read and never answered): one line naming the
//!    object, within the retry budget.
//! 5. A closed port as `AWS_ENDPOINT_URL`: one line naming the object and
//!    the refused connection, at submission and from workers.
//!
//! The workers' retry budget is `LOADER_STORAGE_RETRY_TIMEOUT` (seconds),
//! shortened so the test is short; 1's answers fit in it whatever the
//! backoff's jitter draws (below).
//!
//! One test function: the store's address reaches this process through the
//! AWS environment variables, set once before any other thread of the test
//! reads them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use loader_client::spec;
use loader_client::{Dtype, JobSpec, Loader};
use loader_e2e::moto::{self, boto3};
use loader_e2e::scrape::{metrics_addr, scrape, sum};
use loader_e2e::{Cluster, Fault, FaultRelay, Proc, binary, needs, run};

/// 2^20 uint16 ids (2 MB, one chunk of the store's reader): 16,383
/// windows of 64 + 1 ids.
const IDS: u32 = 1 << 20;
const CONTEXT: u64 = 64;
const EPOCHS: u32 = 2;
/// The workers' retry budget, in seconds (`LOADER_STORAGE_RETRY_TIMEOUT`).
const BUDGET_S: u64 = 4;
/// How long the store answers only `503 Slow Down` (1.): longer than a
/// submitter's 8 retries usually last (backoffs from 0.1 s, each drawn up
/// to twice the one before: most often under 2 s), within the workers'
/// budget ([`BUDGET_S`]), which they retry until it is spent.
const OUTAGE: Duration = Duration::from_millis(2500);
/// Far more than any fault here may take to reach the trainer (the budget,
/// a task's report, a heartbeat): past it the failure is a hang.
const BOUNDED: Duration = Duration::from_secs(30);

/// A batch: its indices and every tensor's bytes.
type Read = (Vec<u64>, Vec<Vec<u8>>);

fn tokens_job(path: impl AsRef<Path>) -> JobSpec {
    spec::tokens(path, Dtype::U16, CONTEXT).batch_size(64).epochs(EPOCHS).shuffle(7).build().expect("spec")
}

/// Every batch of `job` from the cluster at `url`, by (epoch, seq).
fn read_all(url: String, job: JobSpec) -> BTreeMap<(u32, u64), Read> {
    let loader = Loader::builder(url).job(job).build().expect("loader");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut batches = BTreeMap::new();
    for batch in loader {
        let batch = batch.expect("batch");
        let key = (batch.epoch(), batch.seq());
        let read = (batch.indices().to_vec(), batch.tensors().map(|t| t.bytes.to_vec()).collect());
        assert!(batches.insert(key, read).is_none(), "{key:?} twice");
        assert!(Instant::now() < deadline, "the job did not end within 60 s");
    }
    batches
}

/// The error that ends `job` at the trainer, and how long it took to come;
/// panics if the job completes or nothing comes within [`BOUNDED`].
fn job_error(url: String, job: JobSpec) -> (String, Duration) {
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    // On a thread of its own: a loader that hangs must not hang the test
    // past its bound (the scope's limit kills the processes behind it).
    std::thread::spawn(move || {
        let outcome = Loader::builder(url).job(job).build().map_err(|e| e.to_string()).and_then(|loader| {
            for batch in loader {
                batch.map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        let _ = tx.send(outcome);
    });
    match rx.recv_timeout(BOUNDED) {
        Ok(Err(e)) => (e, started.elapsed()),
        Ok(Ok(())) => panic!("the job completed despite the fault"),
        Err(_) => panic!("no error within {BOUNDED:?}: the fault hangs the job"),
    }
}

/// What `loaderctl consume` of `url` prints on stderr when it submits the
/// job with `endpoint` as the store (it must fail, within [`BOUNDED`]).
fn submission_error(scope: &loader_e2e::Scope, coordinator: &str, endpoint: &str, url: &str) -> (String, Duration) {
    let started = Instant::now();
    let mut command = Command::new(binary("loaderctl"));
    command
        .args(["consume", "--coordinator", coordinator, "--dataset", "tokens", "--path", url])
        .args(["--context-length", &CONTEXT.to_string()])
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("LOADER_STORAGE_RETRY_TIMEOUT", BUDGET_S.to_string());
    let mut ctl = Proc::spawn_capturing_stderr(scope, "loaderctl", command, false);
    let status = ctl.wait_exit(BOUNDED).unwrap_or_else(|| panic!("loaderctl consume {url} did not exit within {BOUNDED:?}"));
    assert!(!status.success(), "loaderctl consume {url} succeeded against {endpoint}");
    let stderr = ctl.stderr();
    let errors: Vec<&String> = stderr.iter().filter(|l| l.contains(url)).collect();
    assert_eq!(errors.len(), 1, "one line naming {url}: {stderr:?}");
    (errors[0].clone(), started.elapsed())
}

/// Where a trainer's error names the object: the job's failure, as the
/// worker whose read failed reported it.
fn at_trainer(url: &str) -> String {
    format!("job failed: tokens dataset: {url}: ")
}

/// Where `loaderctl`'s error names the object it could not count.
fn at_submission(url: &str) -> String {
    format!("loaderctl: error: token file {url}: ")
}

/// One line that starts with `prefix` (naming the object) and holds every
/// one of `words`.
fn assert_one_line(what: &str, e: &str, prefix: &str, words: &[&str]) {
    eprintln!("{what}: {e}");
    assert!(!e.contains('\n'), "{what}: one line: {e:?}");
    assert!(e.starts_with(prefix), "{what}: starts {prefix:?}: {e}");
    assert!(!e.ends_with(':'), "{what}: nothing left dangling: {e}");
    for w in words {
        assert!(e.contains(w), "{what}: says {w:?}: {e}");
    }
}

/// Requests of `op` with `outcome` counted by the workers' `/metrics`.
fn requests(cluster: &Cluster, op: &str, outcome: &str) -> f64 {
    cluster.workers.iter().map(|w| sum(&scrape(metrics_addr(w)), "loader_storage_requests_total", &[("op", op), ("outcome", outcome)])).sum()
}

#[test]
fn a_failing_store_is_retried_or_fails_the_job_in_one_line_naming_the_object() {
    let python = needs(moto::python());
    run(Duration::from_secs(180), move |scope| {
        let (_moto, endpoint) = moto::start(&scope, &python);
        // SAFETY: set before this test starts any thread that reads the
        // environment (the only test of this binary; moto's output readers
        // read none); the cluster's processes inherit them, the workers'
        // endpoint overridden with the relay's.
        unsafe { moto::aim_aws_at(&endpoint) };
        let dir = tempfile::tempdir().expect("tempdir");
        let local = dir.path().join("tokens.bin");
        moto::write_tokens(&local, IDS);
        // One object per case: a worker keeps what it opened for a job, and
        // each case must meet its fault at the open.
        let keys = ["slow.bin", "down.bin", "denied.bin", "silent.bin", "closed.bin"];
        let uploads = keys.map(|k| format!("s3.upload_file({:?}, 'data', {k:?})", local.display().to_string())).join("\n");
        boto3(&python, &endpoint, &format!("s3.create_bucket(Bucket='data')\n{uploads}"));

        let relay = FaultRelay::start(&endpoint);
        let cluster = Cluster::builder()
            .workers(2)
            .metrics()
            .env("AWS_ENDPOINT_URL", relay.endpoint())
            .env("LOADER_STORAGE_RETRY_TIMEOUT", BUDGET_S.to_string())
            .start(&scope);
        let from_disk = read_all(cluster.url(), tokens_job(&local));

        // 1. 503s for a while, then answers: the workers wait it out;
        // every batch once, the file's bytes.
        let job = tokens_job("s3://data/slow.bin");
        relay.set(Fault::SlowDown);
        let from_store = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(OUTAGE);
                relay.set(Fault::None);
            });
            read_all(cluster.url(), job)
        });
        assert!(relay.given(Fault::SlowDown) > 0, "the workers met the outage");
        assert_eq!(from_store.len(), from_disk.len());
        assert!(from_store == from_disk, "after the 503s, the store's batches differ from the local file's");
        let windows = (u64::from(IDS) - 1) / CONTEXT;
        for epoch in 0..EPOCHS {
            let seen: Vec<u64> = from_store.iter().filter(|(k, _)| k.0 == epoch).flat_map(|(_, (i, _))| i.clone()).collect();
            assert_eq!(seen.len() as u64, windows, "epoch {epoch}: every window once");
            assert_eq!(seen.iter().collect::<BTreeSet<_>>().len() as u64, windows, "epoch {epoch}: no window twice");
        }
        // A request the client retried to success counts once, as ok.
        assert_eq!(requests(&cluster, "head", "error") + requests(&cluster, "get", "error"), 0.0, "no request failed");
        assert!(requests(&cluster, "head", "ok") >= 1.0, "the workers opened the object");
        // Its attempts that failed count apart: each 503 given a worker
        // (the submitter reads moto directly), but for one whose connection
        // the switch back closed before its answer, which counts as a
        // transport error.
        let retried = |reason: &str| -> u64 {
            let counted: f64 = cluster.workers.iter().map(|w| sum(&scrape(metrics_addr(w)), "loader_storage_retries_total", &[("reason", reason)])).sum();
            counted as u64
        };
        let (status, transport, given) = (retried("status"), retried("transport"), relay.given(Fault::SlowDown));
        eprintln!("503s for {OUTAGE:?}: {given} given, {status} counted as retried for their status, {transport} for transport");
        assert!(status > 0 && status <= given && status + transport >= given, "retries counted: {status} 503s, {transport} transport errors; {given} 503s given");

        // 2. 503 forever: one line naming the object and the failing store.
        let relay_at = relay.endpoint();
        let url = "s3://data/down.bin";
        let job = tokens_job(url);
        relay.set(Fault::SlowDown);
        let (e, took) = job_error(cluster.url(), job);
        assert_one_line("503 forever", &e, &at_trainer(url), &[&format!("the store at {relay_at} failed"), "503 Service Unavailable"]);
        eprintln!("503 forever: failed after {took:?}");
        assert!(requests(&cluster, "head", "error") >= 1.0, "the workers count the failed request");

        // 3. Access denied: at the trainer, and at submission.
        let url = "s3://data/denied.bin";
        let job = tokens_job(url);
        relay.set(Fault::AccessDenied);
        let (e, _) = job_error(cluster.url(), job);
        assert_one_line("access denied", &e, &at_trainer(url), &["access denied", "403 Forbidden (credentials come from"]);
        let (e, _) = submission_error(&scope, &cluster.url(), &relay_at, url);
        assert_one_line("access denied at submission", &e, &at_submission(url), &["access denied", "403 Forbidden (credentials come from"]);

        // 4. A store that stops answering: bounded by the budget.
        let url = "s3://data/silent.bin";
        let job = tokens_job(url);
        relay.set(Fault::Silent);
        let (e, took) = job_error(cluster.url(), job);
        assert_one_line("silent store", &e, &at_trainer(url), &[&format!("the store at {relay_at} failed"), "timed out"]);
        eprintln!("silent store: failed after {took:?}");
        relay.set(Fault::None);

        // 5. A closed port: at submission, and from workers.
        let closed = {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            format!("http://{}", listener.local_addr().expect("address"))
        };
        let url = "s3://data/closed.bin";
        let (e, took) = submission_error(&scope, &cluster.url(), &closed, url);
        assert_one_line("closed port at submission", &e, &at_submission(url), &[&format!("the store at {closed} failed"), "Connection refused"]);
        eprintln!("closed port at submission: failed after {took:?}");
        let job = tokens_job(url);
        let stranded = Cluster::builder()
            .workers(1)
            .env("AWS_ENDPOINT_URL", &closed)
            .env("LOADER_STORAGE_RETRY_TIMEOUT", BUDGET_S.to_string())
            .start(&scope);
        let (e, took) = job_error(stranded.url(), job);
        assert_one_line("closed port at the workers", &e, &at_trainer(url), &[&format!("the store at {closed} failed"), "Connection refused"]);
        eprintln!("closed port at the workers: failed after {took:?}");
    });
}
