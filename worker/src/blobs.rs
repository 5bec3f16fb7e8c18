//! The blobs a job needs (`JobSpec.blobs`: a pickled Python dataset, say),
//! made local before its dataset opens, for any dataset kind.
//!
//! Each blob is looked up in the host's blob directory
//! (`loader_process::blobs`), where the trainer's own `Loader.local` wrote
//! it or another worker of this host fetched it; only when it is not there
//! is it fetched from the coordinator (`WorkerService.GetBlob`, one chunk
//! of at most `loader_proto::blob::MAX_CHUNK` per call, so a fetch is
//! bounded call by call and resumes where it stopped after a failed call),
//! hashed on the way and renamed into place. Fetching runs on the producer
//! thread, which blocks on the worker's runtime for it: heartbeats go on
//! meanwhile, and the job's batches wait for its dataset anyway.
//!
//! A `custom` dataset finds each blob in its params, under the blob's name,
//! as `/proc/self/fd/N`: a descriptor this module holds open while the
//! dataset opens, so the bytes stay readable even if the trainer removes
//! the file in between (it does when its loader closes). An `image_folder`
//! finds its manifest's blob (`loader_proto::blob::IMAGE_FOLDER_MANIFEST`)
//! the same way, as its `manifest`, in place of the submitter's path. After
//! the open, nothing of the blob is held here: what the dataset kept (an
//! unpickled Python dataset, the listing) is the dataset's.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Duration;

use loader_process::blobs::{BlobDir, ObtainError};
use loader_process::grpc::Channel;
use loader_process::retry::Backoff;
use loader_proto::PROTOCOL_VERSION;
use loader_proto::blob::{IMAGE_FOLDER_LISTING, IMAGE_FOLDER_MANIFEST, MAX_CHUNK};
use loader_proto::pb::worker_service_client::WorkerServiceClient;
use loader_proto::pb::{BlobRef, GetBlobRequest, JobSpec, dataset_spec::Kind};
use tokio::runtime::Handle;
use tokio::time::Instant;
use tonic::Code;

/// How long a fetch waits for a blob the coordinator does not hold yet (a
/// restarted coordinator gets it again when the trainer reopens) or for a
/// coordinator that does not answer, without a chunk arriving, before the
/// job's task fails.
const PATIENCE: Duration = Duration::from_secs(30);
/// Longest one `GetBlob` call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Pauses between failed calls.
const BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));

/// Why a job's blob could not be made local; one line, for the task's
/// failure report.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BlobError {
    /// Fetching it from the coordinator failed.
    #[error("blob `{name}` ({sha256}): fetching it from coordinator {addr} failed: {cause}")]
    Fetch {
        /// The blob's name in the spec.
        name: String,
        /// Its hash.
        sha256: String,
        /// Coordinator URL.
        addr: String,
        /// The last failure.
        cause: String,
    },
    /// Writing it into the host's blob directory failed, or what arrived
    /// is not the blob.
    #[error("blob `{name}`: {cause}")]
    Store {
        /// The blob's name in the spec.
        name: String,
        /// What failed.
        cause: String,
    },
}

/// Makes a job's blobs local (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct BlobFetcher {
    /// `WorkerService` on the coordinator link's channel.
    client: WorkerServiceClient<Channel>,
    /// Coordinator URL, for messages.
    addr: String,
    /// The worker's runtime, which the producer thread blocks on to fetch.
    runtime: Handle,
    /// The host's blob directory, opened (created if need be) when a job
    /// needs it.
    dir: PathBuf,
}

/// A job's blobs, open, by name, while its dataset opens.
#[derive(Debug)]
pub(crate) struct LocalBlobs(Vec<(String, File)>);

impl BlobFetcher {
    /// Fetches over `channel` (the coordinator at `addr`) into the blob
    /// directory `dir`.
    pub(crate) fn new(channel: Channel, addr: String, runtime: Handle, dir: PathBuf) -> Self {
        Self { client: WorkerServiceClient::new(channel), addr, runtime, dir }
    }

    /// Every blob of `spec`, open: from the host's blob directory, fetched
    /// into it first when it is not there. Blocks; not for async code.
    pub(crate) fn localize(&self, spec: &JobSpec) -> Result<LocalBlobs, BlobError> {
        let mut open = Vec::with_capacity(spec.blobs.len());
        for blob in &spec.blobs {
            let dir = BlobDir::open(&self.dir)
                .map_err(|e| BlobError::Store { name: blob.name.clone(), cause: e.to_string() })?;
            let file = dir
                .obtain(&blob.sha256, blob.size, PATIENCE + CALL_TIMEOUT, |w| self.fetch(blob, w))
                .map_err(|e| match e {
                    ObtainError::Fill(fetch) => fetch,
                    other => BlobError::Store { name: blob.name.clone(), cause: other.to_string() },
                })?;
            open.push((blob.name.clone(), file));
        }
        Ok(LocalBlobs(open))
    }

    /// Fetches `blob` from the coordinator into `out`, chunk by chunk.
    fn fetch(&self, blob: &BlobRef, out: &mut impl Write) -> Result<(), BlobError> {
        let failed = |cause: String| BlobError::Fetch {
            name: blob.name.clone(),
            sha256: blob.sha256.clone(),
            addr: self.addr.clone(),
            cause,
        };
        let started = std::time::Instant::now();
        let fetched = self.runtime.block_on(async {
            let mut offset = 0u64;
            // Renewed by every chunk that arrives.
            let mut deadline = Instant::now() + PATIENCE;
            let mut pauses = BACKOFF.pauses();
            while offset < blob.size {
                let request = GetBlobRequest {
                    protocol_version: PROTOCOL_VERSION,
                    sha256: blob.sha256.clone(),
                    offset,
                    max_bytes: MAX_CHUNK as u32,
                };
                let mut client = self.client.clone();
                let outcome = tokio::time::timeout(CALL_TIMEOUT, client.get_blob(request)).await;
                let status = match outcome {
                    Ok(Ok(reply)) => {
                        let reply = reply.into_inner();
                        if reply.size != blob.size {
                            return Err(format!("the coordinator holds {} bytes, the job says {}", reply.size, blob.size));
                        }
                        if reply.data.is_empty() {
                            return Err(format!("no bytes at offset {offset} of {}", blob.size));
                        }
                        out.write_all(&reply.data).map_err(|e| format!("cannot write it: {e}"))?;
                        offset += reply.data.len() as u64;
                        deadline = Instant::now() + PATIENCE;
                        pauses = BACKOFF.pauses();
                        continue;
                    }
                    Ok(Err(status)) => status,
                    Err(_) => tonic::Status::deadline_exceeded(format!("no answer within {CALL_TIMEOUT:?}")),
                };
                // Not held yet (the trainer uploads it again after a
                // coordinator restart) or not reachable: wait a while.
                let retryable =
                    matches!(status.code(), Code::NotFound | Code::Unavailable | Code::DeadlineExceeded | Code::Unknown);
                let pause = pauses.next().unwrap_or(BACKOFF.max);
                if !retryable || Instant::now() + pause > deadline {
                    return Err(crate::error::one_line(&status));
                }
                tracing::debug!(sha256 = blob.sha256, "blob fetch failed, retrying: {}", status.message());
                tokio::time::sleep(pause).await;
            }
            Ok(())
        });
        fetched.map_err(failed)?;
        tracing::info!(
            name = blob.name,
            sha256 = blob.sha256,
            bytes = blob.size,
            "blob fetched from the coordinator in {:.2}s",
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

impl LocalBlobs {
    /// `spec` as its dataset opens it: a `custom` dataset's params name
    /// each blob's local path under the blob's name, an `image_folder`'s
    /// manifest is its blob `manifest` and its listing from a bucket its
    /// blob `listing`; a mixture's source `s` finds blob
    /// `s/x` as `x`.
    pub(crate) fn apply(&self, spec: &JobSpec) -> JobSpec {
        let mut spec = spec.clone();
        match spec.dataset.as_mut().and_then(|d| d.kind.as_mut()) {
            Some(Kind::Mix(mix)) => {
                for source in &mut mix.sources {
                    if let Some(kind) = source.dataset.as_mut().and_then(|d| d.kind.as_mut()) {
                        let prefix = format!("{}/", source.name);
                        self.give(kind, |name| name.strip_prefix(&prefix));
                    }
                }
            }
            Some(kind) => self.give(kind, Some),
            None => {}
        }
        spec
    }

    /// Gives `kind` the local path of each blob that `own` names as one of
    /// its own (the name it has there; None for another source's).
    fn give<'a>(&'a self, kind: &mut Kind, own: impl Fn(&'a str) -> Option<&'a str>) {
        let path = |file: &File| format!("/proc/self/fd/{}", file.as_raw_fd());
        for (name, file) in &self.0 {
            match (&mut *kind, own(name)) {
                (Kind::Custom(custom), Some(param)) => {
                    custom.params.insert(param.to_owned(), path(file));
                }
                (Kind::ImageFolder(folder), Some(IMAGE_FOLDER_MANIFEST)) => folder.manifest = path(file),
                (Kind::ImageFolder(folder), Some(IMAGE_FOLDER_LISTING)) => folder.listing = path(file),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Read;

    use loader_process::blobs::Sha256;
    use loader_proto::pb::{CustomSpec, DatasetSpec};

    use super::*;

    #[test]
    fn a_custom_dataset_reads_each_blob_at_its_path_even_once_the_file_is_gone() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = BlobDir::open(root.path().join("blobs")).expect("dir");
        let mut sha = Sha256::default();
        sha.update(b"pickled");
        let sha = sha.finish();
        let file = dir.obtain(&sha, 7, Duration::ZERO, |w| w.write_all(b"pickled")).expect("stored");
        std::fs::remove_file(dir.file_of(&sha)).expect("the trainer's loader closed");
        let spec = JobSpec {
            dataset: Some(DatasetSpec {
                kind: Some(Kind::Custom(CustomSpec {
                    name: "python".into(),
                    num_samples: 1,
                    params: HashMap::from([("args".to_owned(), "{}".to_owned())]),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        };
        let local = LocalBlobs(vec![("pickle_file".into(), file)]);
        let opened = local.apply(&spec);
        let Some(Kind::Custom(c)) = opened.dataset.and_then(|d| d.kind) else { panic!("custom") };
        assert_eq!(c.params["args"], "{}");
        let mut bytes = Vec::new();
        File::open(&c.params["pickle_file"]).expect("open by path").read_to_end(&mut bytes).expect("read");
        assert_eq!(bytes, b"pickled");
    }

    /// A blob stored in `dir` as a fetch from the coordinator stores it.
    fn stored(dir: &BlobDir, bytes: &[u8]) -> File {
        let mut sha = Sha256::default();
        sha.update(bytes);
        dir.obtain(&sha.finish(), bytes.len() as u64, Duration::ZERO, |w| w.write_all(bytes)).expect("stored")
    }

    #[test]
    fn an_image_folder_lists_the_samples_of_its_manifest_blob_where_the_submitters_path_is_unreadable() {
        use crate::dataset::{Dataset, ImageFolder, SampleKey};
        use loader_proto::pb::{Decode, ImageFolderSpec, MixSource, MixSpec, Resize, Transform, transform::Op};

        let root = tempfile::tempdir().expect("tempdir");
        let mut jpeg = Vec::new();
        jpeg_encoder::Encoder::new(&mut jpeg, 90)
            .encode(&[90u8; 8 * 6 * 3], 8, 6, jpeg_encoder::ColorType::Rgb)
            .expect("encode");
        for rel in ["a/x.jpg", "b/y.jpg", "b/z.jpg"] {
            let p = root.path().join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, &jpeg).expect("write");
        }
        // Labels and an order the class folders would not give.
        let text = b"b/y.jpg\t7\na/x.jpg\t3\n";
        let submitter = root.path().join("trainer-host/manifest.tsv");
        std::fs::create_dir_all(submitter.parent().expect("parent")).expect("mkdir");
        std::fs::write(&submitter, text).expect("write");
        let listing = loader_listing::image_folder::list(root.path(), Some(&submitter)).expect("the submitter lists");
        // Another host: the blob fetched into its directory, the
        // submitter's file out of reach.
        let dir = BlobDir::open(root.path().join("worker-host")).expect("dir");
        let file = stored(&dir, text);
        std::fs::remove_file(&submitter).expect("not on this host");
        let folder = ImageFolderSpec {
            path: root.path().display().to_string(),
            manifest: submitter.display().to_string(),
            num_samples: listing.samples.len() as u64,
            fingerprint: listing.fingerprint(),
            listing: String::new(),
        };
        let spec = JobSpec {
            dataset: Some(DatasetSpec { kind: Some(Kind::ImageFolder(folder.clone())) }),
            ..Default::default()
        };
        let local = LocalBlobs(vec![(IMAGE_FOLDER_MANIFEST.into(), file)]);
        let Some(Kind::ImageFolder(opened)) = local.apply(&spec).dataset.and_then(|d| d.kind) else {
            panic!("image folder")
        };
        let pipeline = [
            Transform { op: Some(Op::Decode(Decode {})) },
            Transform { op: Some(Op::Resize(Resize { size: vec![4, 4], ..Default::default() })) },
        ];
        let ds = ImageFolder::open(&opened, &pipeline).expect("the same listing as the submitter's");
        assert_eq!(ds.len(), 2);
        let mut image = vec![0u8; ds.tensors()[0].shape.iter().product::<u64>() as usize];
        let labels: Vec<i64> = (0..2)
            .map(|index| {
                let mut label = [0u8; 8];
                ds.read_into(SampleKey { seed: 1, epoch: 0, index }, &mut [&mut image[..], &mut label[..]]).expect("read");
                i64::from_le_bytes(label)
            })
            .collect();
        assert_eq!(labels, vec![7, 3], "the manifest's labels, in its order");
        let e = ImageFolder::open(&folder, &pipeline).expect_err("the path alone is out of reach").to_string();
        assert!(e.contains("manifest.tsv"), "{e}");

        // A mixture's source `s` takes the blob `s/manifest`, and only it.
        let source = |name: &str| MixSource {
            name: name.into(),
            weight: 1.0,
            dataset: Some(DatasetSpec { kind: Some(Kind::ImageFolder(folder.clone())) }),
        };
        let mixed = JobSpec {
            dataset: Some(DatasetSpec {
                kind: Some(Kind::Mix(MixSpec { sources: vec![source("s"), source("t")], ..Default::default() })),
            }),
            ..Default::default()
        };
        let local = LocalBlobs(vec![("s/manifest".into(), stored(&dir, text))]);
        let Some(Kind::Mix(mix)) = local.apply(&mixed).dataset.and_then(|d| d.kind) else { panic!("mix") };
        let manifests: Vec<String> = mix
            .sources
            .into_iter()
            .map(|s| match s.dataset.and_then(|d| d.kind) {
                Some(Kind::ImageFolder(f)) => f.manifest,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(manifests[0].starts_with("/proc/self/fd/"), "{manifests:?}");
        assert_eq!(manifests[1], folder.manifest, "another source's blob is not t's");
    }
}
