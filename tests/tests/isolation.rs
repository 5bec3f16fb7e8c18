//! One bad job must not hurt the others: a job whose batches are
//! enormous but valid, or whose batch size is absurd, fails its own trainer
//! with one line within seconds, while every worker keeps running and a
//! healthy job on the same deployment finishes exactly once.

use std::process::Command;
use std::time::{Duration, Instant};

use loader_client::{Dtype, Loader, spec};
use loader_e2e::{Cluster, Proc, Relay, Trainer, assert_received, binary, run};

/// Runs `loaderctl args`, waits (bounded) for it to exit; returns its exit
/// code, stderr and how long it ran.
fn loaderctl(scope: &loader_e2e::Scope, args: &[&str], limit: Duration) -> (Option<i32>, Vec<String>, Duration) {
    let mut command = Command::new(binary("loaderctl"));
    command.args(args);
    let started = Instant::now();
    let mut proc = Proc::spawn_capturing_stderr(scope, "loaderctl", command, false);
    let status = proc.wait_exit(limit).unwrap_or_else(|| panic!("loaderctl {args:?} did not exit within {limit:?}"));
    let took = started.elapsed();
    // wait_exit has collected everything it printed.
    (status.code(), proc.stderr(), took)
}

/// The error line of a failed `loaderctl`: its stderr is that one line.
fn one_line(stderr: &[String]) -> &str {
    let errors: Vec<&String> = stderr.iter().filter(|l| l.starts_with("loaderctl: error")).collect();
    assert_eq!(errors.len(), 1, "one error line, got {stderr:?}");
    errors[0]
}

#[test]
fn a_poison_job_fails_its_trainer_and_hurts_no_worker_and_no_other_job() {
    run(Duration::from_secs(180), |scope| {
        let mut cluster = Cluster::builder().workers(3).start(&scope);
        let url = cluster.url();
        let healthy = spec::synthetic(4_000, &[64], Dtype::U8)
            .batch_size(16)
            .epochs(2)
            .shuffle(5)
            // Slow enough to still be running while the poison jobs come and go.
            .cost_ns(300_000)
            .build()
            .expect("spec");
        let plan = loader_job::spec::plan(&healthy).expect("plan");
        let total = plan.total_batches();
        let trainer = Trainer::spawn(Loader::builder(&url).shared_memory(false), healthy);
        trainer.wait_for(4, Duration::from_secs(30));

        // A valid shape whose batches take 40 GB: refused by the coordinator,
        // since no worker's memory budget holds them.
        let (code, stderr, took) = loaderctl(
            &scope,
            &[
                "consume", "--coordinator", &url, "--samples", "16", "--shape", "100000,100000", "--batch-size", "4",
                "--transport", "grpc",
            ],
            Duration::from_secs(20),
        );
        assert_ne!(code, Some(0));
        let line = one_line(&stderr);
        assert!(line.contains("batch_size") && line.contains("40.0 GB"), "{line}");
        eprintln!("huge shape: {took:?}: {line}");

        // A batch size of u32::MAX: refused before any worker sees it.
        let (code, stderr, _) = loaderctl(
            &scope,
            &["consume", "--coordinator", &url, "--samples", "16", "--batch-size", "4294967295", "--transport", "grpc"],
            Duration::from_secs(20),
        );
        assert_ne!(code, Some(0));
        let line = one_line(&stderr);
        assert!(line.contains("batch_size: 4294967295 exceeds the limit"), "{line}");

        // The healthy job finishes exactly once, and no worker died.
        let seen = trainer.join(Duration::from_secs(120));
        assert_received(&seen, &plan, 0, 0..total);
        for (i, worker) in cluster.workers.iter_mut().enumerate() {
            assert!(worker.wait_exit(Duration::ZERO).is_none(), "worker {i} died");
        }
    });
}

/// Embedded mode with the same shape: its workers refuse the job (or the
/// coordinator does, if they registered first); either way one line, fast.
#[test]
fn embedded_run_of_a_poison_job_fails_in_one_line() {
    run(Duration::from_secs(60), |scope| {
        let (code, stderr, took) = loaderctl(
            &scope,
            &["run", "--workers", "1", "--samples", "16", "--shape", "100000,100000", "--batch-size", "4", "--json"],
            Duration::from_secs(30),
        );
        assert_ne!(code, Some(0));
        let line = one_line(&stderr);
        assert!(line.contains("40.0 GB"), "{line}");
        eprintln!("embedded: {took:?}: {line}");
    });
}

/// Process ids of `parent`'s children.
fn children(parent: u32) -> Vec<i32> {
    let parent = parent.to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The parent pid is the second field after the parenthesised name.
            stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(1)) == Some(parent.as_str())
        })
        .collect()
}

/// Whether process `pid` maps its trainer's shared-memory ring.
fn maps_ring(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|maps| maps.contains("/memfd:loader-ring"))
}

fn alive(pid: i32) -> bool {
    // A zombie has exited; only its entry waits to be reaped.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next()) != Some("Z"))
}

/// SIGTERM (and SIGINT) to `loaderctl run` stop its workers and exit with
/// the shell's code within 2 s; the generated token file and the ring's
/// socket directory go too (this run's own TMPDIR stays empty).
#[test]
fn a_signalled_loaderctl_run_stops_its_workers_and_leaves_nothing() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for (signal, code) in [(Signal::SIGTERM, 143), (Signal::SIGINT, 130)] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let tmp_path = tmp.path().to_path_buf();
        run(Duration::from_secs(60), move |scope| {
            let mut command = Command::new(binary("loaderctl"));
            command
                .args(["run", "--workers", "2", "--dataset", "tokens", "--batch-size", "8", "--epochs", "100000", "--json"])
                .env("TMPDIR", &tmp_path);
            let mut proc = Proc::spawn_capturing_stderr(&scope, "loaderctl", command, false);
            let pid = proc.pid();
            let mut workers = Vec::new();
            loader_e2e::wait_until("loaderctl run starts its workers", Duration::from_secs(20), || {
                workers = children(pid);
                workers.len() >= 2
            });
            // Consuming: the workers have mapped the ring.
            loader_e2e::wait_until("the workers map the ring", Duration::from_secs(20), || {
                workers.iter().all(|&w| maps_ring(w))
            });
            kill(Pid::from_raw(pid as i32), signal).expect("signal");
            let sent = Instant::now();
            let status = proc.wait_exit(Duration::from_secs(2)).expect("loaderctl exits within 2 s");
            assert_eq!(status.code(), Some(code), "{signal}");
            let said = proc.stderr().join("\n");
            assert!(said.contains(&format!("stopped by {signal}; workers stopped")), "{said}");
            loader_e2e::wait_until("every worker is gone", Duration::from_secs(2).saturating_sub(sent.elapsed()), || {
                workers.iter().all(|&w| !alive(w))
            });
            let left: Vec<_> = std::fs::read_dir(&tmp_path).expect("tmp").filter_map(Result::ok).map(|e| e.path()).collect();
            assert!(left.is_empty(), "{signal} left {left:?}");
        });
    }
}

/// SIGTERM to `loaderctl consume` ends it with the shell's code, and it
/// says only that it stopped: the workers are the coordinator's, not its own.
#[test]
fn a_signalled_loaderctl_consume_stops_and_claims_no_workers() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    run(Duration::from_secs(60), |scope| {
        let cluster = Cluster::start(&scope, 1);
        let mut command = Command::new(binary("loaderctl"));
        command.args(["consume", "--coordinator", &cluster.url(), "--json"]).args([
            "--samples", "100000", "--shape", "64", "--batch-size", "64", "--epochs", "100000",
        ]);
        let mut proc = Proc::spawn_capturing_stderr(&scope, "loaderctl", command, false);
        cluster.admin().wait_for("the consumer's session opens", Duration::from_secs(20), |a| {
            Ok((!a.sessions()?.is_empty()).then_some(()))
        });
        kill(Pid::from_raw(proc.pid() as i32), Signal::SIGTERM).expect("signal");
        let status = proc.wait_exit(Duration::from_secs(5)).expect("loaderctl consume exits");
        assert_eq!(status.code(), Some(143));
        let said = proc.stderr().join("\n");
        assert!(said.contains("loaderctl: stopped by SIGTERM"), "{said}");
        assert!(!said.contains("workers stopped"), "consume started no workers: {said}");
    });
}

/// Entries of /dev/shm (Loader puts nothing there: its ring is a memfd).
fn dev_shm() -> std::collections::BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// A SIGKILLed `loaderctl run` cannot clean up, and needs not: its ring is a
/// memfd, its socket a name in the abstract namespace, and its generated
/// token file has no name from the start. Nothing new in its TMPDIR or in
/// /dev/shm.
#[test]
fn a_sigkilled_loaderctl_run_leaves_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let tmp_path = tmp.path().to_path_buf();
    let shm_before = dev_shm();
    run(Duration::from_secs(60), move |scope| {
        let mut command = Command::new(binary("loaderctl"));
        command
            .args(["run", "--workers", "1", "--dataset", "tokens", "--batch-size", "8", "--epochs", "100000", "--json"])
            .env("TMPDIR", &tmp_path);
        let mut proc = Proc::spawn_capturing_stderr(&scope, "loaderctl", command, false);
        let mut workers = Vec::new();
        loader_e2e::wait_until("loaderctl run starts its worker", Duration::from_secs(20), || {
            workers = children(proc.pid());
            !workers.is_empty()
        });
        loader_e2e::wait_until("the worker maps the ring", Duration::from_secs(20), || maps_ring(workers[0]));
        proc.kill();
        // Its coordinator died with it: the worker cannot renew its lease
        // (5 s), fences and exits.
        loader_e2e::wait_until("the orphaned worker exits", Duration::from_secs(10), || {
            workers.iter().all(|&w| !alive(w))
        });
        let left: Vec<_> = std::fs::read_dir(&tmp_path)
            .expect("tmp")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(left.is_empty(), "left {left:?}");
        let new: Vec<_> = dev_shm().difference(&shm_before).cloned().collect();
        assert!(new.is_empty(), "new in /dev/shm: {new:?}");
    });
}

/// A trainer that finishes closes its session: it leaves `status` at once
/// (well within one heartbeat), not when its lease expires; and `status`
/// counts distinct deliveries apart from re-sent ones.
#[test]
fn a_finished_trainers_session_leaves_status_within_one_heartbeat() {
    run(Duration::from_secs(60), |scope| {
        let cluster = Cluster::builder().workers(1).start(&scope);
        let admin = cluster.admin();
        let job = spec::synthetic(400, &[16], Dtype::U8).batch_size(8).build().expect("spec");
        let plan = loader_job::spec::plan(&job).expect("plan");
        let total = plan.total_batches();
        let trainer = Trainer::spawn(Loader::builder(cluster.url()), job);
        let seen = trainer.join(Duration::from_secs(30));
        assert_received(&seen, &plan, 0, 0..total);
        let finished = Instant::now();
        // The default heartbeat interval is 1.67 s, the lease 5 s.
        admin.wait_for("the finished session is gone", Duration::from_millis(1666), |a| {
            Ok(a.sessions()?.is_empty().then_some(()))
        });
        eprintln!("session gone {:?} after the last batch", finished.elapsed());
        let jobs = admin.jobs().expect("jobs");
        let progress = &jobs[0].consumers[0];
        assert_eq!((progress.delivered, progress.resent, progress.consumed), (total, 0, total));
    });
}

/// A coordinator gone for good: the trainer fails `coordinator_timeout`
/// after its last answer with the same one line on both transports, instead
/// of waiting forever (gRPC) or failing later with another message (shared
/// memory, whose workers fence and leave the ring). Gone silently (the
/// trainer's path to it blackholed, its calls hanging rather than refused)
/// the bound is the same.
#[test]
fn a_trainer_whose_coordinator_is_gone_fails_in_one_bound_on_every_transport() {
    for (shared_memory, silent) in [(false, false), (true, false), (false, true)] {
        run(Duration::from_secs(60), move |scope| {
            let mut cluster = Cluster::builder().workers(2).ttl_ms(1000).start(&scope);
            let relay = Relay::start();
            relay.to(cluster.url().trim_start_matches("http://"));
            let url = if silent { format!("http://{}", relay.addr()) } else { cluster.url() };
            let job = spec::synthetic(100_000, &[64], Dtype::U8)
                .batch_size(16)
                .cost_ns(100_000)
                .build()
                .expect("spec");
            let timeout = Duration::from_secs(3);
            let trainer =
                Trainer::spawn(Loader::builder(url).shared_memory(shared_memory).coordinator_timeout(timeout), job);
            trainer.wait_for(10, Duration::from_secs(20));
            if silent {
                relay.freeze();
            } else {
                cluster.server.kill();
            }
            let gone = Instant::now();
            let error = trainer.finish(timeout + Duration::from_secs(5)).expect_err("the trainer fails");
            let after = gone.elapsed();
            eprintln!("shared_memory={shared_memory} silent={silent}: failed {after:?} after the coordinator went: {error}");
            assert!(error.contains("lost the coordinator") && error.contains("no answer for"), "{error}");
            assert!(!error.contains('\n'));
            // Its last answer came at most a heartbeat (TTL/3) before.
            assert!(after >= timeout - Duration::from_millis(400), "not before the timeout: {after:?}");
            assert!(after <= timeout + Duration::from_secs(1), "the timeout is {timeout:?}, failed after {after:?}");
        });
    }
}
