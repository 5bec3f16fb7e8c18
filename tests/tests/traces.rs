//! OpenTelemetry traces across processes: a real `loader-server`, a real
//! `loader-worker` and `loaderctl consume` (the trainer), all exporting over
//! OTLP/gRPC to a receiver this test runs (opentelemetry-proto's generated
//! tonic server). Every batch must be one trace: the coordinator's `batch`
//! span, the worker's `batch.produce` and `batch.deliver`, and the
//! trainer's `batch.consume`, each the child of the one before, starting
//! in that order, over both transports.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use loader_e2e::{Cluster, OtlpReceiver, Proc, ReceivedSpan as Received, Scope, run, string_attribute, wait_for};

/// Bound on the wait for every span to arrive.
const PATIENCE: Duration = Duration::from_secs(30);
/// Batches per run: 256 samples in batches of 16.
const BATCHES: usize = 16;

/// The environment that turns export on, towards `receiver`, with short
/// export batches so spans arrive while the test waits.
fn otel_env(receiver: SocketAddr) -> [(&'static str, String); 2] {
    [("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{receiver}")), ("OTEL_BSP_SCHEDULE_DELAY", "100".into())]
}

/// One `loaderctl consume` over `transport`: `batches` batches of 16
/// samples, as job `name`; waits for it to finish.
fn consume(scope: &Scope, url: &str, receiver: SocketAddr, transport: &str, name: &str, batches: usize) {
    let samples = (batches * 16).to_string();
    let mut command = std::process::Command::new(loader_e2e::binary("loaderctl"));
    command
        .args(["consume", "--coordinator", url, "--transport", transport, "--job-name", name, "--json"])
        .args(["--samples", samples.as_str(), "--shape", "64", "--batch-size", "16"])
        .envs(otel_env(receiver));
    let mut trainer = Proc::spawn(scope, "loaderctl", command, false);
    let status = trainer.wait_exit(Duration::from_secs(60)).expect("loaderctl consume finishes within 60 s");
    assert!(status.success(), "loaderctl consume --transport {transport}: {status}");
}

/// The spans of one batch, by name.
#[derive(Debug, Default)]
struct BatchTrace {
    spans: HashMap<String, Received>,
}

const CHAIN: [(&str, &str); 4] = [
    ("batch", "loader-server"),
    ("batch.produce", "loader-worker"),
    ("batch.deliver", "loader-worker"),
    ("batch.consume", "loaderctl"),
];

/// Groups the received spans of job `job_id` into batch traces by seq.
fn batches_of(received: &[Received], job_id: &str) -> HashMap<String, BatchTrace> {
    let mut by_seq: HashMap<String, BatchTrace> = HashMap::new();
    let by_id: HashMap<&[u8], &Received> = received.iter().map(|r| (r.span.span_id.as_slice(), r)).collect();
    for r in received {
        if !CHAIN.iter().any(|(name, _)| *name == r.span.name) {
            continue;
        }
        // The deliver span carries no job or seq of its own: its parent does.
        let own = |key: &str| string_attribute(&r.span.attributes, key);
        let parent = by_id.get(r.span.parent_span_id.as_slice());
        let of_parent = |key: &str| parent.and_then(|p| string_attribute(&p.span.attributes, key));
        let (Some(job), Some(seq)) = (own("job_id").or_else(|| of_parent("job_id")), own("seq").or_else(|| of_parent("seq"))) else {
            continue;
        };
        if job == job_id {
            by_seq.entry(seq).or_default().spans.insert(r.span.name.clone(), r.clone());
        }
    }
    by_seq
}

/// Checks one batch's trace: every span of the chain, from the expected
/// service, one trace id, each the child of the one before and starting
/// no earlier; the transport named by delivery and consumption.
fn check_chain(seq: &str, trace: &BatchTrace, transport: &str) {
    let spans: Vec<&Received> = CHAIN
        .iter()
        .map(|(name, service)| {
            let r = trace.spans.get(*name).unwrap_or_else(|| panic!("batch {seq}: no {name} span"));
            assert_eq!(r.service, *service, "batch {seq}: {name} came from {}", r.service);
            r
        })
        .collect();
    let root = &spans[0].span;
    assert!(root.parent_span_id.is_empty(), "batch {seq}: the coordinator's span is the root");
    for pair in spans.windows(2) {
        let (parent, child) = (&pair[0].span, &pair[1].span);
        assert_eq!(child.trace_id, root.trace_id, "batch {seq}: {} is in another trace", child.name);
        assert_eq!(child.parent_span_id, parent.span_id, "batch {seq}: {} is not a child of {}", child.name, parent.name);
        assert!(
            child.start_time_unix_nano >= parent.start_time_unix_nano,
            "batch {seq}: {} starts before its parent {}",
            child.name,
            parent.name
        );
    }
    for name in ["batch.deliver", "batch.consume"] {
        let got = string_attribute(&trace.spans[name].span.attributes, "transport");
        assert_eq!(got.as_deref(), Some(transport), "batch {seq}: transport of {name}");
    }
}

/// Waits (bounded) until every batch of job `job_id` has its whole chain.
fn wait_for_batches(receiver: &OtlpReceiver, job_id: &str) -> HashMap<String, BatchTrace> {
    wait_for(&format!("every batch of job {job_id} with all four spans"), PATIENCE, || {
        let received = receiver.spans();
        let batches = batches_of(&received, job_id);
        let whole = batches.values().filter(|b| b.spans.len() == CHAIN.len()).count();
        if whole == BATCHES {
            return Ok(batches);
        }
        Err(format!("{whole} of {BATCHES} batches whole, {} spans received", received.len()))
    })
}

#[test]
fn one_batch_is_one_trace_across_coordinator_worker_and_trainer() {
    run(Duration::from_secs(120), |scope| {
        let receiver = OtlpReceiver::start("127.0.0.1:0").expect("start the OTLP receiver");
        let addr = receiver.addr();
        let mut builder = Cluster::builder().workers(1);
        for (name, value) in otel_env(addr) {
            builder = builder.env(name, value);
        }
        let cluster = builder.start(&scope);

        // Job ids are given in order: the gRPC run is job 1, the ring run 2.
        consume(&scope, &cluster.url(), addr, "grpc", "traced-grpc", BATCHES);
        let batches = wait_for_batches(&receiver, "1");
        for (seq, trace) in &batches {
            check_chain(seq, trace, "grpc");
        }
        consume(&scope, &cluster.url(), addr, "shm", "traced-ring", BATCHES);
        let batches = wait_for_batches(&receiver, "2");
        for (seq, trace) in &batches {
            check_chain(seq, trace, "ring");
        }

        // The job's own span, from creation to its last batch consumed.
        wait_for("a job span for both jobs", PATIENCE, || {
            let received = receiver.spans();
            let jobs: Vec<String> = received
                .iter()
                .filter(|r| r.span.name == "job" && r.service == "loader-server")
                .filter_map(|r| string_attribute(&r.span.attributes, "job_id"))
                .collect();
            if jobs.contains(&"1".to_owned()) && jobs.contains(&"2".to_owned()) { Ok(()) } else { Err(format!("job spans of {jobs:?}")) }
        });
    });
}

#[test]
fn the_coordinator_samples_batches_and_the_others_follow() {
    run(Duration::from_secs(120), |scope| {
        let receiver = OtlpReceiver::start("127.0.0.1:0").expect("start the OTLP receiver");
        let addr = receiver.addr();
        let mut builder = Cluster::builder().workers(1).env("OTEL_TRACES_SAMPLER_ARG", "0.5");
        for (name, value) in otel_env(addr) {
            builder = builder.env(name, value);
        }
        let cluster = builder.start(&scope);
        // 64 batches, each sampled with probability 1/2 by the coordinator
        // (all or none: odds of 2^-63).
        consume(&scope, &cluster.url(), addr, "grpc", "sampled", 64);

        // The trainer flushed its spans when it exited; wait (bounded) for
        // the coordinator's and the worker's of the same batches.
        let batches = wait_for("the coordinator's and the worker's spans of every consumed batch", PATIENCE, || {
            let batches = batches_of(&receiver.spans(), "1");
            let consumed = batches.values().filter(|b| b.spans.contains_key("batch.consume")).count();
            let whole = batches.values().filter(|b| b.spans.len() == CHAIN.len()).count();
            if consumed > 0 && whole == consumed && whole == batches.len() {
                return Ok(batches);
            }
            Err(format!("{} batches with spans, {consumed} consumed, {whole} with all four", batches.len()))
        });
        assert!(batches.len() < 64, "every batch was traced at a ratio of 0.5");
        // No orphans: a batch the coordinator did not sample has no span
        // anywhere (a worker or trainer span of one would have no root and
        // show up here with fewer than four).
        for (seq, trace) in &batches {
            check_chain(seq, trace, "grpc");
        }
    });
}
