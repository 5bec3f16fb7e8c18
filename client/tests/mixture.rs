//! Weighted mixtures against real worker processes: three token
//! files of 1,000 / 10,000 / 100,000 windows mixed 0.2 / 0.3 / 0.5 over
//! several passes of the small one. Each window's first token says which
//! file and which window it is, so every batch is checked against the
//! stream the pure function names, and the proportions and passes are
//! read off what the trainer got.
#![cfg(feature = "embedded")]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use loader_client::{DEFAULT_SLOT_SIZE, Dtype, JobSpec, Loader, LoaderBuilder, LoaderState, spec};
use loader_job::mixture::MixPlan;
use loader_server::ServerConfig;

use common::{WorkerProcesses, bounded};

const SIZES: [u64; 3] = [1_000, 10_000, 100_000];
const WEIGHTS: [f64; 3] = [0.2, 0.3, 0.5];
/// First token of source k's windows: k x this + the window's index.
const SOURCE_BASE: u32 = 1_000_000;
/// Positions per epoch: the small source runs through 4 passes in 2 epochs.
const EPOCH: u64 = 10_000;

/// A token file whose window i (context 1: tokens i, i + 1) starts with
/// `base + i`.
fn token_file(dir: &Path, k: usize, windows: u64) -> std::path::PathBuf {
    let path = dir.join(format!("source{k}.bin"));
    let base = SOURCE_BASE * k as u32;
    let bytes: Vec<u8> = (0..=windows as u32)
        .flat_map(|i| (base + i).to_le_bytes())
        .collect();
    std::fs::write(&path, bytes).expect("write tokens");
    path
}

fn job(dir: &Path, name: &str, batch: u32, world: u32, weights: [f64; 3]) -> JobSpec {
    let sources = (0..3).map(|k| {
        let path = token_file(dir, k, SIZES[k]);
        (
            format!("s{k}"),
            weights[k],
            spec::tokens(path, Dtype::U32, 1),
        )
    });
    spec::mix(sources)
        .samples_per_epoch(EPOCH)
        .source_field("source")
        .batch_size(batch)
        .epochs(2)
        .consumers(world)
        .shuffle(7)
        .name(name)
        .build()
        .expect("spec")
}

fn build(builder: LoaderBuilder) -> Loader {
    builder
        .prefetch(2)
        .ring(8, DEFAULT_SLOT_SIZE)
        .build()
        .expect("loader")
}

/// One delivered sample: (epoch, position in the epoch) -> (source, index).
type Samples = BTreeMap<(u32, u64), (usize, u64)>;

/// Takes up to `n` batches, checking each sample's bytes against its
/// source field; returns the samples and each batch's (seq, positions).
fn take(loader: &mut Loader, n: u64, samples: &mut Samples) -> Vec<(u64, Vec<u64>)> {
    let mut batches = Vec::new();
    while (batches.len() as u64) < n {
        let Some(batch) = loader.next() else { break };
        let batch = batch.expect("batch");
        let tokens: Vec<u32> = batch
            .tensor("tokens")
            .expect("tokens")
            .to_vec()
            .expect("u32");
        let sources: Vec<i64> = batch
            .tensor("source")
            .expect("source")
            .to_vec()
            .expect("i64");
        for (i, &position) in batch.indices().iter().enumerate() {
            let first = tokens[2 * i];
            let (k, index) = (
                (first / SOURCE_BASE) as usize,
                u64::from(first % SOURCE_BASE),
            );
            assert_eq!(tokens[2 * i + 1], first + 1, "a whole window");
            assert_eq!(
                sources[i], k as i64,
                "the source field names the window's file"
            );
            samples.insert((batch.epoch(), position), (k, index));
        }
        batches.push((batch.seq(), batch.indices().to_vec()));
    }
    batches
}

/// The stream the spec names: what every position must have drawn.
fn expected(spec: &JobSpec) -> MixPlan {
    loader_job::spec::mix_plan(spec)
        .expect("plan")
        .expect("a mixture")
}

/// The whole run's samples in stream order.
fn stream(samples: &Samples) -> Vec<(usize, u64)> {
    assert_eq!(
        samples.len() as u64,
        2 * EPOCH,
        "every position of both epochs, once"
    );
    samples.values().copied().collect()
}

/// Every whole block of `blocks`: each source within one sample of its
/// share under `weights`.
fn check_blocks(
    stream: &[(usize, u64)],
    block: u64,
    weights: [f64; 3],
    blocks: std::ops::Range<usize>,
) {
    for (b, chunk) in stream.chunks(block as usize).enumerate() {
        if !blocks.contains(&b) || chunk.len() as u64 != block {
            continue;
        }
        for (k, w) in weights.iter().enumerate() {
            let got = chunk.iter().filter(|d| d.0 == k).count() as f64;
            let target = w * block as f64;
            assert!(
                (got - target).abs() < 1.0 + 1e-9,
                "block {b}: source {k} drew {got}, target {target}"
            );
        }
    }
}

/// Each source's samples once per its own pass: at every block boundary,
/// no sample of a source has been drawn twice more than another (within a
/// block the order is shuffled, so passes are checked at its edges).
/// Returns the draws of each source.
fn check_passes(stream: &[(usize, u64)], block: u64) -> [usize; 3] {
    let mut draws = [0usize; 3];
    for k in 0..3 {
        let n = SIZES[k] as usize;
        let mut counts = vec![0u32; n];
        let mut at_count: BTreeMap<u32, usize> = BTreeMap::from([(0, n)]);
        for (i, &(source, index)) in stream.iter().enumerate() {
            if source == k {
                let c = &mut counts[index as usize];
                let left = at_count.get_mut(c).expect("count");
                *left -= 1;
                if *left == 0 {
                    at_count.remove(c);
                }
                *c += 1;
                *at_count.entry(*c).or_default() += 1;
                draws[k] += 1;
            }
            if ((i + 1) as u64).is_multiple_of(block) {
                let lo = *at_count.keys().next().expect("counts");
                let hi = *at_count.keys().last().expect("counts");
                assert!(
                    hi - lo <= 1,
                    "source {k} after {} positions: samples drawn {lo} to {hi} times",
                    i + 1
                );
            }
        }
    }
    draws
}

/// Stratification and passes of a whole run under one set of weights.
fn check_stream(samples: &Samples, block: u64) {
    let stream = stream(samples);
    check_blocks(&stream, block, WEIGHTS, 0..usize::MAX);
    let draws = check_passes(&stream, block);
    assert!(
        draws[0] >= 3 * SIZES[0] as usize,
        "the small source ran through several passes ({draws:?})"
    );
}

#[test]
fn a_mixture_is_exact_per_batch_once_per_pass_and_the_same_on_one_and_three_workers() {
    bounded(Duration::from_secs(240), || {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut runs = Vec::new();
        for workers in [1usize, 3] {
            let coordinator = common::Coordinator::start(ServerConfig::default());
            let _workers = WorkerProcesses::start(&coordinator.url, workers);
            let spec = job(dir.path(), "mix", 64, 1, WEIGHTS);
            let plan = expected(&spec);
            let mut loader = build(Loader::builder(&coordinator.url).job(spec));
            let mut samples = Samples::new();
            let batches = take(&mut loader, u64::MAX, &mut samples);
            for (&(epoch, position), &(k, index)) in &samples {
                let d = plan.at(u64::from(epoch) * EPOCH + position);
                assert_eq!(
                    (d.source, d.index),
                    (k, index),
                    "position {position} of epoch {epoch} draws what the spec names"
                );
            }
            check_stream(&samples, 64);
            runs.push((batches, samples));
        }
        assert!(
            runs[0] == runs[1],
            "the same batches, sample for sample, on 1 and 3 workers"
        );
    });
}

#[test]
fn a_mixture_resumed_mid_epoch_on_another_world_size_finishes_the_uninterrupted_stream() {
    bounded(Duration::from_secs(240), || {
        let dir = tempfile::tempdir().expect("tempdir");
        let coordinator = common::Coordinator::start(ServerConfig::default());
        let _workers = WorkerProcesses::start(&coordinator.url, 2);
        // Two ranks of 32 (blocks of 64) stop 40 batches in; three ranks
        // of 16 finish the run from the merged state.
        let spec = job(dir.path(), "mix-resumed", 32, 2, WEIGHTS);
        let plan = expected(&spec);
        let mut samples = Samples::new();
        let mut states = Vec::new();
        for (rank, steps) in [(0u32, 40u64), (1, 41)] {
            let mut loader = build(
                Loader::builder(&coordinator.url)
                    .job(spec.clone())
                    .rank(rank)
                    .world_size(2),
            );
            take(&mut loader, steps, &mut samples);
            states.push(loader.state());
        }
        let state = LoaderState::from_json(&LoaderState::merge(&states).expect("merge").to_json())
            .expect("state");
        let b = common::Coordinator::start(ServerConfig::default());
        let _b_workers = WorkerProcesses::start(&b.url, 3);
        for rank in 0..3 {
            let builder = Loader::builder(&b.url)
                .resume(state.clone())
                .rank(rank)
                .world_size(3)
                .resume_batch_size(16);
            let mut loader = build(builder);
            take(&mut loader, u64::MAX, &mut samples);
        }
        // Every position once (a padded repeat lands on its own key), each
        // drawing what the uninterrupted run's spec names.
        for (&(epoch, position), &(k, index)) in &samples {
            let d = plan.at(u64::from(epoch) * EPOCH + position);
            assert_eq!(
                (d.source, d.index),
                (k, index),
                "position {position} of epoch {epoch}"
            );
        }
        check_stream(&samples, 64);
    });
}

#[test]
fn new_weights_at_a_resume_continue_every_source_where_it_stood() {
    bounded(Duration::from_secs(240), || {
        let dir = tempfile::tempdir().expect("tempdir");
        let coordinator = common::Coordinator::start(ServerConfig::default());
        let _workers = WorkerProcesses::start(&coordinator.url, 2);
        let spec = job(dir.path(), "mix-reweighted", 64, 1, WEIGHTS);
        let mut samples = Samples::new();
        let mut loader = build(Loader::builder(&coordinator.url).job(spec.clone()));
        take(&mut loader, 30, &mut samples);
        let state = loader.state();
        drop(loader);
        // Stage two of the curriculum: the small source off, the middle one
        // up.
        let new_weights = [0.0, 0.7, 0.3];
        let reweighted = job(dir.path(), "mix-reweighted", 64, 1, new_weights);
        let mut loader = build(
            Loader::builder(&coordinator.url)
                .job(reweighted)
                .resume(state),
        );
        let before = samples.len();
        take(&mut loader, u64::MAX, &mut samples);
        let stream = stream(&samples);
        // The old proportions up to the resume, the new ones from the first
        // block after it (one loader of 64: the block it stopped at).
        check_blocks(&stream, 64, WEIGHTS, 0..before / 64);
        check_blocks(&stream, 64, new_weights, before / 64..usize::MAX);
        // Nothing of a source repeats before its pass ends, across the
        // change: the walks went on where they stood.
        check_passes(&stream, 64);
    });
}
