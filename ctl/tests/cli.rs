//! Runs the real `loaderctl` binary: an embedded job end to end, and the
//! one-line errors for bad input. Each run is bounded in time; on overrun the
//! whole process group (loaderctl and the workers it started) is killed.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use loader_e2e::Cluster;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Where the coordinator of [`with_cluster`] listens.
struct Coordinator {
    url: String,
}

/// A real coordinator (`loader-server`) and `workers` registered
/// `loader-worker` processes for `body`; everything is killed when it
/// returns, and the whole of it is bounded in time.
fn with_cluster<T: Send + 'static>(workers: usize, body: impl FnOnce(&mut Cluster) -> T + Send + 'static) -> T {
    loader_e2e::run(Duration::from_secs(240), move |scope| {
        let mut cluster = Cluster::start(&scope, workers);
        cluster.wait_for_workers(workers);
        body(&mut cluster)
    })
}

fn loaderctl(args: &[&str], limit: Duration) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_loaderctl"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("LOADER_COORDINATOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so an overrun kills the workers too.
        .process_group(0)
        .spawn()
        .expect("start loaderctl");
    let pgid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"));
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let out = read(Box::new(child.stdout.take().expect("stdout")));
    let err = read(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = killpg(pgid, Signal::SIGKILL);
            let _ = child.wait();
            panic!("loaderctl {args:?} ran longer than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Whatever it left behind in its group goes too.
    let _ = killpg(pgid, Signal::SIGKILL);
    Run {
        code: status.code(),
        stdout: out.join().expect("stdout"),
        stderr: err.join().expect("stderr"),
    }
}

fn assert_one_line_error(run: &Run, needle: &str) {
    assert_ne!(
        run.code,
        Some(0),
        "expected failure; stdout: {}",
        run.stdout
    );
    assert!(
        run.code.is_some(),
        "killed by a signal; stderr: {}",
        run.stderr
    );
    let stderr = run.stderr.trim_end();
    assert_eq!(
        stderr.lines().count(),
        1,
        "stderr is not one line: {stderr}"
    );
    assert!(stderr.starts_with("loaderctl: error: "), "{stderr}");
    assert!(
        stderr.contains(needle),
        "{stderr:?} does not mention {needle:?}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

fn json(run: &Run) -> serde_json::Value {
    assert_eq!(run.code, Some(0), "stderr: {}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "stdout is not one JSON line: {}",
        run.stdout
    );
    serde_json::from_str(lines[0]).expect("stdout is JSON")
}

#[test]
fn run_json_synthetic() {
    let run = loaderctl(
        &[
            "run",
            "--json",
            "--workers",
            "2",
            "--samples",
            "512",
            "--shape",
            "16",
            "--batch-size",
            "64",
        ],
        Duration::from_secs(60),
    );
    let v = json(&run);
    assert_eq!(v["samples"], 512, "{v}");
    assert_eq!(v["batches"], 8, "{v}");
    assert_eq!(v["workers"], 2, "{v}");
    assert_eq!(v["dataset"], "synthetic", "{v}");
    for key in [
        "bytes",
        "seconds",
        "samples_per_s",
        "mb_per_s",
        "first_batch_s",
    ] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key} in {v}");
    }
}

#[test]
fn run_json_reports_its_transport_and_client_cpu() {
    for transport in ["shm", "grpc"] {
        let run = loaderctl(
            &[
                "run",
                "--json",
                "--transport",
                transport,
                "--samples",
                "1024",
                "--shape",
                "3,32,32",
                "--batch-size",
                "32",
            ],
            Duration::from_secs(60),
        );
        let v = json(&run);
        assert_eq!(v["transport"], transport, "{v}");
        assert_eq!(v["batches"], 32, "{v}");
        assert!(
            v["client_cpu_us_per_batch"]
                .as_f64()
                .is_some_and(|x| x > 0.0),
            "{v}"
        );
        let shm = v["shm_batches"].as_u64().expect("shm_batches");
        if transport == "shm" {
            assert!(shm > 0, "nothing came through the ring: {v}");
        } else {
            assert_eq!(shm, 0, "{v}");
        }
    }
}

#[test]
fn consume_measures_a_job_of_an_external_coordinator() {
    with_cluster(2, |cluster| {
    let coordinator = Coordinator { url: cluster.url() };
    for transport in ["shm", "grpc"] {
        let run = loaderctl(
            &[
                "consume",
                "--coordinator",
                &coordinator.url,
                "--job-name",
                &format!("consume-{transport}"),
                "--json",
                "--transport",
                transport,
                "--samples",
                "512",
                "--shape",
                "16",
            ],
            Duration::from_secs(60),
        );
        let v = json(&run);
        assert_eq!(v["samples"], 512, "{v}");
        assert_eq!(v["transport"], transport, "{v}");
        assert!(v.get("workers").is_none(), "consume starts no workers: {v}");
        assert!(v["client_cpu_us_per_batch"].as_f64().is_some(), "{v}");
    }
    });
}

#[test]
fn run_json_generated_tokens() {
    let run = loaderctl(
        &[
            "run",
            "--json",
            "--workers",
            "1",
            "--dataset",
            "tokens",
            "--context-length",
            "16",
            "--batch-size",
            "8",
            "--epochs",
            "2",
        ],
        Duration::from_secs(60),
    );
    let v = json(&run);
    // 64 batches of 8 windows per epoch in the generated file.
    assert_eq!(v["samples"], 2 * 64 * 8, "{v}");
    assert_eq!(v["dataset"], "tokens", "{v}");
}

#[test]
fn bad_inputs_are_one_line_errors() {
    let limit = Duration::from_secs(20);
    assert_one_line_error(
        &loaderctl(&["run", "--dataset", "imagenet"], limit),
        "unknown dataset kind \"imagenet\"",
    );
    assert_one_line_error(
        &loaderctl(
            &[
                "run",
                "--dataset",
                "tokens",
                "--path",
                "/nonexistent/loader/tokens.bin",
            ],
            limit,
        ),
        "/nonexistent/loader/tokens.bin",
    );
    assert_one_line_error(
        &loaderctl(&["run", "--batch-size", "0"], limit),
        "batch_size",
    );
    assert_one_line_error(&loaderctl(&["run", "--shape", "3,x"], limit), "--shape");
    assert_one_line_error(&loaderctl(&["run", "--dtype", "complex"], limit), "--dtype");
}

#[test]
fn status_of_an_unreachable_coordinator_fails_fast() {
    let started = Instant::now();
    let run = loaderctl(
        &["status", "--coordinator", "http://127.0.0.1:1"],
        Duration::from_secs(20),
    );
    assert_one_line_error(&run, "cannot reach coordinator http://127.0.0.1:1: ");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn drain_of_an_unknown_worker_is_a_one_line_error() {
    with_cluster(0, |cluster| {
    let coordinator = Coordinator { url: cluster.url() };
    let run = loaderctl(
        &[
            "drain",
            "--coordinator",
            &coordinator.url,
            "--worker",
            "999",
        ],
        Duration::from_secs(20),
    );
    assert_one_line_error(&run, "has no worker with id 999");
    });
}

/// The ids in the WORKERS table of `loaderctl status`.
fn listed_workers(url: &str) -> Vec<(String, String)> {
    let run = loaderctl(&["status", "--coordinator", url], Duration::from_secs(20));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    run.stdout
        .lines()
        .skip_while(|l| !l.starts_with("WORKERS"))
        .skip(2)
        .take_while(|l| !l.is_empty() && !l.starts_with("SESSIONS"))
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            (cells[0].to_owned(), cells[cells.len() - 1].to_owned())
        })
        .collect()
}

#[test]
fn drain_tells_a_worker_to_finish_and_exit() {
    with_cluster(1, |cluster| {
    let coordinator = Coordinator { url: cluster.url() };
    let deadline = Instant::now() + Duration::from_secs(30);
    let id = loop {
        if let Some((id, draining)) = listed_workers(&coordinator.url).pop() {
            assert_eq!(draining, "no");
            break id;
        }
        assert!(Instant::now() < deadline, "the worker never registered");
        std::thread::sleep(Duration::from_millis(50));
    };
    let run = loaderctl(
        &["drain", "--coordinator", &coordinator.url, "--worker", &id],
        Duration::from_secs(20),
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
    assert!(
        run.stdout.starts_with(&format!("worker {id} is draining")),
        "{}",
        run.stdout
    );
    // With nothing to finish, it deregisters and exits cleanly.
    let status = cluster.workers[0]
        .wait_exit(deadline.saturating_duration_since(Instant::now()))
        .expect("the drained worker did not exit");
    assert!(status.success(), "{status}");
    });
}

/// The `--dump` lines of a run: `seq epoch indices`.
fn dump_lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .expect("dump file")
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn consume_saves_its_state_and_resumes_exactly_after_it() {
    with_cluster(2, |cluster| {
    let coordinator = Coordinator { url: cluster.url() };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let (state, whole, rest) = (path("state.json"), path("whole.txt"), path("rest.txt"));
    let limit = Duration::from_secs(60);
    let first = loaderctl(
        &[
            "consume",
            "--coordinator",
            &coordinator.url,
            "--job-name",
            "cli-resume",
            "--samples",
            "300",
            "--shape",
            "4",
            "--batch-size",
            "8",
            "--epochs",
            "2",
            "--transport",
            "grpc",
            "--json",
            "--save-state-after",
            "7",
            "--state-file",
            &state,
            "--dump",
            &whole,
        ],
        limit,
    );
    let v = json(&first);
    let whole = dump_lines(std::path::Path::new(&whole));
    assert_eq!(v["batches"], whole.len(), "{v}");
    for (seq, line) in whole.iter().enumerate() {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 3, "{line}");
        assert_eq!(fields[0], seq.to_string(), "in order: {line}");
        assert!((1..=8).contains(&fields[2].split(',').count()), "{line}");
    }
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("state file")).expect("json");
    assert_eq!(saved["format"], 1, "{saved}");
    assert_eq!(saved["next_seq"], 7, "{saved}");

    let second = loaderctl(
        &[
            "consume",
            "--coordinator",
            &coordinator.url,
            "--resume",
            &state,
            "--json",
            "--dump",
            &rest,
        ],
        limit,
    );
    let v = json(&second);
    assert_eq!(v["batches"], whole.len() - 7, "{v}");
    assert_eq!(dump_lines(std::path::Path::new(&rest)), whole[7..]);

    std::fs::write(&state, "{\"format\": 1, \"spec\": \"zz\"").expect("corrupt it");
    let run = loaderctl(
        &[
            "consume",
            "--coordinator",
            &coordinator.url,
            "--resume",
            &state,
        ],
        Duration::from_secs(20),
    );
    assert_one_line_error(&run, "invalid loader state in ");
    std::fs::write(&state, "{\"format\": 9}").expect("from the future");
    let run = loaderctl(
        &[
            "consume",
            "--coordinator",
            &coordinator.url,
            "--resume",
            &state,
        ],
        Duration::from_secs(20),
    );
    assert_one_line_error(&run, "format 9 is not supported");
    });
}
