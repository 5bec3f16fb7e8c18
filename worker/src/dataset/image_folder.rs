//! `image_folder`: class folders of JPEG/PNG files (torchvision's
//! `ImageFolder`), or a manifest of `path<TAB>label` lines.
//!
//! The folder is listed once per job with `loader_listing`, the code the
//! submitter listed it with, and the listing's fingerprint must match the
//! spec's: a worker that sees other files (the folder changed since
//! submission, or another machine mounts another copy) refuses the job
//! rather than train on the wrong samples or labels. Each sample is one
//! file read and one run of the job's image pipeline into the batch row.

use std::path::{Path, PathBuf};

use loader_listing::image_folder::{ImageSample, list};
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
        let listing = list(&root, manifest).map_err(|e| DatasetError::listing(KIND, e))?;
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
        Ok(Self { root, samples: listing.samples, images })
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

    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        self.images.check(key.index, rows)?;
        let sample = usize::try_from(key.index).ok().and_then(|i| self.samples.get(i));
        let Some(sample) = sample else {
            return Err(DatasetError::IndexOutOfRange { index: key.index, len: self.len() });
        };
        let path = self.root.join(&sample.path);
        let read = || {
            std::fs::read(&path)
                .map_err(|e| DatasetError::Corrupt { path: path.display().to_string(), reason: format!("cannot read: {e}") })
        };
        self.images.write(key, read, sample.label, || path.display().to_string(), rows)
    }
}
