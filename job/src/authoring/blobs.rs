//! The spec's side of a job's blobs (`JobSpec.blobs`: the pickled dataset
//! of a spec's `python: {pickle_file: PATH}`, an image folder's manifest;
//! see `loader_proto::blob`): when the spec is built, each blob's file is
//! hashed (SHA-256, the digest the workers check it by) and measured, so
//! the spec names the bytes, not the path. Sending those bytes to the
//! coordinator is the trainer SDK's (`loader_client`'s `blobs` module),
//! after the spec is built.

use std::path::Path;

use loader_proto::blob::{IMAGE_FOLDER_MANIFEST, MAX_BLOBS};
use loader_proto::pb::{BlobRef, DatasetSpec, JobSpec, dataset_spec::Kind};

use crate::Error;

/// Adds the blob of every image folder's manifest (its own, or a mixture
/// source's under `source/manifest`), as a `pickle_file` is one: always,
/// since building the spec lists the folder from the manifest, so the
/// submitter reads the file anyway; a worker on the submitter's host finds
/// it in the host's blob directory when the SDK wrote it there
/// (`Loader.local`'s, `native_transforms`) and fetches it once otherwise.
/// A spec whose manifest lies on a filesystem the workers share works as
/// before, from the same bytes. A blob of that name already there (a spec
/// built twice) is kept.
pub(crate) fn carry_manifests(spec: &mut JobSpec) {
    let mut manifests = Vec::new();
    match spec.dataset.as_ref().and_then(|d| d.kind.as_ref()) {
        Some(Kind::ImageFolder(f)) => manifests.push((IMAGE_FOLDER_MANIFEST.to_owned(), f.manifest.clone())),
        Some(Kind::Mix(m)) => {
            for source in &m.sources {
                if let Some(DatasetSpec { kind: Some(Kind::ImageFolder(f)) }) = &source.dataset {
                    manifests.push((format!("{}/{IMAGE_FOLDER_MANIFEST}", source.name), f.manifest.clone()));
                }
            }
        }
        _ => {}
    }
    for (name, source) in manifests {
        if source.is_empty() || spec.blobs.iter().any(|b| b.name == name) {
            continue;
        }
        spec.blobs.push(BlobRef { name, source, ..Default::default() });
    }
}

/// Adds each image folder's listing from a bucket (`listings`: the blob's
/// name and its bytes, `loader_listing::bucket_listing`) as a blob, so its
/// workers read the submitter's listing instead of listing the store again.
/// A blob of that name already there (a spec built twice) is replaced: the
/// folder was listed again. Past the limit of blobs a job may carry, a
/// folder travels without its listing, and its workers list it themselves;
/// so does one whose listing cannot be written to a temporary file (the
/// listing saves requests, the job does not need it).
pub(crate) fn carry_listings(spec: &mut JobSpec, listings: Vec<(String, Vec<u8>)>) {
    for (name, bytes) in listings {
        spec.blobs.retain(|b| b.name != name);
        if spec.blobs.len() >= MAX_BLOBS {
            continue;
        }
        match listing_file(&bytes) {
            Ok((sha256, size, source)) => spec.blobs.push(BlobRef { name, sha256, size, source }),
            Err(e) => tracing::warn!(
                "the workers will list the bucket themselves: cannot keep its listing in {}: {e}",
                std::env::temp_dir().display()
            ),
        }
    }
}

/// The files listings are kept in, open for the rest of the process, by
/// their bytes' SHA-256: a blob names a file, which the SDK reads when it
/// submits the job (maybe long after the spec was built, maybe again for a
/// resumed one). Each is an unlinked temporary file named by
/// `/proc/self/fd/N`, so nothing is left behind however the process ends;
/// the same listing built again reuses its file.
static LISTING_FILES: std::sync::Mutex<Vec<(String, std::fs::File)>> = std::sync::Mutex::new(Vec::new());

/// `bytes` in a listing file: its SHA-256, size and path.
fn listing_file(bytes: &[u8]) -> std::io::Result<(String, u64, String)> {
    use std::io::Write;
    use std::os::fd::AsRawFd;

    let mut hash = loader_proto::blob::Sha256::default();
    hash.update(bytes);
    let sha256 = hash.finish();
    let mut files = LISTING_FILES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let fd = match files.iter().find(|(held, _)| *held == sha256) {
        Some((_, file)) => file.as_raw_fd(),
        None => {
            let mut file = tempfile::tempfile()?;
            file.write_all(bytes)?;
            let fd = file.as_raw_fd();
            files.push((sha256.clone(), file));
            fd
        }
    };
    Ok((sha256, bytes.len() as u64, format!("/proc/self/fd/{fd}")))
}

/// Fills in the hash and size of every blob of `spec` that names a file
/// and has no hash yet.
pub(crate) fn hash_sources(spec: &mut JobSpec) -> Result<(), Error> {
    for blob in spec
        .blobs
        .iter_mut()
        .filter(|b| !b.source.is_empty() && b.sha256.is_empty())
    {
        let (sha256, size) =
            loader_proto::blob::hash_file(Path::new(&blob.source)).map_err(|e| {
                Error::BlobFile {
                    name: blob.name.clone(),
                    path: blob.source.clone().into(),
                    cause: e.to_string(),
                }
            })?;
        blob.sha256 = sha256;
        blob.size = size;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use loader_proto::pb::BlobRef;

    use super::*;

    fn spec_of(source: &str) -> JobSpec {
        let blob = BlobRef {
            name: "pickle_file".into(),
            source: source.into(),
            ..Default::default()
        };
        JobSpec {
            blobs: vec![blob],
            ..Default::default()
        }
    }

    #[test]
    fn files_are_hashed_and_measured() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("data.pkl");
        std::fs::write(&path, b"abc").expect("write");
        let mut spec = spec_of(&path.to_string_lossy());
        hash_sources(&mut spec).expect("hashed");
        assert_eq!(
            spec.blobs[0].sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(spec.blobs[0].size, 3);

        let mut missing = spec_of("/nonexistent/data.pkl");
        let e = hash_sources(&mut missing).expect_err("no file").to_string();
        assert!(
            e.starts_with("blob `pickle_file` /nonexistent/data.pkl: No such file"),
            "{e}"
        );
    }

    #[test]
    fn a_listing_is_a_blob_of_its_bytes_replaced_when_listed_again_and_within_the_limit() {
        let mut spec = spec_of("/data.pkl");
        carry_listings(&mut spec, vec![("listing".into(), b"first".to_vec())]);
        carry_listings(&mut spec, vec![("listing".into(), b"second".to_vec())]);
        let [pickle, listing] = &spec.blobs[..] else { panic!("two blobs: {:?}", spec.blobs) };
        assert_eq!(pickle.name, "pickle_file");
        assert_eq!(listing.name, "listing");
        assert_eq!(std::fs::read(&listing.source).expect("the listing's file"), b"second");
        // Named as every blob is, by the hash of its bytes: what the SDK
        // uploads and the workers check.
        let mut hashed = listing.clone();
        hashed.sha256.clear();
        let mut again = JobSpec { blobs: vec![hashed], ..Default::default() };
        hash_sources(&mut again).expect("hashed");
        assert_eq!((&again.blobs[0].sha256, again.blobs[0].size), (&listing.sha256, 6));

        let mut full = JobSpec {
            blobs: (0..MAX_BLOBS).map(|i| BlobRef { name: format!("b{i}"), ..Default::default() }).collect(),
            ..Default::default()
        };
        carry_listings(&mut full, vec![("s/listing".into(), b"x".to_vec())]);
        assert_eq!(full.blobs.len(), MAX_BLOBS, "past the limit, the workers list the folder");
    }
}
