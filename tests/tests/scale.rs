//! Scaling with the coordinator's local worker pool (`loader-server
//! --worker-pool local`, `loaderctl scale`): real processes, a job running
//! through every change, nothing lost, nothing twice, no worker left behind.

use std::process::Command;
use std::time::Duration;

use loader_client::{Dtype, Loader, spec};
use loader_e2e::{Admin, Cluster, KubeApi, KubeRequest, Proc, Trainer, assert_received, binary, loaderctl, run};
use loader_proto::keda::external_scaler_client::ExternalScalerClient;
use loader_proto::keda::{GetMetricsRequest, ScaledObjectRef};

/// Lease TTL of the coordinator: short, so the test is quick.
const TTL_MS: u64 = 1000;

/// Runs `loaderctl scale` to `workers` (waiting for it to take effect) and
/// returns its stdout.
fn scale(scope: &loader_e2e::Scope, url: &str, workers: u32) -> Vec<String> {
    let mut ctl = loaderctl(scope, &["scale", "--coordinator", url, "--workers", &workers.to_string(), "--wait", "30"]);
    let status = ctl.wait_exit(Duration::from_secs(40)).expect("loaderctl scale did not exit");
    assert!(status.success(), "loaderctl scale --workers {workers}: {status}");
    ctl.stdout()
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the server's tasks");
    for task in tasks.flatten() {
        let listed = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(listed.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    out
}

#[test]
fn scale_one_to_three_to_one_during_a_job_loses_and_duplicates_nothing_and_leaves_no_worker() {
    run(Duration::from_secs(150), |scope| {
        let worker = binary("loader-worker");
        let mut command = Command::new(binary("loader-server"));
        command.args(["--listen", "127.0.0.1:0", "--lease-ttl-ms", &TTL_MS.to_string(), "--worker-pool", "local"]);
        command.args(["--workers", "1", "--worker-command"]).arg(&worker);
        let server = Proc::spawn(&scope, "loader-server", command, true);
        let url = format!("http://{}", server.addr());
        let admin = Admin::new(&url);
        admin.wait_for("the pool's first worker", Duration::from_secs(15), |a| {
            Ok((a.workers()?.len() == 1).then_some(()))
        });

        // 3 epochs of 200 batches of 16 samples at 1 ms a sample: ~3 s an
        // epoch on one worker, so every change lands mid-job.
        let job = spec::synthetic(200 * 16, &[16], Dtype::U8)
            .batch_size(16)
            .epochs(3)
            .shuffle(7)
            .cost_ns(1_000_000)
            .build()
            .expect("spec");
        let plan = loader_job::spec::plan(&job).expect("plan");
        let total = plan.total_batches();
        let trainer = Trainer::spawn(Loader::builder(url.clone()), job);

        trainer.wait_for(total / 8, Duration::from_secs(60));
        let up = scale(&scope, &url, 3);
        assert_eq!(up.first().map(String::as_str), Some("workers 1 -> 3: started 2"), "{up:?}");
        let workers = admin.workers().expect("workers");
        assert_eq!(workers.len(), 3, "{workers:?}");
        let mut pids: Vec<u32> = workers.iter().map(|w| w.pid).collect();
        pids.sort_unstable();
        let mut kids = children(server.pid());
        kids.sort_unstable();
        assert_eq!(pids, kids, "every worker is a process the coordinator started");

        // A typo is refused in one line, and nothing is started.
        let mut command = Command::new(binary("loaderctl"));
        command.args(["scale", "--coordinator", &url, "--workers", "10000"]);
        let mut typo = Proc::spawn_capturing_stderr(&scope, "loaderctl", command, false);
        assert_eq!(typo.wait_exit(Duration::from_secs(20)).and_then(|s| s.code()), Some(1));
        assert_eq!(typo.stderr(), vec![format!("loaderctl: error: coordinator {url}: 10000 workers: a pool runs at most 1024")]);
        assert_eq!(children(server.pid()).len(), 3);

        let at = trainer.yielded();
        assert!(at < total / 2, "the job ran out before scaling down; make it slower ({at} of {total})");
        trainer.wait_for(total / 2, Duration::from_secs(60));
        let down = scale(&scope, &url, 1);
        assert!(
            down.first().is_some_and(|l| l.starts_with("workers 3 -> 1: draining workers ")),
            "{down:?}"
        );
        assert_eq!(down.get(1).map(String::as_str), Some("1 workers running"), "{down:?}");

        let seen = trainer.join(Duration::from_secs(90));
        assert_received(&seen, &plan, 0, 0..total);
        let workers = admin.workers().expect("workers");
        assert_eq!(workers.len(), 1, "{workers:?}");
        // The drained workers exited and were reaped: one child is left.
        admin.wait_for("the drained workers' processes to be gone", Duration::from_secs(10), |_| {
            Ok((children(server.pid()) == [workers[0].pid]).then_some(()))
        });
    });
}

#[test]
fn scaling_a_coordinator_without_a_pool_is_a_one_line_error() {
    run(Duration::from_secs(30), |scope| {
        let cluster = Cluster::builder().workers(1).start(&scope);
        let mut command = Command::new(binary("loaderctl"));
        command.args(["scale", "--coordinator", &cluster.url(), "--workers", "2"]);
        let mut ctl = Proc::spawn_capturing_stderr(&scope, "loaderctl", command, false);
        let status = ctl.wait_exit(Duration::from_secs(20)).expect("loaderctl exits");
        assert_eq!(status.code(), Some(1));
        let stderr = ctl.stderr();
        assert_eq!(
            stderr,
            vec![format!(
                "loaderctl: error: coordinator {}: this coordinator runs no worker pool; start loader-server with --worker-pool local",
                cluster.url()
            )]
        );
        let mut command = Command::new(binary("loaderctl"));
        command.args(["autoscale", "--coordinator", &cluster.url(), "--min", "1", "--max", "3"]);
        let mut ctl = Proc::spawn_capturing_stderr(&scope, "loaderctl", command, false);
        assert_eq!(ctl.wait_exit(Duration::from_secs(20)).and_then(|s| s.code()), Some(1));
        assert_eq!(ctl.stderr().len(), 1, "{:?}", ctl.stderr());
        assert!(ctl.stderr()[0].ends_with("this coordinator runs no worker pool; start loader-server with --worker-pool local"));
    });
}

/// One look at the run: seconds since the start, batches the trainer took,
/// workers running (not draining), the trainer's cumulative stall.
#[derive(Debug, Clone, Copy)]
struct Look {
    t: f64,
    yielded: u64,
    workers: usize,
    stall_ms: u64,
}

/// Batches per epoch of the autoscale job.
const EPOCH: u64 = 100;
/// Epochs of light, then heavy, then light load.
const PHASES: [(u64, u64); 3] = [(3, 100_000), (16, 2_500_000), (6, 100_000)];

#[test]
fn autoscale_follows_a_load_that_rises_then_falls() {
    run(Duration::from_secs(300), |scope| {
        let mut command = Command::new(binary("loader-server"));
        command.args(["--listen", "127.0.0.1:0", "--lease-ttl-ms", &TTL_MS.to_string(), "--worker-pool", "local"]);
        command.args(["--workers", "1", "--worker-command"]).arg(binary("loader-worker"));
        let server = Proc::spawn(&scope, "loader-server", command, true);
        let url = format!("http://{}", server.addr());
        let admin = Admin::new(&url);
        admin.wait_for("the pool's first worker", Duration::from_secs(15), |a| {
            Ok((a.workers()?.len() == 1).then_some(()))
        });
        let mut ctl = loaderctl(
            &scope,
            &["autoscale", "--coordinator", &url, "--min", "1", "--max", "6", "--target-stall", "10%", "--cooldown", "2"],
        );
        assert!(ctl.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()), "loaderctl autoscale");

        // Storage latency per sample: 0.1 ms, then 2.5 ms (a worker makes
        // 25 batches/s), then 0.1 ms again; the trainer takes a batch every
        // 10 ms, so the heavy phase needs 4 workers. (With 2 ms, 3 workers
        // left the trainer waiting 8-10% of the time, at the target itself,
        // and whether and when a fourth came was down to chance.)
        let waits: Vec<u64> = PHASES.iter().flat_map(|&(epochs, ns)| std::iter::repeat_n(ns, epochs as usize)).collect();
        let epochs = waits.len() as u32;
        let job = spec::synthetic(EPOCH * 16, &[16], Dtype::U8)
            .batch_size(16)
            .epochs(epochs)
            .shuffle(5)
            .wait_ns_by_epoch(waits)
            .build()
            .expect("spec");
        let plan = loader_job::spec::plan(&job).expect("plan");
        let total = plan.total_batches();
        let start = std::time::Instant::now();
        let trainer = Trainer::spawn_paced(Loader::builder(url.clone()), job, Duration::from_millis(10));

        let mut looks = Vec::new();
        while trainer.yielded() < total && start.elapsed() < Duration::from_secs(200) {
            let workers = admin.workers().map(|w| w.iter().filter(|w| !w.draining).count()).unwrap_or(0);
            let stall_ms = admin.sessions().map(|s| s.iter().map(|s| s.stall_ms).sum()).unwrap_or(0);
            looks.push(Look { t: start.elapsed().as_secs_f64(), yielded: trainer.yielded(), workers, stall_ms });
            std::thread::sleep(Duration::from_millis(250));
        }
        let seen = trainer.join(Duration::from_secs(60));
        assert_received(&seen, &plan, 0, 0..total);
        write_plot(&looks);

        let heavy = PHASES[0].0 * EPOCH..(PHASES[0].0 + PHASES[1].0) * EPOCH;
        let in_heavy: Vec<&Look> = looks.iter().filter(|l| heavy.contains(&l.yielded)).collect();
        let peak = in_heavy.iter().map(|l| l.workers).max().unwrap_or(0);
        assert!(peak >= 3, "the pool grew to {peak} workers under the heavy load; expected at least 3: {looks:?}");
        // Settled: from 3 s after the pool first reached its peak to the end
        // of the heavy phase, the trainer waited less than the target.
        let reached = in_heavy.iter().find(|l| l.workers == peak).map(|l| l.t).unwrap_or(f64::MAX);
        let settled: Vec<&&Look> = in_heavy.iter().filter(|l| l.t >= reached + 3.0).collect();
        let (first, last) = (settled.first().expect("a settled window"), settled.last().expect("a settled window"));
        assert!(last.t - first.t >= 2.0, "the heavy phase ended too soon after the pool settled: {looks:?}");
        let stall = (last.stall_ms - first.stall_ms) as f64 / 1000.0 / (last.t - first.t);
        assert!(stall < 0.10, "stall {:.1}% once settled; target 10%: {looks:?}", stall * 100.0);
        // The light load at the end: back down to the minimum.
        admin.wait_for("the pool to shrink back to one worker", Duration::from_secs(40), |a| {
            Ok((a.workers()?.iter().filter(|w| !w.draining).count() == 1).then_some(()))
        });
    });
}

/// Writes the run as a text plot (workers and stall over time) to
/// target/autoscale-plot.txt, for docs/operations.md.
fn write_plot(looks: &[Look]) {
    let mut out = String::from("   t(s)  batches  workers               stall(last 1 s)\n");
    let mut last: Option<&Look> = None;
    for l in looks.iter().step_by(4) {
        let stall = last.map_or(0.0, |p| {
            (l.stall_ms.saturating_sub(p.stall_ms)) as f64 / 1000.0 / (l.t - p.t).max(1e-3)
        });
        let bar = "#".repeat(l.workers);
        let stall_bar = "=".repeat((stall * 20.0).round() as usize);
        out.push_str(&format!("{:7.1} {:8} {:>2} {:<18} {:5.1}% {}\n", l.t, l.yielded, l.workers, bar, stall * 100.0, stall_bar));
        last = Some(l);
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/autoscale-plot.txt");
    let _ = std::fs::write(path, out);
}

/// Calls KEDA's external-scaler API on the coordinator as KEDA does.
struct Keda {
    runtime: tokio::runtime::Runtime,
    client: ExternalScalerClient<loader_process::grpc::Channel>,
}

impl Keda {
    fn new(url: &str) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let channel = {
            let _enter = runtime.enter();
            loader_process::grpc::endpoint(url, &loader_process::security::ClientSecurity::none()).expect("url").connect_lazy()
        };
        Self { runtime, client: ExternalScalerClient::new(channel) }
    }

    fn object(target: &str) -> ScaledObjectRef {
        ScaledObjectRef {
            name: "loader-worker".into(),
            namespace: "ml".into(),
            scaler_metadata: [("targetStall".to_owned(), target.to_owned())].into(),
        }
    }

    fn active(&self) -> bool {
        let mut c = self.client.clone();
        self.runtime.block_on(c.is_active(Self::object("5%"))).expect("IsActive").into_inner().result
    }

    fn metric(&self, target: &str) -> Result<f64, tonic::Status> {
        let mut c = self.client.clone();
        let request = GetMetricsRequest { scaled_object_ref: Some(Self::object(target)), metric_name: String::new() };
        let reply = self.runtime.block_on(c.get_metrics(request))?.into_inner();
        assert_eq!(reply.metric_values.len(), 1);
        assert_eq!(reply.metric_values[0].metric_name, "loader_desired_workers");
        Ok(reply.metric_values[0].metric_value_float)
    }
}

#[test]
fn the_keda_external_scaler_asks_for_a_worker_more_while_the_trainer_stalls() {
    run(Duration::from_secs(90), |scope| {
        let cluster = Cluster::builder().workers(1).ttl_ms(TTL_MS).start(&scope);
        let keda = Keda::new(&cluster.url());
        let spec = {
            let mut c = keda.client.clone();
            keda.runtime.block_on(c.get_metric_spec(Keda::object("0.05"))).expect("GetMetricSpec").into_inner()
        };
        assert_eq!(spec.metric_specs.len(), 1);
        assert_eq!((spec.metric_specs[0].metric_name.as_str(), spec.metric_specs[0].target_size_float), ("loader_desired_workers", 1.0));
        assert!(!keda.active(), "no trainer yet");
        let bad = keda.metric("lots").expect_err("a bad target");
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            bad.message(),
            "KEDA trigger metadata targetStall \"lots\": give a share between 0 and 1 (0.05) or a percentage (5%)"
        );

        // One worker at 2 ms a sample cannot keep up with a trainer that
        // takes every batch at once: it stalls nearly all the time.
        let job = spec::synthetic(200 * 16, &[16], Dtype::U8)
            .batch_size(16)
            .wait_ns_by_epoch(vec![2_000_000])
            .build()
            .expect("spec");
        let trainer = Trainer::spawn(Loader::builder(cluster.url()), job);
        trainer.wait_for(5, Duration::from_secs(30));
        assert!(keda.active(), "a trainer session is open");
        keda.metric("5%").expect("first poll");
        // A rate needs two polls with heartbeats between them.
        loader_e2e::wait_until("KEDA asks for one more worker", Duration::from_secs(20), || {
            keda.metric("5%").expect("poll") == 2.0
        });
        // The job ends; its session closes.
        trainer.join(Duration::from_secs(60));
        let admin = cluster.admin();
        admin.wait_for("the session to close", Duration::from_secs(30), |a| Ok(a.sessions()?.is_empty().then_some(())));
        assert!(!keda.active(), "no trainer: inactive");
    });
}

/// A coordinator whose pool is the worker Deployment behind `api`.
fn kubernetes_coordinator(scope: &loader_e2e::Scope, api: &KubeApi) -> Proc {
    let mut command = Command::new(binary("loader-server"));
    command.args(["--listen", "127.0.0.1:0", "--worker-pool", "kubernetes", "--worker-deployment", "loader-worker"]);
    command.env("KUBECONFIG", api.kubeconfig());
    Proc::spawn(scope, "loader-server", command, true)
}

#[test]
fn the_kubernetes_pool_patches_the_deployment_scale_and_a_refusal_is_one_line() {
    run(Duration::from_secs(60), |scope| {
        // Recorded API-server responses (tests/data/kube); no API server
        // runs here.
        let api = KubeApi::start(2, false);
        let server = kubernetes_coordinator(&scope, &api);
        let url = format!("http://{}", server.addr());
        for (workers, line) in [(4, "workers 2 -> 4: started 2"), (1, "workers 4 -> 1")] {
            let mut ctl = loaderctl(&scope, &["scale", "--coordinator", &url, "--workers", &workers.to_string()]);
            assert!(ctl.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()), "scale to {workers}");
            assert_eq!(ctl.stdout(), vec![line.to_owned()]);
            assert_eq!(api.replicas(), workers);
        }
        let requests = api.requests();
        let path = "/apis/apps/v1/namespaces/ml/deployments/loader-worker/scale";
        let patches: Vec<&KubeRequest> = requests.iter().filter(|r| r.method == "PATCH").collect();
        assert_eq!(patches.len(), 2, "{requests:?}");
        for (patch, n) in patches.iter().zip([4, 1]) {
            assert_eq!(patch.path, path);
            assert_eq!(patch.content_type, "application/merge-patch+json");
            assert_eq!(serde_json::from_str::<serde_json::Value>(&patch.body).expect("json"), serde_json::json!({"spec": {"replicas": n}}));
        }
        assert!(requests.iter().all(|r| r.path == path), "{requests:?}");

        let refusing = KubeApi::start(2, true);
        let server = kubernetes_coordinator(&scope, &refusing);
        let url = format!("http://{}", server.addr());
        let mut command = Command::new(binary("loaderctl"));
        command.args(["scale", "--coordinator", &url, "--workers", "3"]);
        let mut ctl = Proc::spawn_capturing_stderr(&scope, "loaderctl", command, false);
        assert_eq!(ctl.wait_exit(Duration::from_secs(20)).and_then(|s| s.code()), Some(1));
        assert_eq!(
            ctl.stderr(),
            vec![format!(
                "loaderctl: error: coordinator {url}: kubernetes refused to get deployments/scale ml/loader-worker: \
                 deployments.apps \"loader-worker\" is forbidden: User \"system:serviceaccount:ml:loader-coordinator\" \
                 cannot get resource \"deployments/scale\" in API group \"apps\" in the namespace \"ml\" \
                 (the coordinator's service account needs get and patch on deployments/scale)"
            )]
        );
        assert_eq!(refusing.replicas(), 2, "nothing changed");
    });
}
