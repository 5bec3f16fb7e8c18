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
/// `run --dump FILE`'s sample indices of each epoch, in delivery order
/// (lines `seq epoch idx0,idx1,...`).
fn dumped_epochs(path: &std::path::Path) -> Vec<Vec<u64>> {
    let mut lines: Vec<(u64, usize, Vec<u64>)> = dump_lines(path)
        .iter()
        .map(|line| {
            let mut fields = line.split(' ');
            let mut number = || fields.next().and_then(|f| f.parse().ok()).unwrap_or_else(|| panic!("dump line {line:?}"));
            let (seq, epoch) = (number(), number() as usize);
            let indices = line.rsplit(' ').next().unwrap_or_default().split(',').map(|i| i.parse().expect("index")).collect();
            (seq, epoch, indices)
        })
        .collect();
    lines.sort_by_key(|(seq, _, _)| *seq);
    let mut epochs: Vec<Vec<u64>> = Vec::new();
    for (_, epoch, indices) in lines {
        epochs.resize_with(epochs.len().max(epoch + 1), Vec::new);
        epochs[epoch].extend(indices);
    }
    epochs
}

#[test]
fn run_shuffle_reads_every_sample_once_an_epoch_in_a_new_order_each_epoch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dump = |name: &str| dir.path().join(name);
    let common = ["run", "--workers", "2", "--samples", "256", "--shape", "4", "--batch-size", "16", "--epochs", "2"];
    for (file, shuffle) in [("shuffled", Some("5")), ("in-order", None)] {
        let path = dump(file).display().to_string();
        let mut args = common.to_vec();
        args.extend(["--dump", &path]);
        args.extend(shuffle.iter().flat_map(|seed| ["--shuffle", seed]));
        let run = loaderctl(&args, Duration::from_secs(60));
        assert_eq!(run.code, Some(0), "{}", run.stderr);
    }
    let in_order: Vec<u64> = (0..256).collect();
    let shuffled = dumped_epochs(&dump("shuffled"));
    assert_eq!(shuffled.len(), 2);
    for epoch in &shuffled {
        let mut sorted = epoch.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, in_order, "every sample once an epoch");
        assert_ne!(epoch, &in_order, "shuffled");
    }
    assert_ne!(shuffled[0], shuffled[1], "a new order each epoch");
    assert_eq!(dumped_epochs(&dump("in-order")), vec![in_order.clone(), in_order], "without --shuffle: dataset order");
}

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
    assert_eq!(saved["format"], loader_client::STATE_FORMAT, "{saved}");
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

/// A coordinator with two workers and a `loaderctl consume` child reading
/// job `name` over gRPC (far longer than any test: it is killed, with the
/// rest, when `body` returns), once the trainer has consumed something.
fn with_consumer<T: Send + 'static>(name: &'static str, body: impl FnOnce(&Cluster) -> T + Send + 'static) -> T {
    loader_e2e::run(Duration::from_secs(240), move |scope| {
        let cluster = Cluster::start(&scope, 2);
        cluster.wait_for_workers(2);
        let url = cluster.url();
        let _trainer = loader_e2e::loaderctl(
            &scope,
            &[
                "consume", "--coordinator", &url, "--job-name", name, "--json", "--samples", "100000000",
                "--shape", "1", "--batch-size", "4", "--transport", "grpc",
            ],
        );
        cluster.admin().wait_for("the trainer consuming", Duration::from_secs(60), |admin| {
            let consumed: u64 = admin
                .jobs()?
                .iter()
                .filter(|j| j.job.as_ref().and_then(|j| j.spec.as_ref()).is_some_and(|s| s.name == name))
                .flat_map(|j| j.consumers.iter().map(|c| c.consumed))
                .sum();
            Ok((consumed > 0 && !admin.sessions()?.is_empty()).then_some(()))
        });
        body(&cluster)
    })
}

fn worker_ids(cluster: &Cluster) -> Vec<u64> {
    let mut ids: Vec<u64> = cluster.admin().workers().expect("ListWorkers").iter().map(|w| w.worker_id).collect();
    ids.sort_unstable();
    ids
}

#[test]
fn status_json_lists_workers_sessions_and_jobs() {
    with_consumer("status-json", |cluster| {
        let ids = worker_ids(cluster);
        let v = json(&loaderctl(&["status", "--json", "--coordinator", &cluster.url()], Duration::from_secs(20)));
        let workers = v["workers"].as_array().expect("workers");
        let mut listed: Vec<u64> = workers.iter().map(|w| w["worker_id"].as_u64().expect("worker_id")).collect();
        listed.sort_unstable();
        assert_eq!(listed, ids, "{v}");
        for w in workers {
            assert!(w["address"].as_str().is_some_and(|a| a.starts_with("http://")), "{w}");
            assert!(w["busy"].as_f64().is_some_and(|b| (0.0..=1.0).contains(&b)), "{w}");
            assert_eq!(w["draining"], false, "{w}");
            assert!(w["pid"].as_u64().is_some_and(|p| p > 0), "workers report their pid: {w}");
            // Every batch of this job holds 4 samples.
            let delivered = w["delivered"].as_u64().expect("delivered");
            assert_eq!(w["delivered_samples"].as_u64(), Some(4 * delivered), "{w}");
        }
        let jobs = v["jobs"].as_array().expect("jobs");
        let job = jobs.iter().find(|j| j["name"] == "status-json").unwrap_or_else(|| panic!("job not listed: {v}"));
        assert_eq!(job["batch_size"], 4, "{job}");
        assert_eq!(job["num_samples"], 100_000_000, "{job}");
        assert_eq!(job["error"], serde_json::Value::Null, "{job}");
        let rank0 = &job["consumers"][0];
        assert_eq!(rank0["total"], 25_000_000, "{job}");
        assert!(rank0["consumed"].as_u64().is_some_and(|c| c > 0), "{job}");
        let sessions = v["sessions"].as_array().expect("sessions");
        let session = sessions.iter().find(|s| s["job_id"] == job["job_id"]).unwrap_or_else(|| panic!("no session: {v}"));
        assert_eq!(session["consumer"], 0, "{session}");
        assert_eq!(session["ring"], false, "{session}");
        assert!(session["stall_ms"].as_u64().is_some(), "{session}");
    });
}

/// The rows under the section that starts with `section`, as cells.
fn section_rows(out: &str, section: &str) -> Vec<Vec<String>> {
    out.lines()
        .skip_while(|l| !l.starts_with(section))
        .skip(2)
        .take_while(|l| !l.is_empty() && !["WORKERS", "SESSIONS", "JOBS"].iter().any(|s| l.starts_with(s)))
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

#[test]
fn top_once_renders_workers_sessions_and_job_progress() {
    with_consumer("top-once", |cluster| {
        let ids = worker_ids(cluster);
        // Longer than a session's heartbeat interval (TTL / 3, 1.7 s), so
        // that every worker and session reports between the two polls.
        let run = loaderctl(
            &["top", "--once", "--interval", "3", "--coordinator", &cluster.url()],
            Duration::from_secs(20),
        );
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        let out = &run.stdout;
        assert!(!out.contains('\x1b'), "escapes in a --once frame: {out:?}");
        assert!(out.lines().any(|l| l == "WORKERS (2)"), "{out}");

        // ID ADDRESS SAMPLES/S BATCHES/S BUSY QUEUE DRAINING
        let workers = section_rows(out, "WORKERS");
        let mut listed: Vec<u64> = workers.iter().map(|r| r[0].parse().expect("worker id")).collect();
        listed.sort_unstable();
        assert_eq!(listed, ids, "{out}");
        for row in &workers {
            assert_eq!(row.len(), 7, "{out}");
            // Both polls listed every worker: real rates, not `-`.
            assert!(row[2].parse::<f64>().is_ok() && row[3].parse::<f64>().is_ok(), "{out}");
            assert!(row[4].ends_with('%'), "{out}");
            assert_eq!(row[6], "no", "{out}");
        }

        // ID NAME PROGRESS(2 cells) BATCHES/S SAMPLES/S ETA
        let jobs = section_rows(out, "JOBS");
        let job = jobs.iter().find(|r| r[1] == "top-once").unwrap_or_else(|| panic!("no progress line: {out}"));
        let (consumed, total) = job[2].split_once('/').expect("consumed/total");
        assert!(consumed.parse::<u64>().is_ok_and(|c| c > 0), "{out}");
        assert_eq!(total, "25000000", "{out}");
        assert!(job[3].starts_with('(') && job[3].ends_with("%)"), "{out}");
        assert!(job[4].parse::<f64>().is_ok(), "{out}");
        assert!(!job[6].is_empty(), "{out}");

        // ID JOB RANK NODE STALL WATERMARK
        let sessions = section_rows(out, "SESSIONS");
        let session = sessions.iter().find(|r| r[1] == job[0]).unwrap_or_else(|| panic!("no session of the job: {out}"));
        assert_eq!(session[2], "0", "{out}");
        assert!(session[4].ends_with('%'), "{out}");
        assert!(session[5].ends_with("/25000000"), "{out}");
    });
}

#[test]
fn top_and_status_json_errors_are_one_line() {
    let limit = Duration::from_secs(20);
    let down = "http://127.0.0.1:1";
    for interval in ["0", "soon", "-1"] {
        let run = loaderctl(&["top", "--once", "--interval", interval, "--coordinator", down], limit);
        assert_one_line_error(&run, &format!("invalid value '{interval}' for '--interval <SECONDS>'"));
    }
    assert_one_line_error(
        &loaderctl(&["top", "--once", "--coordinator", down], limit),
        "cannot reach coordinator http://127.0.0.1:1: ",
    );
    assert_one_line_error(&loaderctl(&["top", "--once", "--coordinator", "ftp://x:1"], limit), "ftp://x:1");
    assert_one_line_error(
        &loaderctl(&["status", "--json", "--coordinator", down], limit),
        "cannot reach coordinator http://127.0.0.1:1: ",
    );
}

/// `run --json` of a small synthetic job with `extra` flags.
fn run_small(extra: &[&str]) -> Run {
    let mut args = vec!["run", "--json", "--workers", "2", "--samples", "256", "--shape", "3,8,8", "--batch-size", "16", "--epochs", "2"];
    args.extend_from_slice(extra);
    loaderctl(&args, Duration::from_secs(90))
}

#[test]
fn run_device_cuda_without_a_usable_gpu_is_one_line_and_auto_runs_on_the_host() {
    let gpu = run_small(&["--device", "cuda"]);
    if gpu.code == Some(0) {
        // A machine with an NVIDIA GPU, built with the feature `cuda`.
        assert_eq!(json(&gpu)["device"], "cuda:0");
    } else {
        // No driver library, no GPU, or a build without the feature: one
        // line that says which, and nothing started.
        assert_one_line_error(&gpu, "device cuda:0: ");
    }
    let auto = run_small(&["--device", "auto"]);
    let report = json(&auto);
    assert_eq!(report["batches"], 32, "{report}");
    if report["device"] == "cpu" {
        let said: Vec<&str> = auto.stderr.lines().filter(|l| l.contains("device auto")).collect();
        assert_eq!(said.len(), 1, "one log line says auto fell back: {}", auto.stderr);
        assert!(said[0].contains("batches stay on the host"), "{}", said[0]);
    } else {
        assert_eq!(report["device"], "cuda:0", "{report}");
    }
    assert_one_line_error(&run_small(&["--device", "tpu"]), "invalid value 'tpu' for '--device <DEVICE>': invalid device \"tpu\"");
    assert_one_line_error(&run_small(&["--device-prefetch", "0"]), "device_prefetch must be > 0");
    assert_one_line_error(&run_small(&["--ring", "4,x"]), "invalid value '4,x' for '--ring <SLOTS,SLOT_BYTES>': expected SLOTS,SLOT_BYTES");
}

/// `--step-ms` holds each batch as a training step of that length would:
/// no run can then go faster than a batch a step (sleeps last at least
/// as long as asked); the report gives each epoch's rate; a bad value is
/// one line.
#[test]
fn run_step_ms_paces_the_trainer_and_the_report_gives_each_epoch() {
    let paced = json(&run_small(&["--step-ms", "20"]));
    assert_eq!(paced["batches"], 32, "{paced}");
    let rate = paced["samples_per_s"].as_f64().unwrap_or(f64::MAX);
    assert!(rate <= 16.0 / 0.020, "16 samples a batch, a batch per 20 ms at most: {paced}");
    assert_eq!(paced["epochs_samples_per_s"].as_array().map(Vec::len), Some(2), "{paced}");
    let one_epoch = json(&loaderctl(&["run", "--json", "--workers", "1", "--samples", "64", "--shape", "4", "--batch-size", "16"], Duration::from_secs(90)));
    assert!(one_epoch.get("epochs_samples_per_s").is_none(), "one epoch: no per-epoch list: {one_epoch}");
    assert_one_line_error(&run_small(&["--step-ms=-1"]), "invalid value '-1' for '--step-ms <MS>': expected milliseconds from 0 to 3600000");
}

#[test]
fn run_device_host_lands_every_batch_byte_for_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sums = |device: &str| {
        let path = dir.path().join(format!("{device}.sums"));
        let run = run_small(&["--device", device, "--checksum", path.to_str().expect("utf-8")]);
        let report = json(&run);
        assert_eq!(report["device"], device, "{report}");
        assert_eq!(report["batches"], 32, "{report}");
        let text = std::fs::read_to_string(&path).expect("checksum file");
        assert_eq!(text.lines().count(), 32, "{text}");
        (text, report["bytes"].as_u64().expect("bytes"))
    };
    let (host, host_bytes) = sums("cpu");
    let (device, device_bytes) = sums("host");
    assert_eq!(device, host, "the device path's bytes differ from the host batches");
    assert_eq!(device_bytes, host_bytes);
}

#[test]
fn merge_states_joins_every_rank_or_says_which_is_missing() {
    use loader_client::{Dtype, LoaderState, Resumption};
    let limit = Duration::from_secs(20);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| dir.path().join(name).display().to_string();
    let mut spec = loader_job::authoring::synthetic(100, &[4], Dtype::U8)
        .batch_size(10)
        .build()
        .expect("spec");
    spec.consumers = 2;
    let state = |rank: u32, next_seq: u64| {
        Resumption { spec: spec.clone(), next_seq, yielded_above: Default::default(), replanned: false }
            .into_state(rank)
    };
    state(0, 3).save(path("rank0.json")).expect("save");
    state(1, 4).save(path("rank1.json")).expect("save");

    assert_one_line_error(
        &loaderctl(&["merge-states", &path("rank0.json"), "--out", &path("m.json")], limit),
        "merging needs every rank's state: rank 1 of 2 missing",
    );
    assert_one_line_error(
        &loaderctl(&["merge-states", &path("rank0.json"), &path("rank0.json"), "--out", &path("m.json")], limit),
        "rank 0 is given twice",
    );
    assert_one_line_error(
        &loaderctl(&["merge-states", &path("nope.json"), "--out", &path("m.json")], limit),
        "cannot read loader state",
    );
    let run = loaderctl(&["merge-states", &path("rank1.json"), &path("rank0.json"), "--out", &path("m.json")], limit);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("merged 2 states of 2 ranks"), "{}", run.stdout);
    let merged = LoaderState::load(path("m.json")).expect("merged state");
    assert!(merged.is_merged());
    assert_eq!((merged.world_size(), merged.next_seq()), (2, 3));
    let progress: Vec<u64> = merged.progress().iter().map(|p| p.next_seq).collect();
    assert_eq!(progress, [3, 4]);
}
