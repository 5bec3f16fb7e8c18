//! Shared streams (`JobSpec.shared`, docs/sharing.md): independent trainers
//! subscribed to one job, each receiving every batch, made once. Real
//! coordinator, workers and (for the SIGKILL) `loaderctl consume`
//! processes; the other trainers are the Rust SDK in this process.

use std::time::{Duration, Instant};

use loader_client::{Dtype, JobSpec, Loader, Transport, spec};
use loader_e2e::{Cluster, Received, Trainer, assert_received, loaderctl, run, wait_until};
use loader_proto::pb::{ConsumerProgress, JobInfo};
use loader_proto::sampler::Plan;

/// Lease TTL: the configured wait for a subscriber that dies.
const TTL_MS: u64 = 1000;
/// Slack for process scheduling on top of the deadlines the design states.
const SLACK: Duration = Duration::from_secs(1);

/// A shared synthetic job named `name`: `batches` batches of 16 samples,
/// each sample costing `cost_us` of worker CPU.
fn shared_job(name: &str, batches: u64, cost_us: u64) -> JobSpec {
    spec::synthetic(batches * 16, &[16], Dtype::U8)
        .batch_size(16)
        .shuffle(7)
        .cost_ns(cost_us * 1000)
        .name(name)
        .shared(0)
        .build()
        .expect("spec")
}

fn plan(job: &JobSpec) -> Plan {
    loader_proto::spec::plan(job).expect("plan")
}

/// The subscribers of the job named `name`, as the coordinator counts them.
fn subscribers(jobs: &[JobInfo], name: &str) -> Vec<ConsumerProgress> {
    let job = jobs
        .iter()
        .find(|j| j.job.as_ref().and_then(|j| j.spec.as_ref()).is_some_and(|s| s.name == name))
        .unwrap_or_else(|| panic!("no job named {name}"));
    job.consumers.iter().filter(|c| c.subscribes_to.is_some()).cloned().collect()
}

/// The longest time `seen` went without a batch between `from` and `to`.
fn longest_gap(seen: &[Received], from: Instant, to: Instant) -> Duration {
    let mut times: Vec<Instant> = seen.iter().map(|r| r.at).filter(|&t| t > from && t < to).collect();
    times.insert(0, from);
    times.push(to);
    times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
}

fn wait_for_sessions(cluster: &Cluster, n: usize) {
    let admin = cluster.admin();
    wait_until("every trainer has subscribed", Duration::from_secs(20), || {
        admin.sessions().expect("sessions").len() == n
    });
}

#[test]
fn three_trainers_on_a_shared_stream_each_receive_every_batch_made_once() {
    run(Duration::from_secs(120), |scope| {
        let job = shared_job("sweep", 240, 1000);
        let plan = plan(&job);
        let total = plan.total_batches();
        // The trainers subscribe before any worker runs, so that they start
        // together; one of them takes everything over gRPC.
        let mut cluster = Cluster::builder().ttl_ms(TTL_MS).start(&scope);
        let trainers: Vec<Trainer> = [true, true, false]
            .into_iter()
            .map(|shm| Trainer::spawn(Loader::builder(cluster.url()).shared_memory(shm), job.clone()))
            .collect();
        wait_for_sessions(&cluster, 3);
        cluster.add_worker();
        cluster.add_worker();
        let seen: Vec<Vec<Received>> = trainers.into_iter().map(|t| t.join(Duration::from_secs(90))).collect();
        for (i, seen) in seen.iter().enumerate() {
            // Every batch, in order, each with the samples a solo run gets.
            assert_received(seen, &plan, 0, 0..total);
            let shm = seen.iter().filter(|r| r.transport == Transport::SharedMemory).count();
            if i < 2 {
                assert!(shm > 0, "trainer {i} offers a ring and got no batch through it");
            } else {
                assert_eq!(shm, 0, "trainer {i} offers no ring");
            }
        }
        let subs = subscribers(&cluster.admin().jobs().expect("jobs"), "sweep");
        assert_eq!(subs.len(), 3, "{subs:?}");
        let alone: u64 = subs.iter().map(|c| c.assigned_alone).sum();
        for c in &subs {
            assert_eq!(c.delivered - c.resent, total, "{c:?}");
            assert_eq!(c.consumed, total, "{c:?}");
        }
        // Made once: each batch was handed out for the three together, but
        // for the few a subscriber had no room for at that moment.
        assert!(alone <= total / 5, "{alone} of 3 x {total} batches were made for one subscriber alone: {subs:?}");
        eprintln!("batches made for one subscriber alone: {alone} of 3 x {total}");
    });
}

#[test]
fn a_trainer_that_subscribes_late_still_receives_every_batch_once() {
    run(Duration::from_secs(120), |scope| {
        let job = shared_job("late", 300, 100);
        let plan = plan(&job);
        let total = plan.total_batches();
        let cluster = Cluster::builder().workers(2).ttl_ms(TTL_MS).start(&scope);
        let step = Duration::from_millis(2);
        let early: Vec<Trainer> = (0..2)
            .map(|_| Trainer::spawn_paced(Loader::builder(cluster.url()), job.clone(), step))
            .collect();
        early[0].wait_for(total * 3 / 10, Duration::from_secs(60));
        let late = Trainer::spawn_paced(Loader::builder(cluster.url()), job.clone(), step);
        assert!(early[0].yielded() < total, "the job ended before the late trainer came; make it longer");
        let late = late.join(Duration::from_secs(90));
        assert_received(&late, &plan, 0, 0..total);
        for t in early {
            assert_received(&t.join(Duration::from_secs(90)), &plan, 0, 0..total);
        }
    });
}

/// Writes the spec of `job` for `loaderctl consume --spec`.
fn spec_file(dir: &std::path::Path, job: &JobSpec) -> std::path::PathBuf {
    let path = dir.join("shared.json");
    let kind = match job.dataset.as_ref().and_then(|d| d.kind.as_ref()) {
        Some(loader_proto::pb::dataset_spec::Kind::Synthetic(s)) => s.clone(),
        _ => panic!("a synthetic job"),
    };
    let text = serde_json::json!({
        "name": job.name,
        "shared": true,
        "dataset": {"synthetic": {
            "num_samples": kind.num_samples,
            "shape": kind.shape,
            "dtype": "uint8",
            "cost_ns": kind.cost_ns,
        }},
        "batch_size": job.batch_size,
        "sampler": {"shuffle": true, "seed": job.sampler.as_ref().map_or(0, |s| s.seed)},
    });
    std::fs::write(&path, text.to_string()).expect("write spec");
    path
}

#[test]
fn a_sigkilled_subscriber_stalls_the_others_no_longer_than_its_lease() {
    run(Duration::from_secs(150), |scope| {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = spec_file(dir.path(), &shared_job("kill", 500, 100));
        let job = loader_client::spec_file::parse_file(&path).expect("spec file").build().expect("spec");
        let plan = plan(&job);
        let total = plan.total_batches();
        let cluster = Cluster::builder().workers(2).ttl_ms(TTL_MS).start(&scope);
        let step = Duration::from_millis(2);
        let mut doomed = loaderctl(
            &scope,
            &["consume", "--coordinator", &cluster.url(), "--transport", "shm", "--json", "--spec"]
                .map(str::to_owned)
                .into_iter()
                .chain([path.display().to_string()])
                .collect::<Vec<_>>(),
        );
        let trainers: Vec<Trainer> = (0..2)
            .map(|_| Trainer::spawn_paced(Loader::builder(cluster.url()), job.clone(), step))
            .collect();
        wait_for_sessions(&cluster, 3);
        trainers[0].wait_for(total / 4, Duration::from_secs(60));
        assert!(doomed.wait_exit(Duration::ZERO).is_none(), "loaderctl consume ended before the kill");
        doomed.kill();
        let killed = Instant::now();
        assert!(trainers[0].yielded() < total * 3 / 4, "the job ended too soon after the kill; make it longer");
        for t in trainers {
            let seen = t.join(Duration::from_secs(90));
            assert_received(&seen, &plan, 0, 0..total);
            let end = seen.last().map_or(killed, |r| r.at);
            let gap = longest_gap(&seen, killed, end);
            let bound = Duration::from_millis(TTL_MS) + SLACK;
            eprintln!("longest wait for a batch after the SIGKILL: {gap:?} (bound {bound:?})");
            assert!(gap <= bound, "a subscriber waited {gap:?} for a batch after another was SIGKILLed");
        }
    });
}

#[test]
fn a_worker_sigkill_loses_and_duplicates_nothing_for_any_subscriber() {
    run(Duration::from_secs(150), |scope| {
        let job = shared_job("workers", 900, 400);
        let plan = plan(&job);
        let total = plan.total_batches();
        let mut cluster = Cluster::builder().workers(3).ttl_ms(TTL_MS).start(&scope);
        let trainers: Vec<Trainer> = [true, true, false]
            .into_iter()
            .map(|shm| Trainer::spawn(Loader::builder(cluster.url()).shared_memory(shm), job.clone()))
            .collect();
        for (i, third) in [1u64, 2].into_iter().enumerate() {
            trainers[0].wait_for(total * third / 3, Duration::from_secs(60));
            cluster.workers[i].kill();
            cluster.add_worker();
        }
        assert!(trainers[0].yielded() < total, "the job ended before the second kill; make it longer");
        for t in trainers {
            assert_received(&t.join(Duration::from_secs(90)), &plan, 0, 0..total);
        }
    });
}
