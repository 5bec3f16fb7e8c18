//! Failures with real processes and SIGKILL: nothing lost, nothing twice,
//! nothing left running. The guarantees and what each failure costs are in
//! docs/reliability.md; each test here is named there.

use std::time::{Duration, Instant};

use loader_client::{Dtype, JobSpec, Loader, Transport, spec};
use loader_e2e::{
    Cluster, HOST_ADDR, NS_ADDR, Proc, Relay, RemoteNamespace, Scope, Trainer, assert_received, binary, loaderctl,
    run, wait_until,
};

/// Lease TTL of the coordinator in most of these tests: short, so a death costs little.
const TTL_MS: u64 = 1000;
/// Slack for process scheduling on top of the deadlines the design states.
const SLACK: Duration = Duration::from_secs(1);
/// How long a stopping worker waits for its open connections to close
/// (`GRACE` in worker/src/lib.rs).
const WORKER_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// A synthetic job of `batches` batches of 16 samples, each sample costing
/// `cost_us` of worker CPU: slow enough that a failure lands mid-run.
fn slow_job(batches: u64, cost_us: u64) -> JobSpec {
    spec::synthetic(batches * 16, &[16], Dtype::U8)
        .batch_size(16)
        .shuffle(99)
        .cost_ns(cost_us * 1000)
        .build()
        .expect("spec")
}

/// `loaderctl consume` flags for a job that runs until it is killed.
fn endless_consume(url: &str, transport: &str) -> Vec<String> {
    ["consume", "--coordinator", url, "--transport", transport, "--json"]
        .into_iter()
        .chain(["--samples", "100000", "--shape", "64", "--batch-size", "64", "--epochs", "100000"])
        .map(str::to_owned)
        .collect()
}

#[test]
fn killing_workers_repeatedly_loses_and_duplicates_nothing() {
    run(Duration::from_secs(180), |scope| {
        let job = spec::synthetic(3_000, &[16], Dtype::U8)
            .batch_size(16)
            .epochs(8)
            .shuffle(99)
            // Slow enough that the kills land mid-run.
            .cost_ns(400_000)
            .build()
            .expect("spec");
        let plan = loader_job::spec::plan(&job).expect("plan");
        let total = plan.total_batches();

        let mut cluster = Cluster::builder().workers(3).ttl_ms(TTL_MS).start(&scope);
        let trainer = Trainer::spawn(Loader::builder(cluster.url()), job);

        // A kill at every eighth of the run, the first five of them.
        let mut victim = 0usize;
        for eighth in 1..=5 {
            trainer.wait_for(total * eighth / 8, Duration::from_secs(60));
            victim = (victim + 7) % cluster.workers.len();
            cluster.workers[victim].kill();
            cluster.workers.remove(victim);
            cluster.add_worker();
        }
        assert!(trainer.yielded() < total, "the run ended before 5 workers were killed; make the job slower");
        let seen = trainer.join(Duration::from_secs(150));
        assert_received(&seen, &plan, 0, 0..total);
    });
}

#[test]
fn survivors_finish_the_job_after_a_worker_dies_for_good() {
    run(Duration::from_secs(120), |scope| {
        for shared_memory in [false, true] {
            let mut cluster = Cluster::builder().workers(2).ttl_ms(TTL_MS).start(&scope);
            let job = slow_job(400, 1000);
            let plan = loader_job::spec::plan(&job).expect("plan");
            let total = plan.total_batches();
            let trainer = Trainer::spawn(Loader::builder(cluster.url()).shared_memory(shared_memory), job);
            trainer.wait_for(total / 5, Duration::from_secs(60));
            // No replacement: the one survivor must produce the dead
            // worker's batches once its lease expires.
            cluster.workers[0].kill();
            let seen = trainer
                .finish(Duration::from_millis(4 * TTL_MS) + Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("shared_memory={shared_memory}: {e}"));
            assert_received(&seen, &plan, 0, 0..total);
        }
    });
}

#[test]
fn sigkilled_trainer_session_expires_and_workers_unmap_its_ring() {
    run(Duration::from_secs(90), |scope| {
        let ttl = Duration::from_millis(TTL_MS);
        let mut cluster = Cluster::builder().workers(2).ttl_ms(TTL_MS).start(&scope);
        let admin = cluster.admin();
        let mut trainer = loaderctl(&scope, &endless_consume(&cluster.url(), "shm"));
        wait_until("every worker maps the trainer's ring", Duration::from_secs(20), || {
            assert!(trainer.wait_exit(Duration::ZERO).is_none(), "loaderctl consume exited early");
            cluster.workers.iter().all(|w| w.maps_memfd("loader-ring"))
        });
        assert_eq!(admin.sessions().expect("sessions").len(), 1, "the trainer's session is listed");

        trainer.kill();
        let killed = Instant::now();
        let bound = ttl + SLACK;
        wait_until("session expired and every ring mapping dropped", bound, || {
            let sessions = admin.sessions().expect("sessions");
            sessions.is_empty() && cluster.workers.iter().all(|w| !w.maps_memfd("loader-ring"))
        });
        eprintln!("session gone and rings unmapped {:?} after SIGKILL (bound {bound:?})", killed.elapsed());

        // The workers outlive the trainer and serve the next one.
        for worker in &mut cluster.workers {
            assert!(worker.wait_exit(Duration::ZERO).is_none(), "a worker exited with the trainer");
        }
        let report = consume_64_batches(&scope, &cluster.url(), &[]);
        assert_eq!(report["shm_batches"], 64, "co-located workers deliver through the ring: {report}");
    });
}

/// The number of batches a worker's `dropped N held batches and M tasks`
/// log line reports, for each such line it printed so far.
fn dropped_counts(worker: &Proc) -> Vec<u64> {
    worker
        .stderr()
        .iter()
        .filter_map(|line| line.split_once("dropped ")?.1.split_once(" held batches")?.0.parse().ok())
        .collect()
}

#[test]
fn a_dead_trainers_batches_are_dropped_by_the_worker_holding_them() {
    run(Duration::from_secs(90), |scope| {
        let ttl = Duration::from_millis(TTL_MS);
        let mut cluster = Cluster::builder()
            .workers(1)
            .ttl_ms(TTL_MS)
            .capture_worker_stderr()
            .worker_log("loader_worker=info")
            .start(&scope);
        let admin = cluster.admin();
        // Over gRPC, produced batches wait in the worker's outbox for the
        // trainer's stream (with a ring they would sit in its memfd, which
        // the kernel frees with the trainer).
        let mut trainer = loaderctl(&scope, &endless_consume(&cluster.url(), "grpc"));
        admin.wait_for("the worker delivered batches", Duration::from_secs(20), |a| {
            Ok(a.workers()?.iter().all(|w| w.delivered > 0).then_some(()))
        });
        assert!(trainer.wait_exit(Duration::ZERO).is_none(), "loaderctl consume exited early");

        trainer.kill();
        let killed = Instant::now();
        // Until the session's lease runs out the coordinator keeps the
        // worker's share assigned, and nobody fetches it.
        let held = admin.workers().expect("workers")[0].outstanding;
        assert!(held > 0, "the worker held no batch for the trainer when it died");
        // The lease runs out (TTL), the reaper sees it (TTL/4), the worker
        // hears it in its next heartbeat answer (at most TTL/3 later).
        let bound = ttl + ttl / 4 + ttl / 3 + SLACK;
        let worker = &cluster.workers[0];
        wait_until("the worker logged that it dropped the dead trainer's batches", bound, || {
            !dropped_counts(worker).is_empty()
        });
        eprintln!(
            "worker dropped {:?} batches {:?} after the trainer's SIGKILL (bound {bound:?}); the coordinator counted {held} held",
            dropped_counts(worker),
            killed.elapsed()
        );
        assert!(dropped_counts(worker).iter().sum::<u64>() > 0, "the worker dropped no batch");
        admin.wait_for("the coordinator counts nothing held by the worker", SLACK, |a| {
            Ok((a.sessions()?.is_empty() && a.workers()?.iter().all(|w| w.outstanding == 0)).then_some(()))
        });

        // The worker outlives the trainer and serves the next one.
        assert!(cluster.workers[0].wait_exit(Duration::ZERO).is_none(), "the worker exited with the trainer");
        consume_64_batches(&scope, &cluster.url(), &["--transport", "grpc"]);
    });
}

/// A second trainer (`loaderctl consume`, 64 batches, `extra` flags) runs
/// to the end within 60 s against the cluster at `url`; its report.
fn consume_64_batches(scope: &Scope, url: &str, extra: &[&str]) -> serde_json::Value {
    let args: Vec<String> = ["consume", "--coordinator", url, "--json"]
        .into_iter()
        .chain(extra.iter().copied())
        .chain(["--samples", "4096", "--shape", "64", "--batch-size", "64"])
        .map(str::to_owned)
        .collect();
    let mut second = loaderctl(scope, &args);
    let status = second.wait_exit(Duration::from_secs(60)).expect("the second consumer finishes within 60 s");
    assert!(status.success(), "second consumer: {status}");
    let report = last_json(&second);
    assert_eq!(report["batches"], 64, "{report}");
    report
}

/// The JSON object a `loaderctl ... --json` child printed last.
fn last_json(proc: &Proc) -> serde_json::Value {
    let lines = proc.stdout();
    let line = lines.iter().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON in {lines:?}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn coordinator_sigkill_and_restart_mid_epoch_is_exactly_once() {
    run(Duration::from_secs(120), |scope| {
        // Long enough that the workers hold their leases through the restart.
        const TTL_MS: u64 = 3000;
        let state = tempfile::tempdir().expect("state dir");
        let mut cluster = Cluster::builder().workers(2).ttl_ms(TTL_MS).state_dir(state.path()).start(&scope);
        let job = slow_job(400, 1000);
        let plan = loader_job::spec::plan(&job).expect("plan");
        let total = plan.total_batches();
        let trainer = Trainer::spawn(Loader::builder(cluster.url()), job);
        trainer.wait_for(total / 3, Duration::from_secs(60));

        let at_kill = trainer.yielded();
        let killed = Instant::now();
        // Down for a third of the lease: clients and workers must retry
        // through it, and the workers must not fence.
        cluster.restart_server(Duration::from_millis(TTL_MS / 3));
        let at_restart = trainer.yielded();
        eprintln!(
            "coordinator SIGKILLed after {at_kill} of {total} batches, back {:?} later after {at_restart}",
            killed.elapsed()
        );
        assert!(at_restart < total, "the job ended before the restart; make it slower");

        let seen = trainer.join(Duration::from_secs(90));
        assert_received(&seen, &plan, 0, 0..total);
        for worker in &mut cluster.workers {
            assert!(
                worker.wait_exit(Duration::ZERO).is_none(),
                "a worker exited although the coordinator was back well within its lease"
            );
        }
        cluster.wait_for_workers(2);
    });
}

#[test]
fn workers_fence_and_exit_nonzero_when_the_coordinator_is_gone() {
    run(Duration::from_secs(60), |scope| {
        let ttl = Duration::from_millis(TTL_MS);
        let interval = ttl / 3;
        let mut cluster = Cluster::builder().workers(2).ttl_ms(TTL_MS).start(&scope);
        let admin = cluster.admin();
        // Busy workers, holding a trainer's ring, not idle ones.
        let _trainer = loaderctl(&scope, &endless_consume(&cluster.url(), "shm"));
        admin.wait_for("both workers delivered batches", Duration::from_secs(20), |a| {
            Ok(a.workers()?.iter().all(|w| w.delivered > 0).then_some(()))
        });

        cluster.server.kill();
        let killed = Instant::now();
        let bound = ttl + interval + SLACK;
        let mut exits: Vec<Option<(Duration, std::process::ExitStatus)>> = vec![None; cluster.workers.len()];
        wait_until("every worker exits", bound + Duration::from_secs(10), || {
            for (worker, exit) in cluster.workers.iter_mut().zip(&mut exits) {
                if exit.is_none() {
                    *exit = worker.wait_exit(Duration::ZERO).map(|status| (killed.elapsed(), status));
                }
            }
            exits.iter().all(Option::is_some)
        });
        for (i, exit) in exits.iter().enumerate() {
            let (after, status) = exit.expect("exited");
            eprintln!("worker {i} exited {after:?} after the coordinator's SIGKILL with {status} (bound {bound:?})");
            assert!(!status.success(), "worker {i}: a fenced worker exits non-zero, got {status}");
            assert!(after <= bound, "worker {i} exited {after:?} after the coordinator died; bound {bound:?}");
        }
    });
}

#[test]
fn partitioned_remote_worker_is_fenced_and_its_batches_reassigned() {
    loader_e2e::needs(RemoteNamespace::available());
    run(Duration::from_secs(120), |scope| {
        let ttl = Duration::from_millis(TTL_MS);
        // Dropped last: the workers inside it die first.
        let ns = RemoteNamespace::create();
        let mut cluster = local_and_remote_workers(&scope, &ns);
        let admin = cluster.admin();

        let job = slow_job(400, 1000);
        let plan = loader_job::spec::plan(&job).expect("plan");
        let total = plan.total_batches();
        let trainer = Trainer::spawn(Loader::builder(cluster.url()), job);
        trainer.wait_for(total / 5, Duration::from_secs(60));
        admin.wait_for("the remote worker delivered batches", Duration::from_secs(30), |a| {
            Ok(a.workers()?.iter().any(|w| w.address.contains(NS_ADDR) && w.delivered > 0).then_some(()))
        });

        ns.cut();
        let cut = Instant::now();
        let at_cut = trainer.yielded();
        assert!(at_cut < total, "the job ended before the partition; make it slower");
        // The worker fences when its lease runs out (TTL after its last
        // renewal, at most a heartbeat interval before the cut), then gives
        // open connections the worker's shutdown grace (2 s) to close: the
        // trainer's Fetch stream across the cut link never does.
        let bound = ttl + ttl / 3 + WORKER_SHUTDOWN_GRACE + SLACK;
        let status = cluster.workers[1]
            .wait_exit(bound + Duration::from_secs(10))
            .expect("the partitioned worker exits by itself");
        let after = cut.elapsed();
        eprintln!(
            "remote worker exited {after:?} after the cut with {status} (bound {bound:?}); {at_cut} of {total} batches had arrived"
        );
        assert!(!status.success(), "a fenced worker exits non-zero, got {status}");
        assert!(after <= bound, "the partitioned worker exited {after:?} after the cut; bound {bound:?}");
        admin.wait_for("the partitioned worker is no longer listed", SLACK, |a| {
            Ok(a.workers()?.iter().all(|w| !w.address.contains(NS_ADDR)).then_some(()))
        });

        let seen = trainer.join(Duration::from_secs(90));
        assert_received(&seen, &plan, 0, 0..total);
        let grpc = seen.iter().filter(|r| r.transport == Transport::Grpc).count();
        let shm = seen.iter().filter(|r| r.transport == Transport::SharedMemory).count();
        eprintln!("{grpc} batches from the remote worker over gRPC, {shm} from the local one through the ring");
        assert!(grpc > 0 && shm > 0, "both paths carried batches: {grpc} gRPC, {shm} shared memory");
        drop(cluster);
        drop(ns);
    });
}

/// A coordinator on the host end of `ns`'s link, one worker on the host
/// and one inside `ns` (`cluster.workers[1]`), both registered.
fn local_and_remote_workers(scope: &Scope, ns: &RemoteNamespace) -> Cluster {
    let mut cluster = Cluster::builder().ttl_ms(TTL_MS).listen(format!("{HOST_ADDR}:0")).start(scope);
    cluster.add_worker();
    let mut remote = ns.command(binary("loader-worker"));
    remote.args(["--coordinator", &cluster.url(), "--listen", &format!("{NS_ADDR}:0"), "--node", "remote-test"]);
    cluster.add_worker_command(remote);
    cluster.wait_for_workers(2);
    cluster
}

/// A grey partition's first act: a job runs until the worker at `address`
/// delivered and a fifth of it is done, then `cut` silences the path to
/// that worker (which still heartbeats). The job must finish without it,
/// every batch once and in order, within 20 s of the cut plus the job's own
/// time, and the worker must stay registered. Returns when the cut was.
fn a_job_finishes_past_a_cut(cluster: &Cluster, address: &str, cut: impl FnOnce()) -> Instant {
    let admin = cluster.admin();
    let job = slow_job(600, 1000);
    let plan = loader_job::spec::plan(&job).expect("plan");
    let total = plan.total_batches();
    let began = Instant::now();
    let trainer = Trainer::spawn(Loader::builder(cluster.url()), job);
    admin.wait_for("the worker behind the cut delivered batches", Duration::from_secs(30), |_| {
        Ok((delivered_by(cluster, address) > 0).then_some(()))
    });
    trainer.wait_for(total / 5, Duration::from_secs(60));
    // The job's own time, from its first fifth (start-up included).
    let own = began.elapsed() * 5;
    cut();
    let cut_at = Instant::now();
    let at_cut = trainer.yielded();
    assert!(at_cut < total, "the job ended before the cut; make it slower");
    let seen = trainer.join(Duration::from_secs(90));
    let took = cut_at.elapsed();
    let longest = longest_gap(&seen, cut_at, Instant::now());
    eprintln!(
        "the job finished {took:?} after the cut ({at_cut} of {total} batches before it; its own time ~{own:?}); \
         longest wait for a batch {longest:?}"
    );
    assert_received(&seen, &plan, 0, 0..total);
    let bound = Duration::from_secs(20) + own;
    assert!(took <= bound, "the job finished {took:?} after the cut; bound {bound:?}");
    assert!(
        admin.workers().expect("ListWorkers").iter().any(|w| w.address == address),
        "the worker behind the cut still heartbeats: it stays registered"
    );
    cut_at
}

/// Batches the worker at `address` delivered, as the coordinator counts them.
fn delivered_by(cluster: &Cluster, address: &str) -> u64 {
    cluster.admin().workers().expect("ListWorkers").iter().find(|w| w.address == address).map_or(0, |w| w.delivered)
}

/// A grey failure: the path between the trainer and one worker goes silent
/// (its port blackholed both ways, through a relay the test freezes) while
/// the worker's heartbeats to the coordinator still pass, so its lease
/// never expires. The trainer's channel keepalive finds the dead path, its
/// heartbeats tell the coordinator, and the coordinator moves the batches
/// that worker held to the other one: the job finishes, exactly once and in
/// order, well within 20 s of the cut plus the job's own time. Thawed, the
/// path carries batches again within 5 s.
#[test]
fn a_worker_the_trainer_cannot_reach_loses_its_batches_to_others_until_the_path_heals() {
    run(Duration::from_secs(150), |scope| {
        let mut cluster = Cluster::builder().workers(1).ttl_ms(TTL_MS).start(&scope);
        let relay = Relay::start();
        let advertised = format!("http://{}", relay.addr());
        // Another node: the trainer reaches it over gRPC, through the relay.
        cluster.add_worker_with(&["--advertise", &advertised, "--node", "behind-the-relay"]);
        relay.to(cluster.workers[1].addr());
        cluster.wait_for_workers(2);
        let admin = cluster.admin();

        // 1. Cut while the job runs: it finishes on the other worker.
        a_job_finishes_past_a_cut(&cluster, &advertised, || relay.freeze());

        // 2. A second job, cut until it moves on without the worker, then
        // healed: the worker carries its batches again.
        let job = slow_job(1500, 1000);
        let plan = loader_job::spec::plan(&job).expect("plan");
        let total = plan.total_batches();
        relay.thaw();
        let trainer = Trainer::spawn(Loader::builder(cluster.url()), job);
        let before = delivered_by(&cluster, &advertised);
        admin.wait_for("the relayed worker delivered batches of the second job", Duration::from_secs(30), |_| {
            Ok((delivered_by(&cluster, &advertised) > before).then_some(()))
        });
        relay.freeze();
        let frozen_at = trainer.yielded();
        // Moving on: more batches than the cut worker could have held.
        trainer.wait_for(frozen_at + 200, Duration::from_secs(60));
        assert!(trainer.yielded() < total, "the second job ended before the heal; make it slower");
        let before = delivered_by(&cluster, &advertised);
        relay.thaw();
        let healed = Instant::now();
        admin.wait_for("the healed path carries batches again", Duration::from_secs(30), |_| {
            Ok((delivered_by(&cluster, &advertised) > before).then_some(()))
        });
        let back = healed.elapsed();
        eprintln!("batches flowed through the healed path {back:?} after the heal");
        assert!(back <= Duration::from_secs(5) + SLACK, "the healed path carried batches only {back:?} after the heal");
        let seen = trainer.join(Duration::from_secs(120));
        assert_received(&seen, &plan, 0, 0..total);
        drop(cluster);
        drop(relay);
    });
}

/// The trainer's longest wait between two batches that arrived in
/// `from..=to`.
fn longest_gap(seen: &[loader_e2e::Received], from: Instant, to: Instant) -> Duration {
    let at: Vec<Instant> = seen.iter().map(|r| r.at).filter(|&at| at >= from && at <= to).collect();
    at.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default().max(at.first().map_or(Duration::ZERO, |&a| a - from))
}

/// A straggler: a worker SIGSTOPped for 3 s (within its lease, so nothing
/// expires) holds batches the in-order trainer waits on. Once the wait
/// passes its lateness threshold (the 0.5 s floor here: batches come fast)
/// the trainer says so, the coordinator gives that worker's batches for it
/// to the other worker too, and the trainer goes on: no wait much longer
/// than the threshold plus a batch, against the whole 3 s without backups.
/// Every batch once, in order. Without a straggler, no backup at all.
#[test]
fn a_stopped_worker_stalls_the_trainer_no_longer_than_the_lateness_threshold() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    run(Duration::from_secs(120), |scope| {
        let cluster = Cluster::builder().workers(2).ttl_ms(5000).start(&scope);
        let admin = cluster.admin();
        let backups = |job_id: u64| {
            let jobs = admin.jobs().expect("ListJobs");
            let c = &jobs.iter().find(|j| j.job.as_ref().is_some_and(|job| job.job_id == job_id)).expect("job").consumers[0];
            (c.backup_launched, c.backup_won, c.backup_wasted)
        };

        let quiet = slow_job(300, 200);
        let plan = loader_job::spec::plan(&quiet).expect("plan");
        let loader = Loader::builder(cluster.url()).job(quiet.clone()).build().expect("loader");
        let job_id = loader.job().job_id;
        let seen: Vec<loader_e2e::Received> = loader
            .map(|b| b.map(|b| loader_e2e::Received { seq: b.seq(), indices: b.indices().to_vec(), transport: b.transport(), at: Instant::now() }))
            .collect::<Result<_, _>>()
            .expect("the quiet job");
        assert_received(&seen, &plan, 0, 0..plan.total_batches());
        assert_eq!(backups(job_id), (0, 0, 0), "no straggler, no backup");

        let job = slow_job(1500, 500);
        let plan = loader_job::spec::plan(&job).expect("plan");
        let total = plan.total_batches();
        let loader = Loader::builder(cluster.url());
        let trainer = Trainer::spawn(loader, job);
        trainer.wait_for(total / 5, Duration::from_secs(60));
        let pid = Pid::from_raw(cluster.workers[0].pid() as i32);
        kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
        let stopped = Instant::now();
        // The scenario: a pause of 3 s, under the 5 s lease.
        std::thread::sleep(Duration::from_secs(3));
        kill(pid, Signal::SIGCONT).expect("SIGCONT");
        let resumed = Instant::now();
        assert!(trainer.yielded() < total, "the job ended during the pause; make it slower");
        let seen = trainer.join(Duration::from_secs(90));
        assert_received(&seen, &plan, 0, 0..total);
        let gap = longest_gap(&seen, stopped, resumed);
        let job_id = admin.jobs().expect("ListJobs").iter().filter_map(|j| j.job.as_ref()).map(|j| j.job_id).max().expect("job");
        let (launched, won, wasted) = backups(job_id);
        eprintln!("longest wait during a 3 s pause: {gap:?}; backups launched {launched}, won {won}, wasted {wasted}");
        assert!(launched > 0 && won > 0, "a backup ran and won: {launched} launched, {won} won");
        assert!(gap <= Duration::from_millis(500) + SLACK, "the trainer waited {gap:?} on the paused worker");
    });
}

/// A worker slow for good (a test knob: every batch takes 2 s longer, as on
/// a slow disk or a noisy host), not stopped: once it is past start-up (it
/// delivered a batch), each time the in-order trainer waits on it past the
/// lateness threshold (the 0.5 s floor here) the batches it holds are copied
/// by the other worker, and no wait lasts much longer than the threshold
/// plus a batch (the first a little longer: the copying worker takes the
/// copy from the coordinator, then finishes the batch it was making), against
/// 2 s per batch of the slow worker without backups. The threshold does not
/// grow with the late waits. Every batch once, in order.
#[test]
fn a_slow_worker_stalls_the_trainer_no_longer_than_the_lateness_threshold() {
    run(Duration::from_secs(120), |scope| {
        let mut cluster = Cluster::builder().workers(1).ttl_ms(5000).start(&scope);
        let slow = format!("http://{}", cluster.add_worker_with(&["--slow-batch-ms", "2000"]).addr());
        cluster.wait_for_workers(2);
        let admin = cluster.admin();

        // Long enough that the fast worker is not half through it when the
        // slow one delivers its first batch, 2 s in (1,200 batches of 8 ms
        // each: about 10 s on one worker).
        let job = slow_job(1200, 500);
        let plan = loader_job::spec::plan(&job).expect("plan");
        let total = plan.total_batches();
        let trainer = Trainer::spawn(Loader::builder(cluster.url()), job);
        admin.wait_for("the slow worker delivered its first batch", Duration::from_secs(30), |_| {
            Ok((delivered_by(&cluster, &slow) > 0).then_some(()))
        });
        let started = Instant::now();
        assert!(trainer.yielded() < total / 2, "the job is half done before the slow worker started; make it slower");
        let seen = trainer.join(Duration::from_secs(90));
        let ended = Instant::now();
        assert_received(&seen, &plan, 0, 0..total);
        // The waits past 300 ms, in order: the late ones.
        let mut late = Vec::new();
        let mut last = started;
        for r in seen.iter().filter(|r| r.at >= started) {
            if r.at - last > Duration::from_millis(300) {
                late.push(r.at - last);
            }
            last = r.at;
        }
        let jobs = admin.jobs().expect("ListJobs");
        let c = &jobs[0].consumers[0];
        eprintln!(
            "late waits with a worker 2 s slower per batch: {late:?} (longest {:?}); backups launched {}, won {}, \
             wasted {}; the slow worker delivered {}",
            longest_gap(&seen, started, ended),
            c.backup_launched,
            c.backup_won,
            c.backup_wasted,
            delivered_by(&cluster, &slow)
        );
        assert!(c.backup_launched > 0 && c.backup_won > 0, "backups ran and won");
        let threshold = Duration::from_millis(500);
        assert!(late.len() >= 2, "the slow worker held the trainer up more than once: {late:?}");
        for (i, wait) in late.iter().enumerate() {
            assert!(*wait <= threshold + SLACK, "late wait {i} lasted {wait:?}: {late:?}");
        }
    });
}

/// The grey partition of the relay test above, made as an operator would:
/// the remote worker runs in a network namespace and its serving port is
/// blackholed both ways with nftables for 60 s, while its heartbeats to
/// the coordinator (another port) pass and keep its lease. The running job
/// finishes on the local worker within 20 s of the block plus its own
/// time, every batch once and in order, and the worker stays registered; a
/// second job started during the block runs on without it, and once the
/// port is open again the worker carries its batches within 5 s.
#[test]
fn a_blackholed_serving_port_stalls_nothing_and_carries_batches_again_after_the_heal() {
    loader_e2e::needs(RemoteNamespace::available().and_then(|()| RemoteNamespace::nftables()));
    run(Duration::from_secs(200), |scope| {
        let block = Duration::from_secs(60);
        // Dropped last: the workers inside it die first.
        let ns = RemoteNamespace::create();
        let cluster = local_and_remote_workers(&scope, &ns);
        let listen = cluster.workers[1].addr().to_owned();
        let port: u16 = listen.rsplit(':').next().and_then(|p| p.parse().ok()).expect("the remote worker's port");
        let remote_url = format!("http://{listen}");
        let admin = cluster.admin();

        // 1. Blackholed while a job runs: it finishes on the local worker.
        let cut = a_job_finishes_past_a_cut(&cluster, &remote_url, || ns.blackhole_port(port));

        // 2. A job that outlasts the block (31 batches a second on the
        // local worker alone), healed at 60 s: the remote worker carries
        // its batches again.
        let rest = block.saturating_sub(cut.elapsed());
        let job = slow_job(((rest.as_secs_f64() + 20.0) * 31.0) as u64, 2000);
        let plan = loader_job::spec::plan(&job).expect("plan");
        let total = plan.total_batches();
        let trainer = Trainer::spawn(Loader::builder(cluster.url()), job);
        let before = delivered_by(&cluster, &remote_url);
        std::thread::sleep(block.saturating_sub(cut.elapsed()));
        assert!(trainer.yielded() < total, "the second job ended before the heal; make it longer");
        assert!(trainer.yielded() > 0, "the second job ran during the block");
        ns.heal();
        let healed = Instant::now();
        admin.wait_for("the healed port carries batches again", Duration::from_secs(30), |_| {
            Ok((delivered_by(&cluster, &remote_url) > before).then_some(()))
        });
        let back = healed.elapsed();
        eprintln!("the worker carried batches again {back:?} after the heal");
        assert!(back <= Duration::from_secs(5) + SLACK, "the healed port carried batches only {back:?} after the heal");
        let seen = trainer.join(Duration::from_secs(120));
        assert_received(&seen, &plan, 0, 0..total);
        drop(cluster);
        drop(ns);
    });
}

/// A worker (re)started while its coordinator's port is blackholed from its
/// namespace (its connection attempts go unanswered, as in a partition)
/// keeps retrying with short connection attempts (2 s: an attempt's SYN is
/// sent again only 1 s and 3 s into it), and registers within seconds of
/// the heal: at worst once its pending attempt runs out, plus a pause.
#[test]
fn a_worker_started_during_a_partition_registers_soon_after_the_heal() {
    loader_e2e::needs(RemoteNamespace::available().and_then(|()| RemoteNamespace::nftables()));
    run(Duration::from_secs(60), |scope| {
        // Dropped last: the worker inside it dies first.
        let ns = RemoteNamespace::create();
        let mut cluster = Cluster::builder().listen(format!("{HOST_ADDR}:0")).start(&scope);
        let url = cluster.url();
        let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("the coordinator's port");
        ns.blackhole_port(port);
        let mut remote = ns.command(binary("loader-worker"));
        remote.args(["--coordinator", &url, "--listen", &format!("{NS_ADDR}:0"), "--connect-timeout", "30"]);
        cluster.add_worker_command(remote);
        // Several attempts go unanswered (the heal lands between SYN
        // retransmissions, which come 1 s and 3 s into an attempt).
        std::thread::sleep(Duration::from_millis(3500));
        assert!(cluster.admin().workers().expect("ListWorkers").is_empty(), "nothing got through the partition");
        ns.heal();
        let healed = Instant::now();
        cluster.wait_for_workers(1);
        let took = healed.elapsed();
        eprintln!("the worker registered {took:?} after the heal");
        // One pending attempt (2 s) and one pause between attempts (at most 1 s).
        let bound = Duration::from_secs(3) + SLACK;
        assert!(took <= bound, "registered {took:?} after the heal; bound {bound:?}");
        drop(cluster);
        drop(ns);
    });
}
