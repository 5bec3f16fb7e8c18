//! Dataset files that change under a worker's mapping (issue 52): a token
//! file, an `.npy` array and a WebDataset tar truncated while a job reads
//! them fail the job (or skip its samples, per `on_corrupt`), naming the
//! file; the workers stay up, and the next job on them completes. Before,
//! the first read past the new end was a SIGBUS that killed every worker
//! reading the file. docs/reliability.md has the row.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use loader_client::spec::{self, transforms};
use loader_client::{CorruptPolicy, Dtype, JobSpec, Loader};
use loader_e2e::dataset_files::{write_npy, write_shard};
use loader_e2e::{Cluster, run};

/// Workers reading the file.
const WORKERS: usize = 2;

/// Batches read before the file is truncated.
const BEFORE: usize = 4;

/// What the trainer saw: batches before the error (or the end), and the
/// error.
struct Outcome {
    batches: usize,
    error: Option<String>,
}

/// Reads `job` from the cluster at `url`, truncating `path` to `keep`
/// bytes after [`BEFORE`] batches, until the job fails or ends (bounded).
fn read_truncating(url: String, job: JobSpec, path: &Path, keep: u64) -> Outcome {
    let loader = Loader::builder(url).job(job).build().expect("loader");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut batches = 0;
    for batch in loader {
        match batch {
            Ok(_) => batches += 1,
            Err(e) => return Outcome { batches, error: Some(e.to_string()) },
        }
        if batches == BEFORE {
            std::fs::OpenOptions::new().write(true).open(path).expect("open").set_len(keep).expect("truncate");
        }
        assert!(Instant::now() < deadline, "the job neither failed nor ended within 60 s");
    }
    Outcome { batches, error: None }
}

/// Truncates `path` under `job` (long: many epochs) on a fresh cluster, and
/// checks what the issue asks: the error names the file, no worker died,
/// and a second job on the same workers completes.
fn truncated_mid_job(job: JobSpec, path: PathBuf, keep: u64) -> Outcome {
    run(Duration::from_secs(180), move |scope| {
        let mut cluster = Cluster::start(&scope, WORKERS);
        let outcome = read_truncating(cluster.url(), job, &path, keep);
        for worker in &mut cluster.workers {
            assert_eq!(worker.wait_exit(Duration::ZERO), None, "a worker died: {:?}", worker.stderr());
        }
        let next = spec::synthetic(64, &[16], Dtype::U8).batch_size(8).build().expect("spec");
        let delivered = Loader::builder(cluster.url()).job(next).build().expect("loader").map(|b| b.expect("batch")).count();
        assert_eq!(delivered, 8, "the next job on the same workers completes");
        outcome
    })
}

fn assert_names_the_change(outcome: &Outcome, path: &Path) {
    let error = outcome.error.as_deref().unwrap_or_else(|| panic!("the job ended after {} batches without an error", outcome.batches));
    // Read by a worker that had the file open: a corrupt sample. Opened by
    // a worker only after the truncation (its first task came after the
    // trainer's first batches; CI saw it once): the file is not the size
    // the job was planned for. Either way the job fails naming the file
    // and saying that it changed.
    let read = error.contains(&format!("corrupt sample {}", path.display())) && error.contains("the file changed while the job read it");
    let opened = error.contains(&format!("dataset {}: file holds ", path.display()))
        && error.contains("the file changed since the job was planned");
    assert!(read || opened, "{error}");
    assert!(!error.contains('\n'), "one line: {error}");
    assert!(outcome.batches >= BEFORE);
}

#[test]
fn a_token_file_truncated_mid_job_fails_the_job_naming_it_and_no_worker_dies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tokens.bin");
    // 2^18 uint16 ids: 2,047 windows of 128, 256 batches an epoch.
    let ids: Vec<u8> = (0..1u32 << 18).flat_map(|i| (i as u16).to_le_bytes()).collect();
    std::fs::write(&path, &ids).expect("write tokens");
    let job = spec::tokens(&path, Dtype::U16, 128).batch_size(8).epochs(50).shuffle(3).build().expect("spec");
    let outcome = truncated_mid_job(job, path.clone(), ids.len() as u64 / 8);
    assert_names_the_change(&outcome, &path);
}

#[test]
fn an_npy_file_truncated_mid_job_fails_the_job_naming_it_and_no_worker_dies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.npy");
    let rows = 8192u64;
    let data: Vec<u8> = (0..rows * 64).flat_map(|i| (i as f32).to_le_bytes()).collect();
    write_npy(&path, "<f4", &[rows, 64], &data);
    let job = spec::npy([("x", &path)]).batch_size(16).epochs(50).shuffle(5).build().expect("spec");
    let outcome = truncated_mid_job(job, path.clone(), 4096);
    assert_names_the_change(&outcome, &path);
}

#[test]
fn a_tar_shard_truncated_mid_job_skips_its_lost_samples_naming_it_and_no_worker_dies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("train-000.tar");
    write_shard(&path, 0, 64);
    let job = spec::webdataset([&path])
        .transforms([transforms::decode(), transforms::resize(16), transforms::center_crop(16)])
        .batch_size(4)
        .epochs(30)
        .on_corrupt(CorruptPolicy::Skip)
        .build()
        .expect("spec");
    let size = std::fs::metadata(&path).expect("stat").len();
    let outcome = truncated_mid_job(job, path.clone(), size / 4);
    // Skip: the job goes on to its end, every sample past the cut left out
    // (the worker logs each, naming the shard).
    assert_eq!(outcome.error, None);
    assert!(outcome.batches >= BEFORE);
}

/// A tmpfs of `size` mounted on `dir` for the life of the value; `Err`
/// says why this process may not mount (not root: it needs CAP_SYS_ADMIN).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("no `mount` command: {e}"))?;
        if !out.status.success() {
            let said = String::from_utf8_lossy(&out.stderr);
            return Err(format!("mounting a tmpfs needs root (CAP_SYS_ADMIN): {}", said.trim()));
        }
        Ok(Tmpfs(dir.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_cache_dir_on_a_full_tmpfs_stops_caching_naming_it_and_the_job_completes() {
    let mount_point = tempfile::tempdir().expect("tempdir");
    // Room for the cache's index and a frame or two: the rest is full.
    let tmpfs = loader_e2e::needs(Tmpfs::mount(mount_point.path(), "16k"));
    let folder = loader_e2e::dataset_files::ImageFolder::write();
    let good = folder.labels.len() - 1; // one file is corrupt, and skipped
    let job = spec::image_folder(folder.path())
        .transforms(transforms::standard_train(32))
        .batch_size(4)
        .epochs(3)
        .shuffle(7)
        .on_corrupt(CorruptPolicy::Skip)
        .build()
        .expect("spec");
    let dir = tmpfs.0.display().to_string();
    let (delivered, log) = run(Duration::from_secs(120), move |scope| {
        let mut cluster = Cluster::builder().capture_worker_stderr().start(&scope);
        cluster.add_worker_with(&["--cache", "64MB", "--cache-dir", &dir]);
        let loader = Loader::builder(cluster.url()).job(job).build().expect("loader");
        let delivered: usize = loader.map(|b| b.expect("batch").len()).sum();
        let worker = &mut cluster.workers[0];
        assert_eq!(worker.wait_exit(Duration::ZERO), None, "the worker died: {:?}", worker.stderr());
        (delivered, worker.stderr())
    });
    assert_eq!(delivered, 3 * good, "every sample of every epoch, cache or not");
    let said: Vec<&String> = log.iter().filter(|l| l.contains("is full")).collect();
    assert_eq!(said.len(), 1, "said once: {log:?}");
    assert!(said[0].contains(&tmpfs.0.display().to_string()), "names the directory: {}", said[0]);
    drop(tmpfs);
}
