//! What a worker's SIGKILL costs the trainer, by lease TTL: a measurement,
//! not a check (ignored by default; its table is in docs/reliability.md).
//!
//! ```text
//! cargo build --workspace --bins
//! cargo test -p loader-e2e --test stall -- --ignored --nocapture stall
//! ```

use std::time::{Duration, Instant};

use loader_client::{Dtype, JobSpec, Loader, Transport, spec};
use loader_e2e::{Cluster, Received, Trainer, assert_received, run};

/// Lease TTLs measured.
const TTLS_MS: [u64; 3] = [1000, 2000, 5000];
/// Workers of each run; one is killed.
const WORKERS: usize = 3;
/// Batches of each run, and the batch after which a worker is killed.
const BATCHES: u64 = 600;
const KILL_AFTER: u64 = 150;
/// Worker CPU per sample; 16 samples per batch.
const COST_US: u64 = 500;

fn job() -> JobSpec {
    spec::synthetic(BATCHES * 16, &[16], Dtype::U8)
        .batch_size(16)
        .shuffle(3)
        .cost_ns(COST_US * 1000)
        .build()
        .expect("spec")
}

/// What happens to the victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kill {
    /// Undisturbed run.
    None,
    /// SIGKILL, and a new worker started at once (what a Deployment or a
    /// supervisor does).
    Replaced,
    /// SIGKILL; the survivors must finish the job.
    Survivors,
}

/// One run on a fresh cluster; kills worker 0 after `KILL_AFTER` batches as
/// `kill` says. Returns the batches and when the run started, or why it
/// did not finish.
fn one_run(
    scope: &loader_e2e::Scope,
    ttl_ms: u64,
    shared_memory: bool,
    kill: Kill,
) -> Result<(Vec<Received>, Instant), String> {
    let mut cluster = Cluster::builder().workers(WORKERS).ttl_ms(ttl_ms).start(scope);
    let started = Instant::now();
    let trainer = Trainer::spawn(Loader::builder(cluster.url()).shared_memory(shared_memory), job());
    if kill != Kill::None {
        trainer.wait_for(KILL_AFTER, Duration::from_secs(60));
        cluster.workers[0].kill();
        if kill == Kill::Replaced {
            cluster.add_worker();
        }
    }
    // Four leases and the undisturbed run time, with room to spare.
    let seen = trainer.finish(Duration::from_millis(4 * ttl_ms) + Duration::from_secs(30))?;
    let plan = loader_job::spec::plan(&job()).expect("plan");
    assert_received(&seen, &plan, 0, 0..BATCHES);
    if shared_memory {
        assert!(seen.iter().any(|r| r.transport == Transport::SharedMemory), "the ring was used");
    }
    Ok((seen, started))
}

/// Longest gap between consecutive batches from batch `KILL_AFTER - 1` on
/// (the kill lands right after batch `KILL_AFTER` arrived).
fn longest_gap(seen: &[Received]) -> Duration {
    seen[KILL_AFTER as usize - 1..].windows(2).map(|w| w[1].at.duration_since(w[0].at)).max().unwrap_or_default()
}

/// Time from the start to the last batch.
fn run_time((seen, started): &(Vec<Received>, Instant)) -> Duration {
    seen.last().expect("batches").at.duration_since(*started)
}

#[test]
#[ignore = "a measurement for docs/reliability.md; run with --ignored stall"]
fn stall_after_worker_sigkill_by_ttl() {
    run(Duration::from_secs(900), |scope| {
        let mut rows = Vec::new();
        for shared_memory in [true, false] {
            for ttl_ms in TTLS_MS {
                let calm = one_run(&scope, ttl_ms, shared_memory, Kill::None).expect("undisturbed run");
                let mut row = format!(
                    "| {} | {:.0} | {:.2} | {:.2} |",
                    if shared_memory { "shm" } else { "grpc" },
                    ttl_ms as f64 / 1000.0,
                    run_time(&calm).as_secs_f64(),
                    longest_gap(&calm.0).as_secs_f64(),
                );
                for kill in [Kill::Replaced, Kill::Survivors] {
                    match one_run(&scope, ttl_ms, shared_memory, kill) {
                        Ok(hit) => {
                            row += &format!(
                                " {:.2} | {:+.2} |",
                                longest_gap(&hit.0).as_secs_f64(),
                                run_time(&hit).as_secs_f64() - run_time(&calm).as_secs_f64(),
                            )
                        }
                        Err(e) => {
                            eprintln!("{kill:?}, TTL {ttl_ms} ms: {e}");
                            row += " stuck | stuck |";
                        }
                    }
                }
                rows.push(row);
            }
        }
        println!(
            "\n{WORKERS} workers, {BATCHES} batches of 16 samples x {COST_US} us of worker CPU, worker 0 SIGKILLed after batch {KILL_AFTER}\n"
        );
        println!(
            "| transport | TTL (s) | run, undisturbed (s) | longest gap, undisturbed (s) | longest gap, kill + replacement (s) | run time added (s) | longest gap, survivors only (s) | run time added (s) |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
        for row in rows {
            println!("{row}");
        }
    });
}
