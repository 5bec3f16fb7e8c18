//! The SDK against a real embedded deployment (in-process coordinator, worker
//! processes started from the workspace's `loader-worker`): every batch
//! exactly once, in order or not, blocking and async. Each test is bounded in
//! time; dropping the loader stops the processes it started.
#![cfg(feature = "embedded")]

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::sync::mpsc;
use std::time::Duration;

use futures::StreamExt;
use loader_client::{Dtype, Loader, spec};

/// The workspace's `loader-worker`, built next to this test executable
/// (`cargo test --workspace` builds it).
fn worker_command() -> Option<Vec<OsString>> {
    let exe = std::env::current_exe().expect("test executable path");
    let bin = exe.parent().and_then(|d| d.parent()).expect("target directory").join("loader-worker");
    assert!(bin.exists(), "{} is missing: build it with `cargo build -p loader-worker`", bin.display());
    Some(vec![bin.into()])
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

/// Embedded mode supervises its workers as a Deployment would: the only
/// worker SIGKILLed mid-run is replaced, and the run still yields every
/// batch exactly once, on either transport, within a bound (its batches
/// come back when the dead worker's lease expires).
#[test]
fn a_sigkilled_only_worker_is_replaced_and_the_run_completes() {
    for shared_memory in [false, true] {
        bounded(Duration::from_secs(90), move || {
            let job = spec::synthetic(2_000, &[64], Dtype::U8)
                .batch_size(8)
                .shuffle(3)
                // ~2.5 s of work for one worker: the kill lands mid-run.
                .cost_ns(1_250_000)
                .build()
                .expect("spec");
            let total = loader_job::spec::plan(&job).expect("plan").total_batches();
            let server = loader_server::ServerConfig {
                lease_ttl: Duration::from_millis(1000),
                heartbeat_interval: Duration::from_millis(300),
                ..Default::default()
            };
            let mut loader = Loader::local_builder(job, 1)
                .worker_command(worker_command())
                .shared_memory(shared_memory)
                .server_config(server)
                .build()
                .expect("local");
            let victim = loader.worker_pids()[0];
            let mut seqs = Vec::new();
            for batch in loader.by_ref() {
                let batch = batch.unwrap_or_else(|e| panic!("shared_memory={shared_memory}: {e}"));
                seqs.push(batch.seq());
                if seqs.len() == 20 {
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(victim as i32), nix::sys::signal::Signal::SIGKILL)
                        .expect("kill the worker");
                }
            }
            assert_eq!(seqs, (0..total).collect::<Vec<_>>(), "shared_memory={shared_memory}");
            let now = loader.worker_pids();
            assert_eq!(now.len(), 1, "one worker again");
            assert_ne!(now[0], victim, "a replacement");
        });
    }
}

/// A worker that keeps dying fails the run with one line naming it, instead
/// of a hang.
#[test]
fn a_worker_that_keeps_dying_fails_the_run_in_one_line() {
    bounded(Duration::from_secs(60), || {
        let job = spec::synthetic(2_000, &[64], Dtype::U8)
            .batch_size(8)
            .cost_ns(1_250_000)
            .build()
            .expect("spec");
        let loader = Loader::local_builder(job, 1)
            .worker_command(worker_command())
            .build()
            .expect("local");
        // Every worker of this loader dies at once, replacements too (they
        // name the same coordinator; other tests' workers name theirs).
        let first = loader.worker_pids()[0];
        let cmdline = std::fs::read(format!("/proc/{first}/cmdline")).expect("cmdline");
        let args: Vec<String> = cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let coordinator = args.iter().skip_while(|a| *a != "--coordinator").nth(1).expect("--coordinator").clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let killer = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for pid in worker_children(&coordinator) {
                        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let mut error = None;
        for batch in loader {
            if let Err(e) = batch {
                error = Some(e.to_string());
                break;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        killer.join().expect("killer");
        let error = error.expect("the run fails");
        assert!(error.contains("worker 1 of 1") && error.contains("keeps dying"), "{error}");
        assert!(!error.contains('\n'), "one line: {error}");
    });
}

/// Process ids of this process's children that run a worker of `coordinator`.
fn worker_children(coordinator: &str) -> Vec<i32> {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The parent pid is the second field after the parenthesised name.
            let ppid = stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(1));
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            ppid == Some(me.as_str()) && cmdline.contains("loader-worker") && cmdline.contains(coordinator)
        })
        .collect()
}

/// `LoaderBuilder::options` sets the same options as the setters, one by
/// one: the same ring (slots, socket directory), order and batches.
#[test]
fn options_set_whole_behave_like_the_setters() {
    use loader_client::{LoaderOptions, RingSize};

    /// What a loader shows of its options: where its ring's socket lives,
    /// how many slots the ring has, and the batches it yields.
    fn observe(builder: loader_client::LoaderBuilder) -> (std::path::PathBuf, usize, Vec<u64>) {
        let mut loader = builder.worker_command(worker_command()).build().expect("local");
        let socket = loader.ring_socket().expect("a ring").to_path_buf();
        let slots = loader.ring_slots().expect("a ring");
        let dir = socket.parent().and_then(|d| d.parent()).expect("socket dir").to_path_buf();
        let mut seqs: Vec<u64> = loader.by_ref().map(|b| b.expect("batch").seq()).collect();
        seqs.sort_unstable();
        (dir, slots.free + slots.granted + slots.held, seqs)
    }

    bounded(Duration::from_secs(60), || {
        let job = || spec::synthetic(96, &[64], Dtype::U8).batch_size(8).build().expect("spec");
        let dir = tempfile::tempdir().expect("tempdir");
        let by_setters = observe(
            Loader::local_builder(job(), 1)
                .prefetch(1)
                .in_order(false)
                .ring(3, 64 << 10)
                .ring_dir(dir.path())
                .coordinator_timeout(Duration::from_secs(5)),
        );
        let whole = observe(Loader::local_builder(job(), 1).options(LoaderOptions {
            prefetch: 1,
            in_order: false,
            ring: Some(RingSize { slots: 3, slot_bytes: 64 << 10 }),
            ring_dir: Some(dir.path().to_path_buf()),
            coordinator_timeout: Duration::from_secs(5),
            ..LoaderOptions::default()
        }));
        assert_eq!(by_setters.0, dir.path(), "the socket lives under ring_dir");
        assert_eq!(by_setters.1, 3, "the ring has the slots asked for");
        assert_eq!(by_setters.2, (0..12).collect::<Vec<_>>());
        assert_eq!(whole, by_setters);
    });
}
