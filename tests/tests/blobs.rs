//! Blobs end to end (a job's large files beside its spec; see
//! `loader_proto::blob`): a trainer uploads them through the SDK, a real
//! `loader-server` holds them within its budget and refuses jobs naming
//! blobs it does not hold, and real `loader-worker`s fetch each once per
//! host directory before they open the job; an image folder's manifest is
//! one, which a worker lists the folder from.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use loader_client::spec::transforms;
use loader_client::{Dtype, Loader, spec};
use loader_e2e::dataset_files::ImageFolder;
use loader_e2e::{Cluster, run};
use loader_proto::pb::dataset_spec::Kind;
use loader_process::grpc::endpoint;
use loader_process::security::ClientSecurity;
use loader_proto::pb::{self, trainer_service_client::TrainerServiceClient};
use tonic::Code;

/// 2.5 chunks of bytes that differ from chunk to chunk.
fn blob_bytes() -> Vec<u8> {
    (0..(5 << 19)).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

fn sha256(bytes: &[u8]) -> String {
    let mut sha = loader_process::blobs::Sha256::default();
    sha.update(bytes);
    sha.finish()
}

#[test]
fn workers_fetch_a_jobs_blob_once_per_host_directory_and_run_the_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("vocabulary.bin");
    let bytes = blob_bytes();
    std::fs::write(&file, &bytes).expect("write the blob");
    let (host_a, host_b) = (dir.path().join("host-a"), dir.path().join("host-b"));
    // Batches of 1 MiB, a little work each: a new job's first ranges go to
    // every waiting worker, so every worker opens the job.
    let job = spec::synthetic(1024, &[65536], Dtype::U8)
        .batch_size(16)
        .cost_ns(100_000)
        .blob("vocabulary", &file)
        .build()
        .expect("spec");
    assert_eq!(job.blobs[0].sha256, sha256(&bytes));
    let hosts = [host_a.clone(), host_a.clone(), host_b.clone()];
    let batches = run(Duration::from_secs(120), move |scope| {
        let mut cluster = Cluster::start(&scope, 0);
        // Two workers sharing one host's directory, one with its own.
        for host in &hosts {
            cluster.add_worker_with(&["--blob-dir", &host.to_string_lossy()]);
        }
        cluster.wait_for_workers(3);
        let loader = Loader::builder(cluster.url()).job(job).build().expect("loader");
        loader.into_iter().map(|b| b.expect("batch").len()).sum::<usize>()
    });
    assert_eq!(batches, 1024);
    for host in [&host_a, &host_b] {
        let fetched = host.join(sha256(&bytes));
        assert!(std::fs::read(&fetched).expect("fetched") == bytes, "{} holds the blob's bytes", fetched.display());
        assert_eq!(std::fs::metadata(&fetched).expect("stat").permissions().mode() & 0o777, 0o400, "read-only");
        let temporaries = std::fs::read_dir(host).expect("list").flatten().filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-")).count();
        assert_eq!(temporaries, 0, "no temporary file left in {}", host.display());
    }
}

#[test]
fn an_image_folders_manifest_travels_as_a_blob_and_a_worker_elsewhere_lists_the_folder_from_its_copy() {
    let folder = ImageFolder::write();
    // Every image but the corrupt one, in reverse order, labelled by
    // position: nothing the class folders would give.
    let mut images: Vec<String> = Vec::new();
    for class in loader_e2e::dataset_files::CLASSES {
        for entry in std::fs::read_dir(folder.path().join(class)).expect("class folder").flatten() {
            images.push(format!("{class}/{}", entry.file_name().to_string_lossy()));
        }
    }
    images.retain(|p| !p.ends_with("broken.jpg"));
    images.sort_unstable();
    images.reverse();
    let labels: Vec<i64> = (0..images.len() as i64).map(|i| i % 4).collect();
    let text: String = images.iter().zip(&labels).map(|(p, l)| format!("{p}\t{l}\n")).collect();
    let trainer = tempfile::tempdir().expect("tempdir");
    let manifest = trainer.path().join("manifest.tsv");
    std::fs::write(&manifest, &text).expect("write the manifest");
    let mut job = spec::image_folder(folder.path())
        .manifest(&manifest)
        .transforms(transforms::standard_train(32))
        .batch_size(5)
        .shuffle(3)
        .build()
        .expect("spec");
    let sha = sha256(text.as_bytes());
    let carried: Vec<(&str, &str)> = job.blobs.iter().map(|b| (b.name.as_str(), b.sha256.as_str())).collect();
    assert_eq!(carried, vec![("manifest", sha.as_str())]);
    // As on a worker host that does not mount the trainer's directory: the
    // path the spec names is not there, only the bytes the SDK uploads.
    if let Some(Kind::ImageFolder(f)) = job.dataset.as_mut().and_then(|d| d.kind.as_mut()) {
        f.manifest = "/nonexistent/trainer-host/manifest.tsv".into();
    }
    let host = trainer.path().join("worker-host");
    let worker_dir = host.clone();
    let got = run(Duration::from_secs(120), move |scope| {
        let mut cluster = Cluster::start(&scope, 0);
        cluster.add_worker_with(&["--blob-dir", &worker_dir.to_string_lossy()]);
        cluster.wait_for_workers(1);
        let loader = Loader::builder(cluster.url()).job(job).build().expect("loader");
        let mut got = Vec::new();
        for batch in loader {
            let batch = batch.expect("batch");
            let label: Vec<i64> = batch.tensor("label").expect("label").to_vec().expect("int64 labels");
            got.extend(batch.indices().iter().copied().zip(label));
        }
        got
    });
    let mut got = got;
    got.sort_unstable();
    let want: Vec<(u64, i64)> = labels.iter().enumerate().map(|(i, &l)| (i as u64, l)).collect();
    assert_eq!(got, want, "every sample of the manifest once, with its label");
    assert!(std::fs::read(host.join(&sha)).expect("fetched") == text.as_bytes(), "the worker fetched the manifest");
}

#[test]
fn the_coordinator_refuses_blobs_it_cannot_hold_and_jobs_naming_blobs_it_does_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("big.bin");
    let bytes = blob_bytes();
    std::fs::write(&file, &bytes).expect("write the blob");
    let job = spec::synthetic(64, &[4], Dtype::U8).batch_size(8).blob("big", &file).build().expect("spec");
    run(Duration::from_secs(60), move |scope| {
        let cluster = Cluster::builder().env("LOADER_BLOB_BUDGET", "1MiB").workers(1).start(&scope);
        // Over the budget: the SDK's upload is refused, naming the sizes.
        let e = Loader::builder(cluster.url()).job(job.clone()).build().expect_err("over the budget").to_string();
        assert!(e.contains("of 2.6 MB is larger than this coordinator's blob budget of 1.0 MB"), "{e}");
        assert!(!e.contains('\n'), "{e}");

        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let channel = endpoint(&cluster.url(), &ClientSecurity::none()).expect("url").connect_lazy();
            let mut client = TrainerServiceClient::new(channel);
            // A job naming a blob nobody uploaded.
            let request = pb::CreateOrAttachJobRequest { protocol_version: loader_proto::PROTOCOL_VERSION, spec: Some(job.clone()) };
            let status = client.create_or_attach_job(request).await.expect_err("blob not held");
            assert_eq!(status.code(), Code::FailedPrecondition);
            assert!(status.message().starts_with("the job needs blob `big`"), "{}", status.message());
            // Bytes that do not hash to the name they are sent under.
            let forged = pb::PutBlobRequest {
                protocol_version: loader_proto::PROTOCOL_VERSION,
                sha256: sha256(b"something else"),
                size: 3,
                offset: 0,
                data: b"abc".to_vec().into(),
            };
            let status = client.put_blob(forged).await.expect_err("hash differs");
            assert_eq!(status.code(), Code::InvalidArgument);
            assert!(status.message().contains("the uploaded bytes hash to"), "{}", status.message());
        });
    });
}
