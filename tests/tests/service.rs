//! The whole service, end to end: a real `loader-server`, real
//! `loader-worker` processes, and trainers using the Rust SDK.

use std::collections::HashMap;
use std::time::Duration;

use loader_client::{Batch, Dtype, JobSpec, Loader, spec};
use loader_e2e::{Cluster, run};

const N: u64 = 10_007;
const WORLD: u32 = 2;
const EPOCHS: u32 = 2;

/// What a consumer saw: (epoch, seq, sample indices) per batch, in order.
type Seen = Vec<(u32, u64, Vec<u64>)>;

fn synthetic_job() -> JobSpec {
    spec::synthetic(N, &[3, 4, 4], Dtype::U8)
        .name("e2e")
        .batch_size(64)
        .epochs(EPOCHS)
        .consumers(WORLD)
        .shuffle(1234)
        .drop_last(false)
        .build()
        .expect("valid spec")
}

/// Checks that a synthetic batch holds what the dataset defines for each of
/// its indices, so a batch cannot carry one sample's header and another's bytes.
fn check_synthetic_contents(batch: &Batch) {
    let data = batch.tensor("data").expect("data tensor");
    assert_eq!(data.shape, vec![batch.len() as u64, 3, 4, 4]);
    check_synthetic_contents_shape(batch, 3 * 4 * 4);
}

/// Runs `WORLD` consumers of the job against `cluster`, each on its own thread.
fn consume_all(cluster: &Cluster, job: &JobSpec) -> Vec<Seen> {
    let handles: Vec<_> = (0..WORLD)
        .map(|rank| {
            let url = cluster.url();
            let job = job.clone();
            std::thread::spawn(move || {
                let loader = Loader::builder(url).job(job).rank(rank).world_size(WORLD).build().expect("loader");
                let mut seen = Seen::new();
                for batch in loader {
                    let batch = batch.expect("batch");
                    check_synthetic_contents(&batch);
                    seen.push((batch.epoch(), batch.seq(), batch.indices().to_vec()));
                }
                seen
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("consumer thread")).collect()
}

#[test]
fn every_rank_gets_its_distributed_sampler_share_exactly_once_in_order() {
    let (three, one) = run(Duration::from_secs(240), |scope| {
        let job = synthetic_job();
        let three = {
            let cluster = Cluster::start(&scope, 3);
            consume_all(&cluster, &job)
        };
        let one = {
            let cluster = Cluster::start(&scope, 1);
            consume_all(&cluster, &job)
        };
        (three, one)
    });

    // Every rank gets the same number of batches: ceil(ceil(N/W)/B) per epoch.
    let per_rank = N.div_ceil(u64::from(WORLD));
    let per_epoch = per_rank.div_ceil(64);
    for seen in &three {
        assert_eq!(seen.len() as u64, per_epoch * u64::from(EPOCHS));
        // In order, each sequence number exactly once.
        let seqs: Vec<u64> = seen.iter().map(|(_, s, _)| *s).collect();
        assert_eq!(seqs, (0..per_epoch * u64::from(EPOCHS)).collect::<Vec<_>>());
    }

    for epoch in 0..EPOCHS {
        let mut count: HashMap<u64, u32> = HashMap::new();
        for seen in &three {
            for (_, _, indices) in seen.iter().filter(|(e, _, _)| *e == epoch) {
                for &i in indices {
                    *count.entry(i).or_default() += 1;
                }
            }
        }
        // The union is exactly [0, N) ...
        assert_eq!(count.len() as u64, N, "epoch {epoch}: distinct indices");
        assert!(count.keys().all(|&i| i < N));
        // ... plus DistributedSampler's padding: per_rank * W - N repeats.
        let total: u32 = count.values().sum();
        assert_eq!(u64::from(total), per_rank * u64::from(WORLD), "epoch {epoch}: samples incl. padding");
        let repeated = count.values().filter(|&&c| c > 1).count() as u64;
        assert_eq!(repeated, per_rank * u64::from(WORLD) - N);
    }

    // A new permutation each epoch.
    for seen in &three {
        let order = |e: u32| -> Vec<u64> {
            seen.iter().filter(|(ep, _, _)| *ep == e).flat_map(|(_, _, i)| i.clone()).collect()
        };
        assert_ne!(order(0), order(1), "epoch 2 repeats epoch 1's order");
    }

    // The same seed gives the same sequence with 1 worker as with 3.
    assert_eq!(three, one);
}

#[test]
fn token_windows_arrive_byte_for_byte() {
    const TOKENS: usize = 50_000;
    const CTX: u64 = 127;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tokens.bin");
    let mut x: u32 = 12345;
    let file: Vec<u8> = (0..TOKENS)
        .flat_map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            ((x >> 8) as u16).to_le_bytes()
        })
        .collect();
    std::fs::write(&path, &file).expect("write token file");
    let job = spec::tokens(&path, Dtype::U16, CTX).batch_size(16).shuffle(5).build().expect("tokens spec");

    let windows = run(Duration::from_secs(120), move |scope| {
        let cluster = Cluster::start(&scope, 2);
        let loader = Loader::builder(cluster.url()).job(job).build().expect("loader");
        let mut windows = Vec::new();
        for batch in loader {
            let batch = batch.expect("batch");
            let tokens = batch.tensor("tokens").expect("tokens tensor");
            assert_eq!(tokens.dtype, Dtype::U16);
            assert_eq!(tokens.shape, vec![batch.len() as u64, CTX + 1]);
            let row = (CTX as usize + 1) * 2;
            for (i, &index) in batch.indices().iter().enumerate() {
                windows.push((index, tokens.bytes[i * row..(i + 1) * row].to_vec()));
            }
        }
        drop(cluster);
        windows
    });

    let expected_windows = (TOKENS as u64 - 1) / CTX;
    assert_eq!(windows.len() as u64, expected_windows);
    let mut indices: Vec<u64> = windows.iter().map(|(i, _)| *i).collect();
    indices.sort_unstable();
    assert_eq!(indices, (0..expected_windows).collect::<Vec<_>>());
    for (index, bytes) in &windows {
        let start = (*index * CTX) as usize * 2;
        assert_eq!(bytes[..], file[start..start + (CTX as usize + 1) * 2], "window {index}");
    }
}

#[test]
fn one_consumer_fed_by_a_local_and_a_remote_worker_gets_the_exact_sequence() {
    let job = spec::synthetic(4_000, &[3, 8, 8], Dtype::U8)
        .batch_size(32)
        .epochs(2)
        .shuffle(77)
        // Slow enough that both workers get a share.
        .cost_ns(50_000)
        .build()
        .expect("spec");
    let plan = loader_job::spec::plan(&job).expect("plan");
    let (seen, transports) = run(Duration::from_secs(120), move |scope| {
        let mut cluster = Cluster::start(&scope, 1);
        // Another node identity: the coordinator routes this worker's
        // batches over gRPC, the local one's through the trainer's ring.
        cluster.add_worker_with(&["--node", "remote-node-for-test"]);
        cluster.wait_for_workers(2);
        let loader = Loader::builder(cluster.url()).job(job).build().expect("loader");
        let mut seen = Vec::new();
        let mut transports = HashMap::new();
        for batch in loader {
            let batch = batch.expect("batch");
            check_synthetic_contents_shape(&batch, 3 * 8 * 8);
            *transports.entry(format!("{:?}", batch.transport())).or_insert(0u64) += 1;
            seen.push((batch.seq(), batch.indices().to_vec()));
        }
        (seen, transports)
    });
    let seqs: Vec<u64> = seen.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (0..plan.total_batches()).collect::<Vec<_>>());
    for (seq, indices) in &seen {
        assert_eq!(indices, &plan.batch_indices(0, *seq), "batch {seq}");
    }
    assert_eq!(transports.len(), 2, "both transports fed the consumer: {transports:?}");
}

/// Label and data of every sample match its index (any sample shape).
fn check_synthetic_contents_shape(batch: &Batch, row: usize) {
    let labels: Vec<i64> = batch.tensor("label").expect("label tensor").to_vec().expect("int64 labels");
    let data = batch.tensor("data").expect("data tensor");
    for (i, &index) in batch.indices().iter().enumerate() {
        assert_eq!(labels[i], index as i64);
        let bytes = &data.bytes[i * row..(i + 1) * row];
        assert_eq!(bytes[..8], index.to_le_bytes());
        assert!(bytes[8..].iter().all(|&b| b == (index % 251) as u8));
    }
}
