//! Blobs: files a job needs that travel beside its spec (`JobSpec.blobs`),
//! not in it, named by the SHA-256 of their bytes.
//!
//! A pickled Python dataset is the case in point: an ImageFolder over
//! ImageNet pickles to ~100 MB, which no spec (sent with every task) should
//! carry. An image folder's manifest is another ([`IMAGE_FOLDER_MANIFEST`]):
//! a file of the submitter's host that a remote worker cannot read. The trainer uploads each blob to the coordinator in chunks
//! (`TrainerService.PutBlob`), the coordinator holds it in memory within a
//! budget, and each worker host fetches it once (`WorkerService.GetBlob`)
//! into its blob directory. Chunks stay under [`MAX_CHUNK`], far below the
//! request-size limit every server enforces, so no limit moves for blobs.
//!
//! Here: the names (a SHA-256 as 64 lowercase hex digits, [`Sha256`],
//! [`hash_file`]) and the limits. The checks of a spec's blob list are the
//! job model's (`loader_job::spec`).

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Most bytes one `PutBlob` or `GetBlob` chunk carries: 1 MiB.
pub const MAX_CHUNK: usize = 1 << 20;

/// Most blobs one job references.
pub const MAX_BLOBS: usize = 16;

/// Hex digits of a SHA-256.
pub const SHA256_HEX_LEN: usize = 64;

/// The blob an `image_folder` dataset's `manifest` travels as (under
/// `s/manifest` for a mixture's source `s`): the submitter lists the folder
/// from the manifest, so it always reads the file, and carries it so that a
/// worker on another host lists the same samples from its own copy. A
/// worker given this blob reads the manifest from it, not from the spec's
/// path; one given none (a spec from before) reads the path.
pub const IMAGE_FOLDER_MANIFEST: &str = "manifest";

/// The blob an `image_folder` dataset in a bucket (`s3://bucket/train/`)
/// travels with (under `s/listing` for a mixture's source `s`): the
/// submitter's listing of it, a `BucketListing`. Its workers read it
/// instead of listing the store again: a LIST is a round trip a thousand
/// keys at a time, and every worker's listing delayed its first batch; and
/// every worker then reads the very objects (and ETags) the job was
/// submitted with. A worker given none lists the bucket itself.
pub const IMAGE_FOLDER_LISTING: &str = "listing";

/// True for a SHA-256 written as 64 lowercase hex digits, the one spelling
/// blobs are named by (in specs, RPCs and file names alike).
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == SHA256_HEX_LEN && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// An incremental SHA-256, finished as the 64 lowercase hex digits blobs
/// are named by.
#[derive(Clone)]
pub struct Sha256 {
    context: ring::digest::Context,
    /// Bytes hashed so far.
    len: u64,
}

impl std::fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sha256").field("len", &self.len).finish_non_exhaustive()
    }
}

impl Default for Sha256 {
    fn default() -> Self {
        Self { context: ring::digest::Context::new(&ring::digest::SHA256), len: 0 }
    }
}

impl Sha256 {
    /// Adds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.context.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// Bytes hashed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True before anything was hashed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The digest as 64 lowercase hex digits.
    pub fn finish(self) -> String {
        hex(self.context.finish().as_ref())
    }
}

/// SHA-256 and length of the file at `path`, read in 1 MiB pieces.
pub fn hash_file(path: &Path) -> io::Result<(String, u64)> {
    let mut file = File::open(path)?;
    let mut sha = Sha256::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        sha.update(&buf[..n]);
    }
    let len = sha.len();
    Ok((sha.finish(), len))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_have_one_spelling() {
        let good = "ab".repeat(32);
        assert!(is_sha256_hex(&good));
        assert!(!is_sha256_hex(&good.to_uppercase()));
        assert!(!is_sha256_hex(&good[1..]));
        assert!(!is_sha256_hex(&format!("{}g", &good[1..])));
    }
}
