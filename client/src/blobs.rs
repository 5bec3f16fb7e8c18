//! The blobs a trainer's job needs (`JobSpec.blobs`: the pickled dataset of
//! a spec's `python: {pickle_file: PATH}`; see `loader_proto::blob`), from
//! the file on the trainer's host to the coordinator.
//!
//! - When the spec is built (`loader_job::authoring`), each blob's file is hashed
//!   (SHA-256) and measured: the spec names the bytes, not the path.
//! - When the job is submitted ([`upload`]), each blob the coordinator does
//!   not hold yet goes up in chunks of `loader_proto::blob::MAX_CHUNK`
//!   (`TrainerService.PutBlob`), resuming where the coordinator says it
//!   stands, so an upload that was cut off, or shared with another rank
//!   uploading the same bytes, never starts over. A blob already held costs
//!   one call. Then the spec leaves without its sources ([`without_sources`]).
//! - A resumed job ([`carry_sources`]) takes its blobs' files from the spec
//!   given with the saved state, whose own spec has none.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use loader_process::grpc::Channel;
use loader_proto::PROTOCOL_VERSION;
use loader_proto::blob::MAX_CHUNK;
use loader_proto::pb::trainer_service_client::TrainerServiceClient;
use loader_proto::pb::{BlobRef, JobSpec, PutBlobRequest};

use crate::connect::{attempt, with_retries};
use crate::error::LoaderError;

/// `spec` as it leaves the trainer: no blob names a path of this host.
pub(crate) fn without_sources(mut spec: JobSpec) -> JobSpec {
    for blob in &mut spec.blobs {
        blob.source.clear();
    }
    spec
}

/// Gives each blob of `resumed` (the spec of a saved state, which names no
/// files) the file of the blob of the same name in `given` (the spec the
/// trainer gives now): the same bytes when they hash alike, else the
/// dataset the trainer gives now, as DataLoader would use it.
pub(crate) fn carry_sources(resumed: &mut JobSpec, given: Option<&JobSpec>) {
    let Some(given) = given else { return };
    for blob in resumed.blobs.iter_mut().filter(|b| b.source.is_empty()) {
        if let Some(now) = given.blobs.iter().find(|g| g.name == blob.name && !g.source.is_empty()) {
            if now.sha256 != blob.sha256 {
                tracing::info!(name = blob.name, "the resumed job's blob differs from the one given now; using the one given now");
            }
            *blob = now.clone();
        }
    }
}

/// Uploads every blob of `spec` that names a file and that the coordinator
/// at `address` does not hold yet.
pub(crate) async fn upload(
    address: &str,
    client: &TrainerServiceClient<Channel>,
    spec: &JobSpec,
) -> Result<(), LoaderError> {
    for blob in spec.blobs.iter().filter(|b| !b.source.is_empty()) {
        upload_one(address, client, blob).await?;
    }
    Ok(())
}

async fn upload_one(address: &str, client: &TrainerServiceClient<Channel>, blob: &BlobRef) -> Result<(), LoaderError> {
    let mut file = File::open(&blob.source).map_err(|e| file_error(blob, e.to_string()))?;
    let len = file.metadata().map_err(|e| file_error(blob, e.to_string()))?.len();
    if len != blob.size {
        return Err(file_error(blob, format!("holds {len} bytes, {} when the spec was built; build the spec again", blob.size)));
    }
    let started = std::time::Instant::now();
    let mut chunk = Vec::new();
    let mut offset = 0;
    loop {
        let request = PutBlobRequest {
            protocol_version: PROTOCOL_VERSION,
            sha256: blob.sha256.clone(),
            size: blob.size,
            offset,
            data: chunk.into(),
        };
        let at = with_retries(|| {
            let mut client = client.clone();
            let request = request.clone();
            async move { attempt(address, "PutBlob", client.put_blob(request)).await }
        })
        .await?;
        if at.held {
            break;
        }
        offset = at.next_offset;
        // A local file read from the page cache: far quicker than the call
        // that sends it, so it is not worth a blocking-pool hop.
        chunk = read_chunk(&mut file, offset, blob.size).map_err(|e| file_error(blob, e.to_string()))?;
    }
    tracing::debug!(name = blob.name, bytes = blob.size, "blob held by the coordinator after {:.2}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Up to `MAX_CHUNK` bytes of `file` from `offset`, up to `size`.
fn read_chunk(file: &mut File, offset: u64, size: u64) -> std::io::Result<Vec<u8>> {
    let len = usize::try_from(size.saturating_sub(offset)).unwrap_or(usize::MAX).min(MAX_CHUNK);
    let mut chunk = vec![0; len];
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(&mut chunk)?;
    Ok(chunk)
}

fn file_error(blob: &BlobRef, cause: String) -> LoaderError {
    LoaderError::Job(loader_job::Error::BlobFile { name: blob.name.clone(), path: blob.source.clone().into(), cause })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(name: &str, sha256: &str, source: &str) -> BlobRef {
        BlobRef { name: name.into(), sha256: sha256.into(), size: 3, source: source.into() }
    }

    #[test]
    fn blob_files_never_leave_the_trainer() {
        let spec = JobSpec { blobs: vec![blob("pickle_file", "aa", "/data.pkl")], ..Default::default() };
        let sent = without_sources(spec);
        assert!(sent.blobs.iter().all(|b| b.source.is_empty()));
        assert_eq!(sent.blobs[0].sha256, "aa", "the bytes stay named");
    }

    #[test]
    fn a_resumed_job_reads_its_blobs_from_the_spec_given_now() {
        let mut resumed = JobSpec { blobs: vec![blob("pickle_file", "aa", ""), blob("other", "bb", "")], ..Default::default() };
        let given = JobSpec { blobs: vec![blob("pickle_file", "cc", "/now.pkl")], ..Default::default() };
        carry_sources(&mut resumed, None);
        assert!(resumed.blobs.iter().all(|b| b.source.is_empty()), "nothing given");
        carry_sources(&mut resumed, Some(&given));
        assert_eq!(resumed.blobs[0], given.blobs[0]);
        assert_eq!(resumed.blobs[1], blob("other", "bb", ""), "the coordinator must hold it");
    }

    #[test]
    fn chunks_are_at_most_a_megabyte_and_end_at_the_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big");
        std::fs::write(&path, vec![5u8; MAX_CHUNK + 10]).expect("write");
        let mut file = File::open(&path).expect("open");
        assert_eq!(read_chunk(&mut file, 0, (MAX_CHUNK + 10) as u64).expect("first").len(), MAX_CHUNK);
        assert_eq!(read_chunk(&mut file, MAX_CHUNK as u64, (MAX_CHUNK + 10) as u64).expect("last").len(), 10);
    }
}
