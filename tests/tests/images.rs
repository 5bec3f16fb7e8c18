//! The built-in file datasets end to end, with real `loader-server` and
//! `loader-worker` processes: an image folder with a corrupt JPEG and a PNG
//! (shapes, labels, both corrupt-sample policies, identical pixels across
//! runs and worker counts), WebDataset shards (every sample once per epoch,
//! shards read front to back), npy arrays (rows byte for byte), and
//! `loaderctl run` on an image folder and on a spec file.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use loader_client::spec::{self, transforms};
use loader_client::{CorruptPolicy, Dtype, JobSpec, Loader};
use loader_e2e::dataset_files::{ImageFolder, write_npy, write_parquet, write_shard};
use loader_e2e::{Cluster, Proc, run, wait_for};

/// One sample as the trainer saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sample {
    epoch: u32,
    seq: u64,
    index: u64,
    label: i64,
    /// FNV-1a of its image bytes.
    pixels: u64,
    /// The channel with the largest mean (the class colour).
    dominant: usize,
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// Consumes `job` from `url` as rank 0 of 1, checking every batch's tensor
/// table; every sample, or the error the loader ended with.
fn consume_images(url: String, job: JobSpec, side: u64) -> Result<Vec<Sample>, String> {
    let loader = Loader::builder(url).job(job).build().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for batch in loader {
        let batch = batch.map_err(|e| e.to_string())?;
        let n = batch.len();
        let image = batch.tensor("image").expect("image tensor");
        assert_eq!((image.dtype, image.shape.to_vec()), (Dtype::U8, vec![n as u64, 3, side, side]));
        let label = batch.tensor("label").expect("label tensor");
        assert_eq!((label.dtype, label.shape.to_vec()), (Dtype::I64, vec![n as u64]));
        let labels: Vec<i64> = label.to_vec().expect("int64 labels");
        let row = (3 * side * side) as usize;
        let plane = (side * side) as usize;
        for (k, &index) in batch.indices().iter().enumerate() {
            let pixels = &image.bytes[k * row..(k + 1) * row];
            let means: Vec<u64> =
                (0..3).map(|c| pixels[c * plane..(c + 1) * plane].iter().map(|&b| u64::from(b)).sum()).collect();
            let dominant = (0..3).max_by_key(|&c| means[c]).unwrap_or(0);
            out.push(Sample {
                epoch: batch.epoch(),
                seq: batch.seq(),
                index,
                label: labels[k],
                pixels: fnv(pixels),
                dominant,
            });
        }
    }
    Ok(out)
}

fn image_job(folder: &ImageFolder, policy: CorruptPolicy) -> JobSpec {
    spec::image_folder(folder.path())
        .transforms(transforms::standard_train(224))
        .batch_size(4)
        .epochs(2)
        .shuffle(11)
        .on_corrupt(policy)
        .build()
        .expect("image folder spec")
}

#[test]
fn an_image_folder_gives_uint8_chw_images_and_folder_labels_skipping_the_corrupt_file_identically_everywhere() {
    let folder = ImageFolder::write();
    let job = image_job(&folder, CorruptPolicy::Skip);
    let plan = loader_job::spec::plan(&job).expect("plan");
    let n = folder.labels.len() as u64;
    assert_eq!(plan.num_samples, n, "the corrupt file is listed like any other");
    let j1 = job.clone();
    let (one, three, log) = run(Duration::from_secs(240), move |scope| {
        let (one, log) = {
            let cluster = Cluster::builder().workers(1).capture_worker_stderr().start(&scope);
            let one = consume_images(cluster.url(), j1.clone(), 224).expect("one worker");
            (one, cluster.workers[0].stderr())
        };
        let three = {
            let cluster = Cluster::start(&scope, 3);
            consume_images(cluster.url(), j1, 224).expect("three workers")
        };
        (one, three, log)
    });

    for epoch in 0..2 {
        let mut indices: Vec<u64> = one.iter().filter(|s| s.epoch == epoch).map(|s| s.index).collect();
        indices.sort_unstable();
        let expect: Vec<u64> = (0..n).filter(|&i| i != folder.corrupt_index).collect();
        assert_eq!(indices, expect, "epoch {epoch}: every sample but the corrupt one, once");
    }
    for s in &one {
        assert_eq!(s.label, folder.labels[s.index as usize], "label of sample {}", s.index);
        assert_eq!(s.dominant as i64, s.label, "sample {}: the pixels are of its class", s.index);
    }
    assert!(one.iter().any(|s| s.index == folder.png_index), "the PNG is decoded");
    // The batch that held the corrupt file is one shorter, everything else as planned.
    let mut by_seq: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for s in &one {
        by_seq.entry(s.seq).or_default().push(s.index);
    }
    assert_eq!(by_seq.len() as u64, plan.total_batches());
    for (seq, got) in &by_seq {
        let planned: Vec<u64> =
            plan.batch_indices(0, *seq).into_iter().filter(|&i| i != folder.corrupt_index).collect();
        assert_eq!(got, &planned, "batch {seq}");
    }
    let corrupt = folder.corrupt.display().to_string();
    assert!(
        log.iter().any(|l| l.contains(&corrupt) && l.contains("skipped")),
        "the worker logs the skipped file {corrupt}: {log:?}"
    );
    // Randomness from (seed, epoch, index) alone: same pixels on another
    // run with another worker count; other pixels in another epoch.
    assert_eq!(one, three);
    let pixels: HashMap<(u32, u64), u64> = one.iter().map(|s| ((s.epoch, s.index), s.pixels)).collect();
    let changed = (0..n).filter(|&i| pixels.get(&(0, i)).is_some_and(|p| Some(p) != pixels.get(&(1, i)))).count();
    assert!(changed as u64 >= n - 4, "crops differ between epochs for most samples ({changed} of {n})");
}

#[test]
fn under_the_fail_policy_the_job_fails_naming_the_corrupt_file() {
    let folder = ImageFolder::write();
    let job = image_job(&folder, CorruptPolicy::Fail);
    let outcome = run(Duration::from_secs(120), move |scope| {
        let cluster = Cluster::start(&scope, 1);
        consume_images(cluster.url(), job, 224)
    });
    let error = outcome.expect_err("the job must fail");
    let corrupt = folder.corrupt.display().to_string();
    assert!(error.contains(&format!("corrupt sample {corrupt}")), "{error}");
    assert!(!error.contains('\n'), "one line: {error}");
}

#[test]
fn webdataset_shards_give_every_sample_once_per_epoch_reading_each_shard_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sizes = [5u64, 8, 0, 3, 6, 4];
    let mut shards = Vec::new();
    let mut first = 0;
    for (s, &size) in sizes.iter().enumerate() {
        let path = dir.path().join(format!("train-{s:03}.tar"));
        write_shard(&path, first, size);
        first += size;
        shards.push(path);
    }
    let n = first;
    let job = spec::webdataset(&shards)
        .transforms([transforms::decode(), transforms::resize(16), transforms::center_crop(16)])
        .batch_size(5)
        .epochs(2)
        .shuffle(3)
        .build()
        .expect("webdataset spec");
    let seen = run(Duration::from_secs(120), move |scope| {
        let cluster = Cluster::start(&scope, 2);
        consume_images(cluster.url(), job, 16).expect("consume")
    });
    let shard_of = |i: u64| {
        let mut start = 0;
        sizes.iter().position(|&size| {
            start += size;
            i < start
        })
    };
    let mut orders = Vec::new();
    for epoch in 0..2 {
        let order: Vec<u64> = seen.iter().filter(|s| s.epoch == epoch).map(|s| s.index).collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "epoch {epoch}: every sample exactly once");
        // Each shard is one run of consecutive samples, front to back.
        let mut runs: Vec<usize> = Vec::new();
        for pair in order.windows(2) {
            if shard_of(pair[0]) == shard_of(pair[1]) {
                assert_eq!(pair[1], pair[0] + 1, "epoch {epoch} reads a shard in order: {order:?}");
            }
        }
        for &i in &order {
            let shard = shard_of(i).expect("in a shard");
            if runs.last() != Some(&shard) {
                assert!(!runs.contains(&shard), "epoch {epoch} returns to shard {shard}: {order:?}");
                runs.push(shard);
            }
        }
        orders.push(runs);
    }
    assert_ne!(orders[0], orders[1], "shuffle reorders the shards each epoch");
    for s in &seen {
        assert_eq!(s.label, s.index as i64, "the .cls label of sample {}", s.index);
        assert_eq!(s.dominant as u64, s.index % 3, "the image of sample {}", s.index);
    }
}

/// Two arrays of `rows` rows: `x` float32 [rows, 3] and `y` int64 [rows].
fn write_arrays(dir: &Path, rows: u64) -> (Vec<u8>, Vec<u8>) {
    let x: Vec<u8> = (0..rows * 3).flat_map(|v| (v as f32 * 0.5).to_le_bytes()).collect();
    let y: Vec<u8> = (0..rows).flat_map(|v| ((v * v) as i64 - 7).to_le_bytes()).collect();
    write_npy(&dir.join("x.npy"), "<f4", &[rows, 3], &x);
    write_npy(&dir.join("y.npy"), "<i8", &[rows], &y);
    (x, y)
}

#[test]
fn npy_rows_arrive_byte_for_byte() {
    const ROWS: u64 = 37;
    let dir = tempfile::tempdir().expect("tempdir");
    let (x, y) = write_arrays(dir.path(), ROWS);
    let job = spec::npy([("x", dir.path().join("x.npy")), ("y", dir.path().join("y.npy"))])
        .batch_size(8)
        .shuffle(2)
        .build()
        .expect("npy spec");
    let rows = run(Duration::from_secs(120), move |scope| {
        let cluster = Cluster::start(&scope, 2);
        let loader = Loader::builder(cluster.url()).job(job).build().expect("loader");
        let mut rows = Vec::new();
        for batch in loader {
            let batch = batch.expect("batch");
            let (bx, by) = (batch.tensor("x").expect("x"), batch.tensor("y").expect("y"));
            assert_eq!((bx.dtype, bx.shape.to_vec()), (Dtype::F32, vec![batch.len() as u64, 3]));
            assert_eq!((by.dtype, by.shape.to_vec()), (Dtype::I64, vec![batch.len() as u64]));
            for (k, &i) in batch.indices().iter().enumerate() {
                rows.push((i, bx.bytes[k * 12..(k + 1) * 12].to_vec(), by.bytes[k * 8..(k + 1) * 8].to_vec()));
            }
        }
        rows
    });
    assert_eq!(rows.len() as u64, ROWS);
    for (i, rx, ry) in rows {
        let i = i as usize;
        assert_eq!(rx, x[i * 12..(i + 1) * 12], "x row {i}");
        assert_eq!(ry, y[i * 8..(i + 1) * 8], "y row {i}");
    }
}

/// Three Parquet files of uneven row groups (4+4+2, 7, 3+3+3+1: 27 rows,
/// 8 row groups) read through a cluster with a block shuffle: every row
/// once per epoch with its bytes, each row group's rows in one run of the
/// epoch's order (which changes between epochs), the text column left out.
#[test]
fn parquet_rows_arrive_byte_for_byte_one_row_group_at_a_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut groups = Vec::new();
    let mut first = 0;
    for (name, rows, group) in [("a", 10u64, 4usize), ("b", 7, 7), ("c", 10, 3)] {
        write_parquet(&dir.path().join(format!("{name}.parquet")), first, rows, group);
        for start in (0..rows).step_by(group) {
            groups.push(first + start..first + (start + group as u64).min(rows));
        }
        first += rows;
    }
    let group_of = |i: u64| groups.iter().position(|g| g.contains(&i)).expect("a row group");
    let job = spec::parquet([dir.path().join("*.parquet")], ["y", "x"])
        .batch_size(4)
        .epochs(2)
        .block_shuffle(9)
        .build()
        .expect("parquet spec");
    let batches = run(Duration::from_secs(120), move |scope| {
        let cluster = Cluster::start(&scope, 2);
        let loader = Loader::builder(cluster.url()).job(job).build().expect("loader");
        let mut batches = Vec::new();
        for batch in loader {
            let batch = batch.expect("batch");
            let (bx, by) = (batch.tensor("x").expect("x"), batch.tensor("y").expect("y"));
            assert!(batch.tensor("name").is_none(), "only the columns asked for");
            assert_eq!((bx.dtype, bx.shape.to_vec()), (Dtype::F32, vec![batch.len() as u64, 3]));
            assert_eq!((by.dtype, by.shape.to_vec()), (Dtype::I64, vec![batch.len() as u64]));
            let rows: Vec<(u64, Vec<u8>, Vec<u8>)> = batch
                .indices()
                .iter()
                .enumerate()
                .map(|(k, &i)| (i, bx.bytes[k * 12..(k + 1) * 12].to_vec(), by.bytes[k * 8..(k + 1) * 8].to_vec()))
                .collect();
            batches.push((batch.seq(), rows));
        }
        batches
    });
    let mut orders = Vec::new();
    for epoch in 0..2 {
        let order: Vec<u64> = batches.iter().skip(epoch * 7).take(7).flat_map(|(_, rows)| rows.iter().map(|r| r.0)).collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..27).collect::<Vec<_>>(), "every row once in epoch {epoch}");
        let mut runs: Vec<usize> = order.iter().map(|&i| group_of(i)).collect();
        runs.dedup();
        assert_eq!(runs.len(), groups.len(), "each row group in one run, epoch {epoch}: {order:?}");
        orders.push(order);
    }
    assert_ne!(orders[0], orders[1], "a new order each epoch");
    for (_, rows) in &batches {
        for (i, x, y) in rows {
            let want: Vec<u8> = (0..3).flat_map(|k| ((10 * i + k) as f32).to_le_bytes()).collect();
            assert_eq!(x, &want, "x of row {i}");
            assert_eq!(y, &(-(*i as i64)).to_le_bytes().to_vec(), "y of row {i}");
        }
    }
}

/// Runs `loaderctl args`, waits (bounded) for it to exit, and returns its
/// exit code, stdout and stderr.
fn loaderctl(scope: &loader_e2e::Scope, args: &[&str]) -> (Option<i32>, Vec<String>, Vec<String>) {
    let mut command = std::process::Command::new(loader_e2e::binary("loaderctl"));
    command.args(args);
    let mut proc = Proc::spawn_capturing_stderr(scope, "loaderctl", command, false);
    // Returns once the reader threads have every line it printed.
    let status = proc.wait_exit(Duration::from_secs(120)).expect("loaderctl exits");
    (status.code(), proc.stdout(), proc.stderr())
}

#[test]
fn loaderctl_runs_an_image_folder_and_any_spec_file() {
    let folder = ImageFolder::write();
    let root = folder.path().display().to_string();
    let data = tempfile::tempdir().expect("tempdir");
    write_arrays(data.path(), 21);
    let spec_file = data.path().join("job.yaml");
    std::fs::write(&spec_file, "dataset: {npy: {arrays: {x: x.npy, y: y.npy}}}\nbatch_size: 4\nepochs: 2\nsampler: {shuffle: true}\n")
        .expect("spec file");
    let bad_spec = data.path().join("bad.yaml");
    std::fs::write(&bad_spec, "dataset: {image_folder: {path: .}}\ntransforms: [decode, rotate]\nbatch_size: 4\n")
        .expect("bad spec");
    // A mixture of the arrays with themselves (weights 1 : 3), and one of
    // the arrays with the image folder, whose samples do not collate.
    let npy_entry = "{npy: {arrays: {x: x.npy, y: y.npy}}}";
    let mix_file = data.path().join("mix.yaml");
    std::fs::write(
        &mix_file,
        format!(
            "dataset: {{mix: {{sources: [{{name: a, weight: 1, dataset: {npy_entry}}}, {{name: b, weight: 3, dataset: {npy_entry}}}], samples_per_epoch: 40, source_field: source}}}}\nbatch_size: 8\nepochs: 2\nsampler: {{shuffle: true}}\n"
        ),
    )
    .expect("mix spec");
    let clash_file = data.path().join("clash.yaml");
    std::fs::write(
        &clash_file,
        format!(
            "dataset: {{mix: {{sources: [{{name: rows, weight: 1, dataset: {npy_entry}}}, {{name: photos, weight: 1, dataset: {{image_folder: {{path: {root}}}}}}}]}}}}\ntransforms: [decode, {{center_crop: {{size: 8}}}}]\nbatch_size: 4\n"
        ),
    )
    .expect("clash spec");
    let spec_path = spec_file.display().to_string();
    let bad_path = bad_spec.display().to_string();
    let (mix_path, clash_path) = (mix_file.display().to_string(), clash_file.display().to_string());
    let (mix, clash) = run(Duration::from_secs(240), move |scope| {
        let mix = loaderctl(&scope, &["run", "--spec", &mix_path, "--workers", "2", "--json"]);
        let clash = loaderctl(&scope, &["run", "--spec", &clash_path, "--workers", "1"]);
        (mix, clash)
    });
    let (images, npy, bad, missing) = run(Duration::from_secs(240), move |scope| {
        let images = loaderctl(&scope, &[
            "run", "--dataset", "imagefolder", "--path", &root, "--on-corrupt", "skip", "--batch-size", "4",
            "--workers", "2", "--json",
        ]);
        let npy = loaderctl(&scope, &["run", "--spec", &spec_path, "--workers", "1", "--json"]);
        let bad = loaderctl(&scope, &["run", "--spec", &bad_path]);
        let missing = loaderctl(&scope, &["run", "--dataset", "imagefolder"]);
        (images, npy, bad, missing)
    });
    let report = |out: &(Option<i32>, Vec<String>, Vec<String>)| -> serde_json::Value {
        assert_eq!(out.0, Some(0), "stderr: {:?}", out.2);
        serde_json::from_str(out.1.last().expect("a report line")).expect("json report")
    };
    let images = report(&images);
    assert_eq!(images["samples"], folder.labels.len() as u64 - 1, "{images}");
    assert_eq!(images["dataset"], "image_folder");
    let npy = report(&npy);
    assert_eq!(npy["samples"], 42, "{npy}");
    assert_eq!(npy["dataset"], "npy");
    let mix = report(&mix);
    assert_eq!(mix["samples"], 80, "two epochs of 40 positions: {mix}");
    assert_eq!(mix["dataset"], "mix of 2");
    assert_eq!(clash.0, Some(1));
    let said = clash.2.last().expect("an error line");
    assert!(
        said.starts_with("loaderctl: error: job failed: dataset.mix: sources `rows` and `photos` do not collate: tensor `x` is float32 [3]"),
        "{:?}",
        clash.2
    );
    assert_eq!(bad.0, Some(1));
    assert_eq!(bad.2, vec![format!(
        "loaderctl: error: {}: transforms[1]: unknown transform `rotate`; expected one of: decode, random_resized_crop, \
         resize, center_crop, horizontal_flip, normalize, cast, layout at line 2 column 22",
        bad_spec.display()
    )]);
    assert_eq!(missing.0, Some(1));
    assert_eq!(missing.2.len(), 1, "{:?}", missing.2);
    assert!(missing.2[0].contains("--dataset imagefolder needs --path DIR"), "{:?}", missing.2);
}

/// `loaderctl run --cache`: the workers it starts share a sample cache
/// that keeps each image decoded, and three epochs of random crops and
/// flips give the batches of a run without it, checksum for checksum (the
/// corrupt file skipped in both); the report counts the cache's reads and
/// says it stayed on. A job whose pipeline keeps nothing is refused in one
/// line.
#[test]
fn loaderctl_run_keeps_frames_and_gives_the_same_batches() {
    let folder = ImageFolder::write();
    let root = folder.path().display().to_string();
    let sums = tempfile::tempdir().expect("tempdir");
    let (plain_sums, cached_sums) = (sums.path().join("plain"), sums.path().join("cached"));
    let (plain_at, cached_at) = (plain_sums.display().to_string(), cached_sums.display().to_string());
    let (plain, cached, refused) = run(Duration::from_secs(240), move |scope| {
        let job = |sums: &str, more: &[&str]| {
            let mut args = vec![
                "run", "--dataset", "imagefolder", "--path", &root, "--on-corrupt", "skip", "--batch-size", "4",
                "--workers", "2", "--epochs", "3", "--json", "--checksum", sums,
            ];
            args.extend_from_slice(more);
            loaderctl(&scope, &args)
        };
        let plain = job(&plain_at, &[]);
        let cached = job(&cached_at, &["--cache", "64MB"]);
        let refused = loaderctl(&scope, &["run", "--samples", "64", "--epochs", "2", "--cache", "1MB"]);
        let no_dir = loaderctl(&scope, &[
            "run", "--dataset", "imagefolder", "--path", &root, "--epochs", "2", "--cache", "1MB", "--cache-dir", "/nonexistent/dir",
        ]);
        let no_budget = loaderctl(&scope, &["run", "--dataset", "imagefolder", "--path", &root, "--cache-dir", "/tmp"]);
        (plain, cached, (refused, no_dir, no_budget))
    });
    let (refused, no_dir, no_budget) = refused;
    for out in [&plain, &cached] {
        assert_eq!(out.0, Some(0), "stderr: {:?}", out.2);
    }
    let read = |path: &Path| std::fs::read_to_string(path).expect("checksums");
    let (plain_lines, cached_lines) = (read(&plain_sums), read(&cached_sums));
    assert_eq!(plain_lines.lines().count(), 15, "19 files an epoch (one corrupt, skipped) in batches of 4, 3 epochs");
    assert_eq!(cached_lines, plain_lines, "the same batches with kept frames");
    let report: serde_json::Value = serde_json::from_str(cached.1.last().expect("a report line")).expect("json report");
    let cache = &report["cache"];
    assert_eq!(cache["on"], true, "{report}");
    let (hits, misses) = (cache["hits"].as_u64().unwrap_or(0), cache["misses"].as_u64().unwrap_or(0));
    assert!(hits >= 18 && hits + misses >= 54 && cache["stored_bytes"].as_u64().unwrap_or(0) > 0, "{report}");
    assert_eq!(report["epochs_samples_per_s"].as_array().map(Vec::len), Some(3), "{report}");
    let plain_report: serde_json::Value = serde_json::from_str(plain.1.last().expect("a report line")).expect("json report");
    assert!(plain_report.get("cache").is_none(), "{plain_report}");
    assert_eq!(refused.0, Some(1));
    assert_eq!(
        refused.2,
        vec!["loaderctl: error: --cache: only an image_folder or webdataset job keeps frames (its decoded images)".to_owned()]
    );
    assert_eq!((no_dir.0, no_dir.2.len()), (Some(1), 1), "{:?}", no_dir.2);
    assert!(no_dir.2[0].starts_with("loaderctl: error: --cache: sample cache: /nonexistent/dir: "), "{:?}", no_dir.2);
    assert_eq!(no_budget.0, Some(2), "{:?}", no_budget.2);
    assert_eq!(
        no_budget.2,
        vec!["loaderctl: error: the following required arguments were not provided: --cache <SIZE> (see --help)".to_owned()],
        "--cache-dir needs --cache"
    );
}

/// A worker started on its own with `--cache` (a remote worker: no trainer
/// hands it a cache) keeps an image job's frames in a cache it makes.
/// Three epochs of random crops and flips give the samples of a worker
/// without it, pixel for pixel, and the coordinator's job info counts the
/// cache's reads. Once the job's trainer is done its dataset closes, and
/// the next image job keeps its frames in the same budget.
#[test]
fn a_worker_started_with_a_cache_keeps_frames_and_gives_the_same_samples() {
    let folder = ImageFolder::write();
    let job = |seed: u64| {
        spec::image_folder(folder.path())
            .transforms(transforms::standard_train(224))
            .batch_size(4)
            .epochs(3)
            .shuffle(seed)
            .on_corrupt(CorruptPolicy::Skip)
            .build()
            .expect("image folder spec")
    };
    let (first, next) = (job(11), job(12));
    // The corrupt file fails at its header, before the cache: every read
    // the cache counts is of a good image, once an epoch.
    let reads = 3 * (folder.labels.len() as u64 - 1);
    let (plain, cached, again, jobs) = run(Duration::from_secs(240), move |scope| {
        let plain = {
            let cluster = Cluster::start(&scope, 1);
            consume_images(cluster.url(), first.clone(), 224).expect("a worker without a cache")
        };
        let mut cluster = Cluster::builder().start(&scope);
        cluster.add_worker_with(&["--cache", "64MB"]);
        let cached = consume_images(cluster.url(), first, 224).expect("a worker with a cache");
        let again = consume_images(cluster.url(), next, 224).expect("the next job");
        // The workers report cache use with their heartbeats.
        let jobs = cluster.admin().wait_for("every read of both jobs reported", Duration::from_secs(20), |admin| {
            let jobs = admin.jobs()?;
            let read = |j: &loader_proto::pb::JobInfo| j.cache.as_ref().map_or(0, |c| c.hits + c.misses);
            if jobs.len() == 2 && jobs.iter().all(|j| read(j) >= reads) { Ok(Some(jobs)) } else { Err(format!("{jobs:?}")) }
        });
        (plain, cached, again, jobs)
    });
    let good = folder.labels.len() - 1;
    assert_eq!(plain.len(), 3 * good, "every sample but the corrupt one, 3 epochs");
    assert_eq!(cached, plain, "the same samples, pixel for pixel, with kept frames");
    assert_eq!(again.len(), 3 * good);
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    for info in &jobs {
        let cache = info.cache.as_ref().unwrap_or_else(|| panic!("a job used no cache: {info:?}"));
        assert!(cache.off.is_empty(), "{cache:?}");
        // Epoch 1 decodes and keeps every frame; epochs 2 and 3 cut from them.
        assert!(cache.hits >= 2 * good as u64 && cache.stored_bytes > 0, "{cache:?}");
        // Every read counted (a batch made twice, a straggler's backup, counts
        // its reads too).
        assert!(cache.hits + cache.misses >= reads, "every read counted: {cache:?}");
    }
}

/// `loader-worker --cache SIZE --cache-dir DIR --cache-shared` on two
/// workers of one node: each image is decoded once on the node, whichever
/// worker makes its sample later reads it, and the cache's file goes once
/// the job is done. Each worker's own cache would find about half.
#[test]
fn workers_of_one_node_share_a_cache_and_each_image_is_decoded_once() {
    let folder = ImageFolder::write();
    let dir = tempfile::tempdir().expect("cache dir");
    let job = spec::image_folder(folder.path())
        .transforms(transforms::standard_train(224))
        .batch_size(2)
        .epochs(3)
        .shuffle(21)
        .on_corrupt(CorruptPolicy::Skip)
        .build()
        .expect("image folder spec");
    let cache_dir = dir.path().to_str().expect("utf-8 path").to_owned();
    let files = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .expect("read the cache dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    };
    let reads = 3 * (folder.labels.len() as u64 - 1);
    let (plain, cached, jobs, workers) = run(Duration::from_secs(240), move |scope| {
        let plain = {
            let cluster = Cluster::start(&scope, 1);
            consume_images(cluster.url(), job.clone(), 224).expect("a worker without a cache")
        };
        let mut cluster = Cluster::builder().start(&scope);
        for _ in 0..2 {
            cluster.add_worker_with(&["--cache", "64MB", "--cache-dir", &cache_dir, "--cache-shared"]);
        }
        let cached = consume_images(cluster.url(), job, 224).expect("workers with a shared cache");
        let jobs = cluster.admin().wait_for("every read of the job reported", Duration::from_secs(20), |admin| {
            let jobs = admin.jobs()?;
            let read = |j: &loader_proto::pb::JobInfo| j.cache.as_ref().map_or(0, |c| c.hits + c.misses);
            if jobs.iter().all(|j| read(j) >= reads) { Ok(Some(jobs)) } else { Err(format!("{jobs:?}")) }
        });
        let workers = cluster.admin().workers().expect("workers");
        // Both workers close the job's dataset once its trainer has ended;
        // the last to let go removes the file.
        wait_for("the cache's file going with the job", Duration::from_secs(20), || {
            let left = files(Path::new(&cache_dir));
            if left.is_empty() { Ok(()) } else { Err(format!("left: {left:?}")) }
        });
        (plain, cached, jobs, workers)
    });
    let good = folder.labels.len() - 1;
    assert_eq!(plain.len(), 3 * good, "every sample but the corrupt one, 3 epochs");
    assert_eq!(cached, plain, "the same samples, pixel for pixel, from a shared cache");
    assert!(workers.len() == 2 && workers.iter().all(|w| w.delivered > 0), "both workers made batches: {workers:?}");
    let cache = jobs[0].cache.as_ref().unwrap_or_else(|| panic!("the job used no cache: {jobs:?}"));
    assert!(cache.off.is_empty(), "{cache:?}");
    // Epoch 1 decodes each image once on the node; epochs 2 and 3 find
    // every frame, whichever worker kept it.
    // A read that meets another worker keeping the same frame waits for
    // it (a hit), so no image is decoded twice even when the workers are
    // in different epochs at once.
    assert!(cache.hits >= 2 * good as u64, "{cache:?}");
    assert!(cache.misses <= good as u64 + 1, "{cache:?}");
    assert!(cache.hits + cache.misses >= reads, "every read counted: {cache:?}");
}
