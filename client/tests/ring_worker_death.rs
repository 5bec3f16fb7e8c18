//! SIGKILL of a worker process in the middle of a shared-memory run: the
//! ring the trainer owns stays mapped and valid, and the run either
//! completes (another worker produces the dead one's batches) or ends with an
//! error naming the worker, within a bounded time: no hang, no crash.
//!
//! Alone in its own test binary: it picks the worker to kill among this
//! process's children.
#![cfg(feature = "embedded")]

mod common;

use std::time::{Duration, Instant};

use loader_client::{Dtype, Loader, LoaderError, Transport, spec};
use loader_server::ServerConfig;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use common::{bounded, worker_command};

/// Pids of this process's children started as `loader-worker`.
fn worker_pids() -> Vec<i32> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // pid (comm) state ppid ...: comm may hold spaces, so cut at ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1));
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ppid == Some(me.as_str()) && String::from_utf8_lossy(&cmdline).contains("loader-worker")
        })
        .collect()
}

#[test]
fn killing_a_worker_mid_epoch_completes_or_names_it_in_bounded_time() {
    bounded(Duration::from_secs(120), || {
        let ttl = Duration::from_secs(2);
        let config = ServerConfig {
            lease_ttl: ttl,
            heartbeat_interval: Duration::from_millis(500),
            ..ServerConfig::default()
        };
        // ~0.5 ms per sample: the epoch lasts long enough to die in.
        let job = spec::synthetic(4096, &[64], Dtype::U8)
            .batch_size(16)
            .cost_ns(500_000)
            .build()
            .expect("spec");
        let mut loader = Loader::local_builder(job, 2)
            .worker_command(worker_command())
            .server_config(config)
            .build()
            .expect("local");
        let total = loader.total_batches();
        let pids = worker_pids();
        assert_eq!(pids.len(), 2, "two worker processes: {pids:?}");

        let mut seqs = Vec::new();
        let mut kept = None;
        // Batches assigned before the session offered its ring come over
        // gRPC; kill once the ring is in use.
        while kept.is_none() || seqs.len() < 24 {
            let batch = loader
                .next()
                .expect("an item")
                .expect("a batch before the kill");
            seqs.push(batch.seq());
            if batch.transport() == Transport::SharedMemory && kept.is_none() {
                kept = Some(batch);
            }
        }
        let Some(kept) = kept else {
            unreachable!("the loop ends with a ring batch")
        };
        let victim = pids[0];
        kill(Pid::from_raw(victim), Signal::SIGKILL).expect("kill");
        let killed = Instant::now();

        let mut ended = None;
        for item in &mut loader {
            match item {
                Ok(b) => seqs.push(b.seq()),
                Err(e) => {
                    ended = Some(e);
                    break;
                }
            }
        }
        let took = killed.elapsed();
        match &ended {
            None => eprintln!("killed worker {victim}: the run completed {took:?} later"),
            Some(e) => eprintln!("killed worker {victim}: the run ended {took:?} later with: {e}"),
        }
        match ended {
            None => {
                assert_eq!(
                    seqs,
                    (0..total).collect::<Vec<_>>(),
                    "every batch exactly once, in order"
                );
            }
            Some(e @ LoaderError::WorkerDisconnected { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(&format!(
                        "(pid {victim}) disconnected from the shared-memory ring"
                    )),
                    "{msg}"
                );
                assert!(msg.starts_with("worker http://127.0.0.1:"), "{msg}");
                assert!(loader.next().is_none(), "the iterator ends after the error");
            }
            Some(other) => panic!("unexpected error after killing worker {victim}: {other}"),
        }
        // Bounded: the lease requeue or the gap bound (2 x TTL), plus slack.
        assert!(
            took < Duration::from_secs(30),
            "took {took:?} after the kill"
        );
        // The trainer owns the ring: a batch viewed before the kill is intact.
        let labels: Vec<i64> = kept
            .tensor("label")
            .expect("label")
            .to_vec()
            .expect("int64");
        assert_eq!(
            labels.iter().map(|&l| l as u64).collect::<Vec<_>>(),
            kept.indices()
        );
        let data = kept.tensor("data").expect("data");
        assert_eq!(data.bytes.len(), kept.len() * 64);
        drop(loader);
        drop(kept);
    });
}
