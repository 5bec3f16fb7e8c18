//! `image_folder`: class folders of JPEG/PNG files (torchvision's
//! `ImageFolder`), or a manifest of `path<TAB>label` lines.
//!
//! The folder is listed once per job with `loader_listing`, the code the
//! submitter listed it with, and the listing's fingerprint must match the
//! spec's: a worker that sees other files (the folder changed since
//! submission, or another machine mounts another copy) refuses the job
//! rather than train on the wrong samples or labels. Each sample is one
//! file read and one run of the job's image pipeline into the batch row.
//!
//! A folder in a bucket (`s3://bucket/train/`) is listed by the submitter,
//! whose listing the worker reads from the job's blob `listing`
//! (`loader_listing::bucket_listing`; a spec without one is listed from
//! the store the same way, `loader_listing`), and a batch's images are fetched at
//! once, one GET per image (many in flight), each pinned to the ETag the
//! listing saw, before they are decoded in order; the images are kept on
//! local disk for the job's later epochs (`loader_storage::Pile`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use loader_listing::image_folder::{ImageSample, list};
use loader_storage::{ObjectUrl, Pile};
use loader_proto::pb::{ImageFolderSpec, Transform};

use super::FrameCache;
use super::images::ImageSamples;
use super::{Dataset, DatasetError, SampleKey, SampleTensor};

const KIND: &str = "image_folder";

/// A listed image folder.
#[derive(Debug)]
pub struct ImageFolder {
    /// The folder the listing's relative paths start from.
    root: PathBuf,
    /// Every sample: relative path and label, in dataset order.
    samples: Vec<ImageSample>,
    /// For a folder in a bucket, each sample's object and the ETag its read
    /// must find; None for a local folder.
    objects: Option<Arc<[(ObjectUrl, Option<String>)]>>,
    /// A bucket's images kept on local disk for the job's later epochs.
    pile: Pile,
    /// The pipeline and the `image`/`label` tensors.
    images: ImageSamples,
}

impl ImageFolder {
    /// Lists the folder a spec names, checks the listing against the
    /// submitter's, and builds the pipeline from `transforms`.
    pub fn open(spec: &ImageFolderSpec, transforms: &[Transform]) -> Result<Self, DatasetError> {
        let images = ImageSamples::new(KIND, transforms)?;
        let root = PathBuf::from(&spec.path);
        let manifest = Some(Path::new(&spec.manifest)).filter(|m| !m.as_os_str().is_empty());
        // A folder in a bucket comes with the submitter's listing (the
        // blob `listing`), not listed from the store again.
        let listing = match Some(Path::new(&spec.listing)).filter(|l| !l.as_os_str().is_empty()) {
            Some(submitted) => loader_listing::bucket_listing::read(submitted),
            None => list(&root, manifest),
        }
        .map_err(|e| DatasetError::listing(KIND, e))?;
        let fingerprint = listing.fingerprint();
        if listing.samples.len() as u64 != spec.num_samples || fingerprint != spec.fingerprint {
            return Err(DatasetError::Mismatch {
                kind: KIND,
                path: spec.path.clone(),
                problem: format!(
                    "this worker lists {} images (fingerprint {fingerprint:016x}), the job was submitted with {} \
                     (fingerprint {:016x}); the folder changed since, or this worker sees another copy",
                    listing.samples.len(),
                    spec.num_samples,
                    spec.fingerprint
                ),
            });
        }
        let objects = loader_storage::is_url(&spec.path).then(|| {
            let prefix = spec.path.trim_end_matches('/');
            listing
                .objects
                .iter()
                .filter_map(|o| Some((ObjectUrl::parse(&format!("{prefix}/{}", o.key)).ok()?, o.etag.clone())))
                .collect()
        });
        // A node's workers share the pile of this listing of this folder.
        let pile = if objects.is_some() { Pile::of_folder(&format!("{} {fingerprint:016x}", spec.path)) } else { Pile::default() };
        Ok(Self { root, samples: listing.samples, objects, pile, images })
    }

    /// Keeps decoded frames in `frames` (a cache made for this job).
    pub fn keep_frames(mut self, frames: Option<FrameCache>) -> Self {
        self.images.keep_frames(frames);
        self
    }
}

impl Dataset for ImageFolder {
    fn tensors(&self) -> &[SampleTensor] {
        self.images.tensors()
    }

    fn len(&self) -> u64 {
        self.samples.len() as u64
    }

    fn fetches_ahead(&self) -> bool {
        self.objects.is_some() && !self.images.keeps_frames()
    }

    fn prefetch_batch(&self, keys: &[SampleKey]) {
        if let Some(objects) = self.objects.as_ref().filter(|_| !self.images.keeps_frames()) {
            self.pile.prefetch(objects, keys.iter().filter_map(|k| usize::try_from(k.index).ok()));
        }
    }

    fn read_batch(&self, keys: &[SampleKey], batch: &mut super::BatchRows<'_>) -> Result<(), DatasetError> {
        let Some(objects) = self.objects.as_ref().filter(|_| !self.images.keeps_frames()) else {
            // A local folder; or kept frames, where most images are never read.
            return super::read_each(self, keys, batch);
        };
        // A folder in a bucket: the batch's images are fetched at once, one
        // GET each, then decoded in order.
        let wanted: Vec<_> = keys.iter().filter_map(|k| objects.get(usize::try_from(k.index).ok()?)).collect();
        if wanted.len() != keys.len() {
            return super::read_each(self, keys, batch);
        }
        let fetched = self.pile.get_many(&wanted);
        for ((&key, fetched), (url, _)) in keys.iter().zip(fetched).zip(wanted.iter().copied()) {
            let read = self.decode(key, &mut batch.next_rows(), || fetched.bytes().map_err(|e| DatasetError::storage(KIND, e)), || url.to_string());
            batch.settle(key.index, read)?;
        }
        Ok(())
    }

    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        if let Some(objects) = &self.objects {
            let object = usize::try_from(key.index).ok().and_then(|i| objects.get(i));
            let Some(object) = object else {
                return Err(DatasetError::IndexOutOfRange { index: key.index, len: self.len() });
            };
            let read = || {
                let got = self.pile.get_many(&[object]).pop().map(loader_storage::Got::bytes);
                got.unwrap_or_else(|| loader_storage::get(&object.0, object.1.clone())).map_err(|e| DatasetError::storage(KIND, e))
            };
            return self.decode(key, rows, read, || object.0.to_string());
        }
        let path = usize::try_from(key.index).ok().and_then(|i| self.samples.get(i)).map(|s| self.root.join(&s.path));
        let path = path.unwrap_or_default();
        let read = || {
            std::fs::read(&path)
                .map_err(|e| DatasetError::Corrupt { path: path.display().to_string(), reason: format!("cannot read: {e}") })
        };
        self.decode(key, rows, read, || path.display().to_string())
    }
}

impl ImageFolder {
    /// Runs sample `key`'s image, as `read` gives its bytes, through the
    /// pipeline into `rows`, with its label; `name` names it in errors.
    fn decode<R: AsRef<[u8]>>(
        &self,
        key: SampleKey,
        rows: &mut [&mut [u8]],
        read: impl FnOnce() -> Result<R, DatasetError>,
        name: impl FnOnce() -> String,
    ) -> Result<(), DatasetError> {
        self.images.check(key.index, rows)?;
        let sample = usize::try_from(key.index).ok().and_then(|i| self.samples.get(i));
        let Some(sample) = sample else {
            return Err(DatasetError::IndexOutOfRange { index: key.index, len: self.len() });
        };
        self.images.write(key, read, sample.label, name, rows)
    }
}
