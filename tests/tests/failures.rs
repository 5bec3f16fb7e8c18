//! Failures with real processes and SIGKILL: nothing lost, nothing twice.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use loader_client::{Dtype, Loader, spec};
use loader_e2e::Cluster;

/// Lease TTL of the coordinator in these tests: short, so a death costs little.
const TTL_MS: &str = "1000";

#[test]
fn killing_workers_repeatedly_loses_and_duplicates_nothing() {
    let job = spec::synthetic(3_000, &[16], Dtype::U8)
        .batch_size(16)
        .epochs(3)
        .shuffle(99)
        // Slow enough that the kills land mid-run.
        .cost_ns(400_000)
        .build()
        .expect("spec");
    let plan = loader_proto::spec::plan(&job).expect("plan");
    let total = plan.total_batches();

    let mut cluster = Cluster::start_with(3, &["--lease-ttl-ms", TTL_MS]);
    let url = cluster.url();
    let (done_tx, done_rx) = mpsc::channel();
    let consumer = std::thread::spawn(move || {
        let loader = Loader::builder(url).job(job).build().expect("loader");
        let mut seen = Vec::new();
        for batch in loader {
            let batch = batch.expect("batch");
            seen.push((batch.seq(), batch.indices().to_vec()));
        }
        let _ = done_tx.send(());
        seen
    });

    let deadline = Instant::now() + Duration::from_secs(180);
    let mut kills = 0;
    let mut victim = 0usize;
    while kills < 5 {
        assert!(Instant::now() < deadline, "run did not finish in time");
        if done_rx.recv_timeout(Duration::from_millis(700)).is_ok() {
            break;
        }
        victim = (victim + 7) % cluster.workers.len();
        cluster.workers[victim].kill();
        cluster.workers.remove(victim);
        cluster.add_worker();
        kills += 1;
    }
    assert_eq!(kills, 5, "the run ended before 5 workers were killed; make the job slower");
    let seen = consumer.join().expect("consumer");
    let seqs: Vec<u64> = seen.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (0..total).collect::<Vec<_>>(), "every batch once, in order");
    for (seq, indices) in &seen {
        assert_eq!(indices, &plan.batch_indices(0, *seq), "batch {seq}");
    }
}
