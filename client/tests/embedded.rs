//! The SDK against a real embedded deployment (in-process coordinator, worker
//! processes started from this package's `loaderctl __worker`): every batch
//! exactly once, in order or not, blocking and async. Each test is bounded in
//! time; dropping the loader stops the processes it started.
#![cfg(feature = "embedded")]

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::sync::mpsc;
use std::time::Duration;

use futures::StreamExt;
use loader_client::{Dtype, Loader, spec};

fn worker_command() -> Option<Vec<OsString>> {
    Some(vec![
        env!("CARGO_BIN_EXE_loaderctl").into(),
        "__worker".into(),
    ])
}

/// Runs `f` on a thread and fails the test if it takes longer than `limit`.
fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|e| panic!("test did not finish within {limit:?}: {e}"))
}

#[test]
fn in_order_every_batch_once_with_labels_matching_indices() {
    bounded(Duration::from_secs(60), || {
        let job = spec::synthetic(100, &[2, 3], Dtype::F32)
            .batch_size(8)
            .epochs(2)
            .shuffle(7)
            .build()
            .expect("spec");
        let loader = Loader::local_builder(job, 2)
            .worker_command(worker_command())
            .prefetch(2)
            .build()
            .expect("local");
        assert_eq!(loader.batches_per_epoch(), 13);
        assert_eq!(loader.total_batches(), 26);
        let mut seqs = Vec::new();
        let mut seen_epoch0 = BTreeSet::new();
        for batch in loader {
            let batch = batch.expect("batch");
            let labels: Vec<i64> = batch
                .tensor("label")
                .expect("label")
                .to_vec()
                .expect("int64");
            let as_u64: Vec<u64> = labels.iter().map(|&l| l as u64).collect();
            assert_eq!(as_u64, batch.indices());
            let data = batch.tensor("data").expect("data");
            assert_eq!(data.dtype, Dtype::F32);
            assert_eq!(data.shape, &[batch.len() as u64, 2, 3]);
            assert_eq!(batch.index_in_epoch(), batch.seq() % 13);
            if batch.epoch() == 0 {
                seen_epoch0.extend(batch.indices().iter().copied());
            }
            seqs.push(batch.seq());
        }
        assert_eq!(seqs, (0..26).collect::<Vec<_>>());
        assert_eq!(seen_epoch0, (0..100).collect());
    });
}

#[test]
fn out_of_order_still_yields_each_batch_once() {
    bounded(Duration::from_secs(60), || {
        let job = spec::synthetic(256, &[16], Dtype::U8)
            .batch_size(16)
            .build()
            .expect("spec");
        let loader = Loader::local_builder(job, 2)
            .worker_command(worker_command())
            .in_order(false)
            .build()
            .expect("local");
        let mut seqs: Vec<u64> = loader.map(|b| b.expect("batch").seq()).collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (0..16).collect::<Vec<_>>());
    });
}

#[test]
fn async_stream_yields_the_same_batches() {
    bounded(Duration::from_secs(60), || {
        let job = spec::synthetic(64, &[4], Dtype::I32)
            .batch_size(10)
            .build()
            .expect("spec");
        let loader = Loader::local_builder(job, 1)
            .worker_command(worker_command())
            .build()
            .expect("local");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let seqs: Vec<u64> = runtime.block_on(async move {
            loader
                .into_stream()
                .map(|b| b.expect("batch").seq())
                .collect()
                .await
        });
        assert_eq!(seqs, (0..7).collect::<Vec<_>>());
    });
}

#[test]
fn a_worker_that_exits_at_once_is_a_clear_error() {
    bounded(Duration::from_secs(30), || {
        let job = spec::synthetic(64, &[4], Dtype::U8)
            .batch_size(8)
            .build()
            .expect("spec");
        let e = Loader::local_builder(job, 1)
            .worker_command(Some(vec!["false".into()]))
            .build()
            .expect_err("false is no worker");
        assert!(e.to_string().contains("exited early"), "{e}");
    });
}

#[test]
fn a_failed_job_ends_the_iterator_with_its_error() {
    bounded(Duration::from_secs(60), || {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokens.bin");
        std::fs::write(&path, vec![0u8; 2 * 1024]).expect("write");
        let job = spec::tokens(&path, Dtype::U16, 16)
            .batch_size(4)
            .build()
            .expect("spec");
        // Gone before any worker opens it: the job fails, naming the file.
        std::fs::remove_file(&path).expect("remove");
        let mut loader = Loader::local_builder(job, 1)
            .worker_command(worker_command())
            .build()
            .expect("local");
        let e = loader.next().expect("an item").expect_err("the job failed");
        let msg = e.to_string();
        assert!(msg.starts_with("job failed: "), "{msg}");
        assert!(msg.contains("tokens.bin"), "{msg}");
        assert!(loader.next().is_none());
    });
}
