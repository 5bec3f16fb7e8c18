//! The spec's side of a job's blobs (`JobSpec.blobs`: the pickled dataset
//! of a spec's `python: {pickle_file: PATH}`, an image folder's manifest;
//! see `loader_proto::blob`): when the spec is built, each blob's file is
//! hashed (SHA-256, the digest the workers check it by) and measured, so
//! the spec names the bytes, not the path. Sending those bytes to the
//! coordinator is the trainer SDK's (`loader_client`'s `blobs` module),
//! after the spec is built.

use std::path::Path;

use loader_proto::blob::IMAGE_FOLDER_MANIFEST;
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
}
