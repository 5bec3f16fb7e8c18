//! Datasets in object storage (issue 53), read through a real S3 API
//! server: moto's standalone server, from PyPI (test.sh installs it in the
//! test virtualenv). A token file uploaded to a bucket and read as
//! `s3://bucket/key` by real workers gives, batch for batch, the bytes the
//! same file gives from local disk, every window once an epoch, also when a
//! worker is SIGKILLed mid-job or the trainer resumes mid-epoch from a
//! saved state; so do npy arrays, WebDataset shards,
//! Parquet files and an image folder (one object per image, listed from the
//! bucket); a shuffled token file's first batch comes before a whole
//! chunk of it is fetched; an object rewritten mid-job fails the job
//! naming it; a missing object and a missing bucket are one-line errors at
//! submission.
//!
//! One test function: the store's address reaches this process (the
//! submitter, which counts the tokens) through the AWS environment
//! variables, set once before any other thread of the test reads them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use loader_client::spec::{self, transforms};
use loader_client::{Dtype, JobSpec, Loader};
use loader_e2e::dataset_files::{jpeg, png, rgb, write_npy, write_parquet, write_shard};
use loader_e2e::moto::{self, boto3};
use loader_e2e::scrape::{metrics_addr, scrape, sum};
use loader_e2e::{Cluster, Relay, needs, run, wait_for};

/// A window is 64 + 1 uint16 ids; 2^22 ids (8 MB, two of the store
/// reader's 4 MB chunks) make 65,535 windows, some across the boundary.
const IDS: u32 = 1 << 22;
const CONTEXT: u64 = 64;

/// A batch: its indices and every tensor's bytes.
type Read = (Vec<u64>, Vec<Vec<u8>>);

/// Every batch of `job` from the cluster at `url`, by (epoch, seq). Kills
/// `kill`'s worker 0 after `kill_after` batches when given.
fn read_all(url: String, job: JobSpec, mut kill: Option<(&mut Cluster, usize)>) -> BTreeMap<(u32, u64), Read> {
    read_watching(url, job, |n| {
        if let Some((cluster, after)) = kill.as_mut()
            && n == *after
        {
            cluster.workers[0].kill();
            kill = None;
        }
    })
}

/// Every batch of `job` from the cluster at `url`, by (epoch, seq); calls
/// `watch` with the count read so far after each.
fn read_watching(url: String, job: JobSpec, mut watch: impl FnMut(usize)) -> BTreeMap<(u32, u64), Read> {
    let loader = Loader::builder(url).job(job).build().expect("loader");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut batches = BTreeMap::new();
    for batch in loader {
        let batch = batch.expect("batch");
        let tensors = batch.tensors().map(|t| t.bytes.to_vec()).collect();
        batches.insert((batch.epoch(), batch.seq()), (batch.indices().to_vec(), tensors));
        watch(batches.len());
        assert!(Instant::now() < deadline, "the job did not end within 120 s");
    }
    batches
}

fn tokens_job(path: impl AsRef<Path>, epochs: u32) -> JobSpec {
    spec::tokens(path, Dtype::U16, CONTEXT).batch_size(32).epochs(epochs).shuffle(7).build().expect("spec")
}

#[test]
fn a_token_file_in_a_bucket_reads_as_from_local_disk_and_failures_are_one_line() {
    let python = needs(moto::python());
    run(Duration::from_secs(300), move |scope| {
        let (_moto, endpoint) = moto::start(&scope, &python);
        // SAFETY: set before this test starts any thread that reads the
        // environment (the only test of this binary; moto's output readers
        // read none); the cluster's processes inherit them.
        unsafe { moto::aim_aws_at(&endpoint) };
        let dir = tempfile::tempdir().expect("tempdir");
        let local = dir.path().join("tokens.bin");
        moto::write_tokens(&local, IDS);
        boto3(&python, &endpoint, &format!("s3.create_bucket(Bucket='data')\ns3.upload_file({:?}, 'data', 'tokens.bin')", local.display().to_string()));

        let mut cluster = Cluster::builder().workers(2).ttl_ms(2000).metrics().start(&scope);
        // Byte-identical to the local file, batch for batch, every window once an epoch.
        let from_disk = read_all(cluster.url(), tokens_job(&local, 2), None);
        let tokens_from_disk = from_disk.clone();
        let from_store = read_all(cluster.url(), tokens_job("s3://data/tokens.bin", 2), None);
        assert_eq!(from_store.len(), from_disk.len());
        assert!(from_store == from_disk, "the store's batches differ from the local file's");
        let windows = (u64::from(IDS) - 1) / CONTEXT;
        for epoch in 0..2 {
            let seen: Vec<u64> = from_store.iter().filter(|(k, _)| k.0 == epoch).flat_map(|(_, (i, _))| i.clone()).collect();
            assert_eq!(seen.len() as u64, windows, "epoch {epoch}: every window once");
            assert_eq!(seen.iter().collect::<BTreeSet<_>>().len() as u64, windows, "epoch {epoch}: no window twice");
        }
        // The workers fetched the object's bytes (each chunk once per job and
        // worker) and read most chunks from their local copy.
        let scrapes: Vec<_> = cluster.workers.iter().map(|w| scrape(metrics_addr(w))).collect();
        let fetched: f64 = scrapes.iter().map(|s| sum(s, "loader_storage_bytes_total", &[])).sum();
        let reads: f64 = scrapes.iter().map(|s| sum(s, "loader_storage_chunk_reads_total", &[])).sum();
        let fetches: f64 = scrapes.iter().map(|s| sum(s, "loader_storage_chunk_fetches_total", &[])).sum();
        // Each worker's first windows also come as pieces of their own
        // (at most `loader_storage::object::PIECES`, 64, of 130 bytes).
        let object = 2.0 * f64::from(IDS);
        let pieces = 2.0 * 64.0 * 2.0 * (CONTEXT + 1) as f64;
        assert!(fetched >= object && fetched <= 2.0 * object + pieces, "fetched {fetched} bytes of an {object}-byte object");
        assert!(fetches <= 4.0 && reads > 100.0 * fetches, "{reads} chunk reads, {fetches} fetches");
        // A worker SIGKILLed mid-job: its batches are made again by the other, the same bytes.
        let killed = read_all(cluster.url(), tokens_job("s3://data/tokens.bin", 1), Some((&mut cluster, 5)));
        let first_epoch: BTreeMap<_, _> = from_disk.iter().filter(|(k, _)| k.0 == 0).map(|(k, v)| (*k, v.clone())).collect();
        assert!(killed == first_epoch, "after a worker died, the batches differ");
        cluster.add_worker();
        // Stopped mid-epoch and resumed from the saved state: the rest of
        // the epoch, the same bytes.
        let job = tokens_job("s3://data/tokens.bin", 1);
        let mut first = Loader::builder(cluster.url()).job(job.clone()).build().expect("loader");
        let mut resumed: BTreeMap<(u32, u64), Read> = BTreeMap::new();
        for _ in 0..7 {
            let batch = first.next().expect("a batch").expect("batch");
            resumed.insert((batch.epoch(), batch.seq()), (batch.indices().to_vec(), batch.tensors().map(|t| t.bytes.to_vec()).collect()));
        }
        let state = first.state();
        drop(first);
        let rest = Loader::builder(cluster.url()).job(job).resume(state).build().expect("resumed loader");
        for batch in rest {
            let batch = batch.expect("batch");
            let key = (batch.epoch(), batch.seq());
            assert!(resumed.insert(key, (batch.indices().to_vec(), batch.tensors().map(|t| t.bytes.to_vec()).collect())).is_none(), "{key:?} twice");
        }
        assert!(resumed == first_epoch, "the resumed run's batches differ from an uninterrupted one's");

        // npy arrays and WebDataset shards (decoded, cropped, flipped per
        // sample) in the bucket: the batches of the same files on disk.
        let rows = 3000u64;
        let x: Vec<u8> = (0..rows * 40).flat_map(|i| (i as f32).to_le_bytes()).collect();
        write_npy(&dir.path().join("x.npy"), "<f4", &[rows, 40], &x);
        let y: Vec<u8> = (0..rows).flat_map(|i| (i as i64 * 7).to_le_bytes()).collect();
        write_npy(&dir.path().join("y.npy"), "<i8", &[rows], &y);
        for s in 0..2 {
            write_shard(&dir.path().join(format!("shard-{s}.tar")), s * 40, 40);
        }
        write_parquet(&dir.path().join("a.parquet"), 0, 700, 128);
        write_parquet(&dir.path().join("b.parquet"), 700, 300, 100);
        boto3(
            &python,
            &endpoint,
            &["x.npy", "y.npy", "shard-0.tar", "shard-1.tar", "a.parquet", "b.parquet"]
                .map(|f| format!("s3.upload_file({:?}, 'data', 'set/{f}')", dir.path().join(f).display().to_string()))
                .join("\n"),
        );
        let npy = |root: &str| {
            spec::npy([("x", format!("{root}/x.npy")), ("y", format!("{root}/y.npy"))]).batch_size(64).epochs(2).shuffle(3).build().expect("npy spec")
        };
        let local_root = dir.path().display().to_string();
        assert!(read_all(cluster.url(), npy("s3://data/set"), None) == read_all(cluster.url(), npy(&local_root), None), "npy");
        let shards = |root: &str| {
            spec::webdataset([format!("{root}/shard-0.tar"), format!("{root}/shard-1.tar")])
                .transforms([transforms::decode(), transforms::random_resized_crop(16), transforms::horizontal_flip()])
                .batch_size(8)
                .epochs(2)
                .shuffle(5)
                .build()
                .expect("webdataset spec")
        };
        let parquet = |root: &str| {
            spec::parquet([format!("{root}/a.parquet"), format!("{root}/b.parquet")], ["x", "y"])
                .batch_size(50)
                .epochs(2)
                .shuffle(11)
                .build()
                .expect("parquet spec")
        };
        let from_store = read_all(cluster.url(), parquet("s3://data/set"), None);
        assert_eq!(from_store.values().map(|(i, _)| i.len()).sum::<usize>(), 2000, "1,000 rows, 2 epochs");
        assert!(from_store == read_all(cluster.url(), parquet(&local_root), None), "parquet");
        let gets = |cluster: &Cluster| -> f64 {
            cluster.workers.iter().skip(1).map(|w| sum(&scrape(metrics_addr(w)), "loader_storage_requests_total", &[("op", "get")])).sum()
        };
        let worker_gets = |cluster: &Cluster| -> Vec<f64> {
            cluster.workers.iter().skip(1).map(|w| sum(&scrape(metrics_addr(w)), "loader_storage_requests_total", &[("op", "get")])).collect()
        };
        let before = worker_gets(&cluster);
        let from_store = read_all(cluster.url(), shards("s3://data/set"), None);
        assert_eq!(from_store.values().map(|(i, _)| i.len()).sum::<usize>(), 160, "every sample once an epoch");
        // Each worker fetched each shard (one chunk) at most once: its
        // index was walked through the chunks its samples are read from.
        let fetched: Vec<f64> = worker_gets(&cluster).iter().zip(&before).map(|(a, b)| a - b).collect();
        assert!(fetched.iter().all(|&n| n <= 2.0) && fetched.iter().sum::<f64>() > 0.0, "GETs by worker for 2 one-chunk shards: {fetched:?}");
        assert!(from_store == read_all(cluster.url(), shards(&local_root), None), "webdataset");

        // An image folder: one object per image, class folders (one nested),
        // listed from the bucket in the local walk's order.
        let images = dir.path().join("images");
        for (i, rel) in ["cat/a.jpg", "cat/b.png", "cat/deep/c.jpg", "dog/d.jpg", "dog/e.jpeg", "emu/f.jpg", "emu/notes.txt"].iter().enumerate() {
            let path = images.join(rel);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            let pixels = rgb(24 + i as u32, 20, i % 3, i as u32);
            let bytes = if rel.ends_with(".png") { png(&pixels, 24 + i as u32, 20) } else { jpeg(&pixels, 24 + i as u32, 20) };
            std::fs::write(&path, bytes).expect("write image");
        }
        boto3(
            &python,
            &endpoint,
            &format!(
                "import os\nroot = {:?}\nfor d, _, files in os.walk(root):\n    for f in files:\n        p = os.path.join(d, f)\n        s3.upload_file(p, 'data', 'images/' + os.path.relpath(p, root))",
                images.display().to_string()
            ),
        );
        let folder = |root: String| {
            spec::image_folder(root)
                .transforms([transforms::decode(), transforms::random_resized_crop(16), transforms::horizontal_flip()])
                .batch_size(4)
                .epochs(3)
                .shuffle(9)
                .build()
                .expect("image folder spec")
        };
        // Worker 0 was killed above; its replacement is the last.
        let before = gets(&cluster);
        let from_store = read_all(cluster.url(), folder("s3://data/images".into()), None);
        assert_eq!(from_store.values().map(|(i, _)| i.len()).sum::<usize>(), 18, "6 images, 3 epochs");
        // Each worker fetched each image at most once: later epochs read
        // the local copy.
        let fetched = gets(&cluster) - before;
        assert!(fetched <= 12.0, "{fetched} image GETs for 6 images read 3 times by 2 workers");
        // The workers read the submitter's listing (the job's blob
        // `listing`), not the bucket: not one LIST between them.
        let lists: f64 =
            cluster.workers.iter().skip(1).map(|w| sum(&scrape(metrics_addr(w)), "loader_storage_requests_total", &[("op", "list")])).sum();
        assert_eq!(lists, 0.0, "LISTs by the workers of a folder the submitter listed");
        let from_disk = read_all(cluster.url(), folder(images.display().to_string()), None);
        assert!(from_store == from_disk, "image folder");

        // `loaderctl status --json` shows each worker's reads from the
        // store: the counts of its /metrics, once its first heartbeat after
        // the job has reached the coordinator.
        let status = || -> serde_json::Value {
            let mut ctl = loader_e2e::loaderctl(&scope, &["status", "--coordinator", &cluster.url(), "--json"]);
            let exit = ctl.wait_exit(Duration::from_secs(20));
            assert!(exit.is_some_and(|s| s.success()), "loaderctl status --json: {exit:?}");
            serde_json::from_str(&ctl.stdout().concat()).expect("status --json is one JSON object")
        };
        let shown = wait_for("status --json agreeing with the workers' /metrics", Duration::from_secs(20), || {
            let shown = status()["workers"].as_array().cloned().unwrap_or_default();
            let agree = cluster.workers.iter().skip(1).all(|w| {
                let metrics = scrape(metrics_addr(w));
                let storage = shown.iter().find(|s| s["pid"] == w.pid()).map(|s| s["storage"].clone()).unwrap_or_default();
                let count = |name: &str, labels: &[(&str, &str)]| Some(sum(&metrics, name, labels));
                storage["requests"].as_f64() == count("loader_storage_requests_total", &[])
                    && storage["failed_requests"].as_f64() == count("loader_storage_requests_total", &[("outcome", "error")])
                    && storage["retries"].as_f64() == count("loader_storage_retries_total", &[])
                    && storage["bytes"].as_f64() == count("loader_storage_bytes_total", &[])
                    && storage["object_reads_local"].as_f64() == count("loader_storage_object_reads_total", &[("from", "local")])
                    && storage["object_reads_store"].as_f64() == count("loader_storage_object_reads_total", &[("from", "store")])
                    && storage["requests"].as_u64().is_some_and(|n| n > 0)
                    && storage["latency_p99_ms"].as_u64().is_some_and(|p99| p99 >= storage["latency_p50_ms"].as_u64().unwrap_or(u64::MAX))
            });
            if agree { Ok(shown) } else { Err(format!("shown: {shown:?}")) }
        });
        // Every image read came from the local copy or the store, and no
        // more from the store than were fetched; moto, never failing, had
        // no attempt retried.
        let reads = |from: &str| -> u64 { shown.iter().filter_map(|s| s["storage"][from].as_u64()).sum() };
        assert_eq!(reads("retries"), 0, "{shown:?}");
        assert!(reads("object_reads_local") + reads("object_reads_store") >= 18, "{shown:?}");
        assert!(reads("object_reads_store") as f64 <= fetched, "{shown:?}");

        // Kept for the node (`--storage-cache-shared`): one pile in the
        // directory while the job runs, whichever worker fetched, the same
        // bytes; the last worker to close the job's dataset removes it.
        let node_dir = tempfile::tempdir().expect("tempdir");
        let node = Cluster::builder()
            .workers(2)
            .metrics()
            .env("LOADER_STORAGE_CACHE_DIR", node_dir.path().display().to_string())
            .env("LOADER_STORAGE_CACHE_SHARED", "1")
            .start(&scope);
        let entries = |dir: &Path| -> Vec<String> {
            std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default()
        };
        // Waits (bounded) until the node's directory is empty again.
        let emptied = |what: &str| {
            wait_for(what, Duration::from_secs(30), || {
                let left = entries(node_dir.path());
                if left.is_empty() { Ok(()) } else { Err(format!("left: {left:?}")) }
            })
        };
        // A token file's chunks are fetched once for the node's workers, not
        // once each, the same bytes; the object's directory goes with the job.
        let tokens_shared = read_all(node.url(), tokens_job("s3://data/tokens.bin", 2), None);
        assert!(tokens_shared == tokens_from_disk, "token file read through the node's chunks");
        let node_fetches: f64 =
            node.workers.iter().map(|w| sum(&scrape(metrics_addr(w)), "loader_storage_chunk_fetches_total", &[])).sum();
        let chunks = (2 * u64::from(IDS)).div_ceil(4 << 20) as f64; // chunks of 4 MB (`loader_storage::object::CHUNK`)
        assert!(node_fetches <= chunks, "{node_fetches} chunk fetches of {chunks} chunks by the node's 2 workers");
        emptied("the object's chunks going with their job");
        let mut during = Vec::new();
        let shared = read_watching(node.url(), folder("s3://data/images".into()), |n| {
            if n == 1 {
                during = entries(node_dir.path());
            }
        });
        assert!(shared == from_disk, "image folder kept for the node");
        let pile = during.iter().find(|e| e.starts_with("loader-objects-") && !e.ends_with(".hold"));
        let pile = pile.unwrap_or_else(|| panic!("no node pile while the job ran: {during:?}"));
        assert!(during.contains(&format!("{pile}.hold")) && during.len() == 2, "one pile and its lock: {during:?}");
        emptied("the pile going with its job");
        // Both workers SIGKILLed mid-job leave the pile; the next worker
        // started on the machine removes it.
        let mut node = node;
        let mut loader = Loader::builder(node.url()).job(folder("s3://data/images".into())).build().expect("loader");
        loader.next().expect("a batch").expect("read");
        for w in &mut node.workers {
            w.kill();
        }
        drop(loader);
        let left = entries(node_dir.path());
        assert_eq!(left.len(), 2, "the killed workers' pile and its lock: {left:?}");
        node.add_worker();
        emptied("a new worker removing the killed ones' pile");

        // A shuffled token file's first batch does not wait for the chunks
        // its windows lie in: each window of a worker's first batches is
        // also fetched on its own (`loader_storage::object::PIECES`, or a
        // batch's windows when more: 96 here). Through a relay that passes
        // 64 KB/s a connection, a 4 MB chunk takes a minute and a window's
        // GET a few milliseconds: the first batch comes, the bytes of the
        // local file's, before the worker has fetched a whole chunk.
        let slow = Relay::start();
        slow.to(endpoint.trim_start_matches("http://"));
        slow.slow(64 << 10);
        let far = Cluster::builder().workers(1).metrics().env("AWS_ENDPOINT_URL", format!("http://{}", slow.addr())).start(&scope);
        let in_96s = |path: &dyn AsRef<Path>| spec::tokens(path, Dtype::U16, CONTEXT).batch_size(96).shuffle(7).build().expect("spec");
        let first_batch = |job: JobSpec| -> ((u32, u64), Read) {
            let mut loader = Loader::builder(far.url()).job(job).build().expect("loader");
            let batch = loader.next().expect("a batch").expect("the first batch");
            ((batch.epoch(), batch.seq()), (batch.indices().to_vec(), batch.tensors().map(|t| t.bytes.to_vec()).collect()))
        };
        let expected = first_batch(in_96s(&local));
        let first = first_batch(in_96s(&"s3://data/tokens.bin"));
        assert_eq!(first.1.0.len(), 96);
        assert!(first == expected, "the first batch differs from the local file's");
        let metrics = scrape(metrics_addr(&far.workers[0]));
        let fetched = sum(&metrics, "loader_storage_bytes_total", &[]);
        assert!(fetched < f64::from(4u32 << 20), "{fetched} bytes fetched before the first batch: a whole chunk");
        assert!(sum(&metrics, "loader_storage_requests_total", &[("op", "get")]) >= 48.0, "a GET a window of the first batch");
        drop(far);
        drop(slow);

        // Missing objects and buckets: one line each, at submission.
        for (url, words) in [("s3://data/missing.bin", "no such object"), ("s3://nobucket/tokens.bin", "no such object")] {
            let e = spec::tokens(url, Dtype::U16, CONTEXT).build().expect_err(url).to_string();
            assert!(e.contains(url) && e.contains(words) && !e.contains('\n'), "{url}: {e}");
        }

        // Rewritten mid-job: the next chunk fetched fails the job, naming
        // the object; what was fetched before is the version the job
        // opened. An object of 24 chunks of 4 MB read in order, batches of
        // 256 windows (32 KB): the workers run at most 256 batches each
        // (16 MB, 4 chunks, for two) ahead of the trainer and fetch 8
        // chunks ahead of their reads (`loader_storage::object::READ_AHEAD`),
        // so at the rewrite, after the trainer's third batch, chunks 13 and
        // on were not asked for; the first read of one (1,664 batches in at
        // most) fails the job.
        boto3(&python, &endpoint, "s3.put_object(Bucket='data', Key='big.bin', Body=bytes(24 * 4194304))");
        let job = spec::tokens("s3://data/big.bin", Dtype::U16, CONTEXT).batch_size(256).build().expect("spec");
        let loader = Loader::builder(cluster.url()).job(job).build().expect("loader");
        let mut error = None;
        let deadline = Instant::now() + Duration::from_secs(120);
        for (n, batch) in loader.enumerate() {
            match batch {
                Ok(_) if n == 2 => boto3(&python, &endpoint, "s3.put_object(Bucket='data', Key='big.bin', Body=b'x' * 8388608)"),
                Ok(_) => {}
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
            assert!(Instant::now() < deadline, "the rewritten object went unnoticed for 120 s");
        }
        let error = error.expect("the job ended without noticing the rewrite");
        assert!(error.contains("s3://data/big.bin") && error.contains("changed since the job opened it"), "{error}");
        assert!(!error.contains('\n'), "one line: {error}");
    });
}
