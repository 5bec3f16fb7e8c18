//! Scaling with the coordinator's local worker pool (`loader-server
//! --worker-pool local`, `loaderctl scale`): real processes, a job running
//! through every change, nothing lost, nothing twice, no worker left behind.

use std::process::Command;
use std::time::Duration;

use loader_client::{Dtype, Loader, spec};
use loader_e2e::{Admin, Cluster, Proc, Trainer, assert_received, binary, loaderctl, run};

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
        let plan = loader_proto::spec::plan(&job).expect("plan");
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
    });
}
