//! Exact continuation against real worker processes: a loader resumed from
//! a saved `LoaderState` (on the same deployment, and on a fresh one with
//! another number of workers), and a loader whose coordinator is killed and
//! restarted on the same address and journal mid-job. In every case the
//! batches the trainer sees are exactly those of one uninterrupted run: same
//! sequence numbers, same sample indices, none lost, none twice.
#![cfg(feature = "embedded")]

mod common;

use std::time::Duration;

use loader_client::{DEFAULT_SLOT_SIZE, Dtype, JobSpec, Loader, LoaderBuilder, LoaderState, spec};
use loader_server::ServerConfig;

use common::{RestartableCoordinator, WorkerProcesses, bounded};

/// What identifies a yielded batch: (seq, epoch, sample indices).
type Seen = (u64, u32, Vec<u64>);

fn job(name: &str, consumers: u32) -> JobSpec {
    spec::synthetic(300, &[4], Dtype::U8)
        .batch_size(8)
        .epochs(2)
        .consumers(consumers)
        .shuffle(11)
        .name(name)
        .build()
        .expect("spec")
}

/// Takes up to `n` batches, checking each one's labels against its indices.
fn take(loader: &mut Loader, n: usize) -> Vec<Seen> {
    let mut seen = Vec::new();
    for _ in 0..n {
        let Some(batch) = loader.next() else { break };
        let batch = batch.expect("batch");
        let labels: Vec<i64> = batch.tensor("label").expect("label").to_vec().expect("i64");
        let labels: Vec<u64> = labels.iter().map(|&l| l as u64).collect();
        assert_eq!(labels, batch.indices(), "labels are the sample indices");
        seen.push((batch.seq(), batch.epoch(), batch.indices().to_vec()));
    }
    seen
}

/// A small prefetch window, so batches are in flight at every interruption.
/// The ring gets a slot for every credit of three workers: an idle worker
/// keeps the slots it was granted, and with fewer slots the one worker still
/// producing can be left with none (see the report on `ring::book`).
fn build(builder: LoaderBuilder) -> Loader {
    builder
        .prefetch(2)
        .ring(8, DEFAULT_SLOT_SIZE)
        .build()
        .expect("loader")
}

#[test]
fn a_resumed_loader_yields_exactly_the_rest_of_an_uninterrupted_run() {
    common::init_tracing();
    bounded(Duration::from_secs(40), || {
        const K: usize = 11;
        let a = common::Coordinator::start(ServerConfig::default());
        let _a_workers = WorkerProcesses::start(&a.url, 2);
        let rank = 1;

        // The reference: one uninterrupted run of rank 1 of 2 (the name
        // plays no part in which samples a batch holds).
        let mut whole = build(Loader::builder(&a.url).job(job("reference", 2)).rank(rank));
        let total = whole.total_batches();
        let reference = take(&mut whole, usize::MAX);
        drop(whole);
        assert_eq!(reference.len() as u64, total);
        let seqs: Vec<u64> = reference.iter().map(|s| s.0).collect();
        assert_eq!(seqs, (0..total).collect::<Vec<_>>());

        // K batches, then the state, then the loader goes away (with batches
        // prefetched and never yielded).
        let mut first = build(Loader::builder(&a.url).job(job("resumed", 2)).rank(rank));
        assert_eq!(take(&mut first, K), reference[..K]);
        let state = first.state();
        drop(first);
        assert_eq!(
            (state.next_seq(), state.rank(), state.world_size()),
            (K as u64, 1, 2)
        );
        let state = LoaderState::from_json(&state.to_json()).expect("round trip");

        // The same deployment: attaches to the job and repositions rank 1.
        let mut again = build(Loader::builder(&a.url).resume(state.clone()));
        assert_eq!(again.yielded(), K as u64);
        assert_eq!(take(&mut again, usize::MAX), reference[K..]);
        assert_eq!(again.state().next_seq(), total);
        drop(again);

        // A fresh coordinator with three workers, which never saw the job.
        let b = common::Coordinator::start(ServerConfig::default());
        let _b_workers = WorkerProcesses::start(&b.url, 3);
        let mut elsewhere = build(Loader::builder(&b.url).resume(state));
        assert_eq!(take(&mut elsewhere, usize::MAX), reference[K..]);
    });
}

/// With its journal, the restarted coordinator knows the job and continues
/// from the journaled watermark; without one, it has forgotten the job, and
/// the trainer creates it again and resumes at what it has yielded.
#[test]
fn a_loader_survives_a_coordinator_restart_with_the_exact_sequence() {
    common::init_tracing();
    let cases = [(true, false), (true, true), (false, false)];
    for (journal, shared_memory) in cases {
        bounded(Duration::from_secs(60), move || {
            let dir = tempfile::tempdir().expect("tempdir");
            let config = ServerConfig {
                // Long enough that the workers keep their leases through the
                // outage; short heartbeats so the trainer notices it quickly.
                lease_ttl: Duration::from_secs(15),
                heartbeat_interval: Duration::from_millis(200),
                state_dir: journal.then(|| dir.path().to_owned()),
                ..ServerConfig::default()
            };
            let mut coordinator = RestartableCoordinator::start(config);
            let _workers = WorkerProcesses::start(&coordinator.url, 2);
            let spec = job("survives-restarts", 1);
            let plan = loader_job::spec::plan(&spec).expect("plan");
            let mut loader = build(
                Loader::builder(&coordinator.url)
                    .job(spec)
                    .shared_memory(shared_memory),
            );
            let total = loader.total_batches();
            let mut seen = take(&mut loader, 9);
            // Killed between two next() calls, with batches in flight; the
            // trainer's heartbeats and polls fail for a while.
            coordinator.kill();
            std::thread::sleep(Duration::from_millis(600));
            coordinator.restart();
            seen.extend(take(&mut loader, 20));
            // And once more, with the job further along.
            coordinator.kill();
            coordinator.restart();
            seen.extend(take(&mut loader, usize::MAX));
            assert!(
                loader.next().is_none(),
                "the iterator ends after the last batch"
            );
            let expected: Vec<Seen> = (0..total)
                .map(|seq| {
                    let epoch = (seq / plan.batches_per_epoch()) as u32;
                    (seq, epoch, plan.batch_indices(0, seq))
                })
                .collect();
            let case = format!("journal={journal} shared_memory={shared_memory}");
            assert_eq!(seen.len(), expected.len(), "{case}");
            assert_eq!(seen, expected, "{case}");
        });
    }
}
