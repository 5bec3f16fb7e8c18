//! Resuming on another world size against real worker processes: a job run
//! by W ranks, stopped mid-epoch or at an epoch boundary, and continued by
//! W' ranks (another worker count, sometimes another coordinator, and for
//! 8 -> 1 embedded mode) that all load the same saved state. Over the whole
//! run every sample of each epoch is delivered once (plus DistributedSampler's
//! padding, or less its truncation), and with `batch_size x world_size` kept
//! every global batch after the resume is the one the uninterrupted run
//! would have had.
#![cfg(feature = "embedded")]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use loader_client::{DEFAULT_SLOT_SIZE, Dtype, JobSpec, Loader, LoaderBuilder, LoaderState, spec};
use loader_server::ServerConfig;

use common::{WorkerProcesses, bounded};

const N: u64 = 250;

fn job(name: &str, world: u32, batch: u32, drop_last: bool) -> JobSpec {
    let mut builder = spec::synthetic(N, &[4], Dtype::U8)
        .batch_size(batch)
        .epochs(2)
        .consumers(world)
        .shuffle(23)
        .name(name);
    if drop_last {
        builder = builder.drop_last(true);
    }
    builder.build().expect("spec")
}

fn build(builder: LoaderBuilder) -> Loader {
    builder.prefetch(2).ring(8, DEFAULT_SLOT_SIZE).build().expect("loader")
}

/// Every batch a rank yielded: (epoch, seq, indices), checking each
/// batch's labels against its indices.
fn take(loader: &mut Loader, n: u64) -> Vec<(u32, u64, Vec<u64>)> {
    let mut seen = Vec::new();
    while (seen.len() as u64) < n {
        let Some(batch) = loader.next() else { break };
        let batch = batch.expect("batch");
        let labels: Vec<i64> = batch.tensor("label").expect("label").to_vec().expect("i64");
        let labels: Vec<u64> = labels.iter().map(|&l| l as u64).collect();
        assert_eq!(labels, batch.indices(), "labels are the sample indices");
        seen.push((batch.epoch(), batch.seq(), batch.indices().to_vec()));
    }
    seen
}

/// One case: `w` ranks of `b` stop after `steps` batches each (`ahead`
/// more for rank 1, then merged), and `w2` ranks of `b2` continue.
#[derive(Clone, Copy)]
struct Case {
    w: u32,
    b: u32,
    w2: u32,
    b2: u32,
    drop_last: bool,
    steps: u64,
    /// Rank 1 saved this many batches later than the others: the states
    /// are merged.
    ahead: u64,
    /// Rank 0 saved with one batch yielded out of order: it took
    /// `steps + 2` batches, but its state (as an out-of-order loader's would)
    /// says batch `steps` was not yielded and `steps + 1` was.
    out_of_order: bool,
    /// Resume on the same coordinator (which replaces the named job), or a
    /// fresh one with another worker count.
    same_coordinator: bool,
}

fn run(case: &Case, name: &str) {
    let Case { w, b, w2, b2, drop_last, steps, ahead, out_of_order, same_coordinator } = *case;
    let label = format!("{w}x{b} -> {w2}x{b2} drop_last={drop_last} steps={steps} ahead={ahead}");
    let a = common::Coordinator::start(ServerConfig::default());
    let _a_workers = WorkerProcesses::start(&a.url, 2);
    let spec = job(name, w, b, drop_last);
    let plan = loader_client::spec::validate(&spec).expect("plan");

    // The interrupted run: each rank takes its batches and saves its state.
    let mut delivered: Vec<(u32, Vec<u64>)> = Vec::new();
    let mut old_by_seq: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut states = Vec::new();
    for rank in 0..w {
        let mut loader = build(Loader::builder(&a.url).job(spec.clone()).rank(rank).world_size(w));
        let skipped = (out_of_order && rank == 0).then_some(steps);
        let mine = steps + if rank == 1 { ahead } else { 0 } + if skipped.is_some() { 2 } else { 0 };
        for (epoch, seq, indices) in take(&mut loader, mine) {
            if skipped == Some(seq) {
                continue;
            }
            old_by_seq.entry(seq).or_default().extend(&indices);
            delivered.push((epoch, indices));
        }
        let mut state = loader.state();
        if let Some(seq) = skipped {
            let mut json: serde_json::Value = serde_json::from_str(&state.to_json()).expect("json");
            json["next_seq"] = seq.into();
            json["yielded_above"] = serde_json::json!([seq + 1]);
            state = LoaderState::from_json(&json.to_string()).expect("an out-of-order state");
        }
        states.push(state);
    }
    let state = if ahead > 0 || out_of_order {
        let merged = LoaderState::merge(&states).expect("merge");
        LoaderState::from_json(&merged.to_json()).expect("merged state round trip")
    } else {
        // Every new rank loads rank 0's state, as saved in a checkpoint.
        LoaderState::from_json(&states[0].to_json()).expect("round trip")
    };

    // The resumed run, on W' ranks that all load the same state.
    let b_coordinator;
    let _b_workers;
    let url = if same_coordinator {
        a.url.clone()
    } else {
        b_coordinator = common::Coordinator::start(ServerConfig::default());
        _b_workers = WorkerProcesses::start(&b_coordinator.url, 3);
        b_coordinator.url.clone()
    };
    let mut new_by_seq: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut counts = Vec::new();
    let mut new_plan = None;
    for rank in 0..w2 {
        let builder = Loader::builder(&url).resume(state.clone()).rank(rank).world_size(w2).resume_batch_size(b2);
        let mut loader = build(builder);
        let rest = take(&mut loader, u64::MAX);
        assert!(loader.next().is_none(), "{label}: rank {rank} ends after its last batch");
        counts.push(rest.iter().map(|(_, _, i)| i.len()).sum::<usize>());
        for (epoch, seq, indices) in rest {
            new_by_seq.entry(seq).or_default().extend(&indices);
            delivered.push((epoch, indices));
        }
        new_plan = Some(loader_client::spec::validate(&loader.state().spec().expect("spec")).expect("plan"));
    }
    let new_plan = new_plan.expect("a new rank");
    assert!(counts.windows(2).all(|c| c[0] == c[1]), "{label}: every rank gets as many samples: {counts:?}");

    // Exactly once per epoch: every sample (or, with drop_last, all but a
    // truncated tail), duplicates only DistributedSampler's padding.
    for epoch in 0..2u32 {
        let mut got: Vec<u64> = delivered.iter().filter(|(e, _)| *e == epoch).flat_map(|(_, i)| i.iter().copied()).collect();
        got.sort_unstable();
        let total = got.len();
        got.dedup();
        let padding = |p: &loader_job::sampler::Plan, ranks: u32, seqs: &dyn Fn(u32, u64) -> bool| -> usize {
            let mut n = 0;
            for rank in 0..ranks {
                for seq in p.first_seq()..p.total_batches() {
                    let (e, batch) = p.locate(seq);
                    if e != epoch || !seqs(rank, seq) {
                        continue;
                    }
                    n += p.batch_positions(e, batch).filter(|&pos| p.epoch_position(e, rank, pos).1).count();
                }
            }
            n
        };
        let old_padding = padding(&plan, w, &|rank, seq| {
            let mine = steps + if rank == 1 { ahead } else { 0 };
            seq < mine || (out_of_order && rank == 0 && seq == steps + 1)
        });
        let new_padding = padding(&new_plan, w2, &|_, _| true);
        assert_eq!(total - got.len(), old_padding + new_padding, "{label}: epoch {epoch}: repeats beyond the padding");
        if drop_last {
            let slack = (b + 1) * w + (b2 + 1) * w2;
            assert!(got.len() as u64 + u64::from(slack) >= N, "{label}: epoch {epoch}: only {} of {N}", got.len());
        } else {
            assert_eq!(got, (0..N).collect::<Vec<_>>(), "{label}: epoch {epoch} not delivered whole");
        }
    }

    // With the global batch size kept, the global batches after the resume
    // are the uninterrupted run's (but the padding of an epoch's last one,
    // which fills the ranks up and so follows the world size).
    if b * w == b2 * w2 && ahead == 0 && !out_of_order {
        // The same global batch size cuts the epochs into as many batches:
        // the resumed ranks' sequence numbers are the old ones.
        assert_eq!(new_by_seq.keys().next(), Some(&steps), "{label}: resumed at the old step");
        for (&seq, new) in &new_by_seq {
            let last_of_epoch = plan.locate(seq).1 + 1 == plan.batches_per_epoch();
            if !drop_last && last_of_epoch {
                continue;
            }
            let mut old: Vec<u64> = (0..w).flat_map(|r| plan.batch_indices(r, seq)).collect();
            let mut new = new.clone();
            old.sort_unstable();
            new.sort_unstable();
            assert_eq!(new, old, "{label}: global batch {seq}");
        }
        assert!(!old_by_seq.is_empty() || steps == 0);
    }
}

#[test]
fn resumes_on_fewer_and_more_ranks_deliver_every_sample_once() {
    common::init_tracing();
    let cases = [
        // 4 -> 2 mid-epoch, global batch kept, on the same coordinator
        // (which replaces the named job by its resumed plan).
        Case { w: 4, b: 6, w2: 2, b2: 12, drop_last: false, steps: 5, ahead: 0, out_of_order: false, same_coordinator: true },
        // 2 -> 3 exactly at the epoch boundary, drop_last, another global
        // batch size, a fresh coordinator with 3 workers.
        Case { w: 2, b: 8, w2: 3, b2: 8, drop_last: true, steps: 15, ahead: 0, out_of_order: false, same_coordinator: false },
        // 3 -> 5 mid-way through the second epoch, global batch kept.
        Case { w: 3, b: 5, w2: 5, b2: 3, drop_last: false, steps: 24, ahead: 0, out_of_order: false, same_coordinator: false },
        // 2 -> 3 with drop_last, mid-epoch, rank 1 two steps ahead and
        // rank 0 with a batch out of order: merged.
        Case { w: 2, b: 8, w2: 3, b2: 5, drop_last: true, steps: 4, ahead: 2, out_of_order: true, same_coordinator: true },
        // 4 -> 3 without drop_last, the same mix, on a fresh coordinator.
        Case { w: 4, b: 4, w2: 3, b2: 6, drop_last: false, steps: 7, ahead: 3, out_of_order: true, same_coordinator: false },
    ];
    for (i, case) in cases.iter().enumerate() {
        let name = format!("elastic-{i}");
        let case = *case;
        bounded(Duration::from_secs(60), move || run(&case, &name));
    }
}

#[test]
fn eight_ranks_resume_on_one_in_embedded_mode() {
    common::init_tracing();
    bounded(Duration::from_secs(60), || {
        for drop_last in [true, false] {
            let a = common::Coordinator::start(ServerConfig::default());
            let _workers = WorkerProcesses::start(&a.url, 2);
            let spec = job("eight", 8, 2, drop_last);
            let plan = loader_client::spec::validate(&spec).expect("plan");
            let steps = 9;
            let mut delivered: Vec<(u32, Vec<u64>)> = Vec::new();
            let mut state = None;
            for rank in 0..8 {
                let mut loader = build(Loader::builder(&a.url).job(spec.clone()).rank(rank).world_size(8));
                delivered.extend(take(&mut loader, steps).into_iter().map(|(e, _, i)| (e, i)));
                state.get_or_insert(loader.state());
            }
            let state = state.expect("a state");
            // One rank of 16 keeps the global batch: embedded mode, 2 workers.
            let mut one = Loader::local_builder(job("unused", 1, 1, drop_last), 2)
                .worker_command(common::worker_command())
                .resume(state)
                .resume_batch_size(16)
                .build()
                .expect("embedded resume");
            let rest = take(&mut one, u64::MAX);
            assert_eq!(rest.first().map(|r| r.1), Some(steps), "the same global batch size keeps the step");
            for (_, seq, indices) in &rest {
                let seq = *seq;
                if !drop_last && plan.locate(seq).1 + 1 == plan.batches_per_epoch() {
                    continue;
                }
                let mut old: Vec<u64> = (0..8).flat_map(|r| plan.batch_indices(r, seq)).collect();
                let mut new = indices.clone();
                old.sort_unstable();
                new.sort_unstable();
                assert_eq!(new, old, "drop_last={drop_last}: global batch {seq}");
            }
            delivered.extend(rest.into_iter().map(|(e, _, i)| (e, i)));
            for epoch in 0..2u32 {
                let mut got: Vec<u64> = delivered.iter().filter(|(e, _)| *e == epoch).flat_map(|(_, i)| i.iter().copied()).collect();
                got.sort_unstable();
                let total = got.len();
                got.dedup();
                if drop_last {
                    assert_eq!(total, got.len(), "epoch {epoch}: a sample twice");
                    assert!(got.len() as u64 + 16 + 8 * 3 >= N, "epoch {epoch}: {} of {N}", got.len());
                } else {
                    assert_eq!(got, (0..N).collect::<Vec<_>>(), "epoch {epoch} whole");
                }
            }
        }
    });
}
