//! `webdataset`: tar shards whose members, grouped by key, are samples
//! (image `jpg`/`jpeg`/`png`, label `cls`).
//!
//! Each shard is indexed once per job with `loader_listing::shard` (the
//! code the submitter counted its samples with) and memory-mapped, so a
//! sample is a slice of the page cache handed to the decoder, with no read
//! call and no copy. The sampler shuffles whole shards and keeps each
//! shard's samples in file order, so a worker walks a shard front to back
//! and the kernel's read-ahead does the rest.
//!
//! A sample without an image or a label, or with a label that is not an
//! integer, is corrupt (named `shard.tar:key`), like an undecodable image.

use std::fs::File;
use std::path::Path;

use loader_listing::shard::{Member, ShardSample, index};
use loader_proto::pb::{Transform, WebDatasetSpec};
use crate::mapped::MappedFile;

use super::FrameCache;
use super::images::ImageSamples;
use super::{Dataset, DatasetError, SampleKey, SampleTensor};

const KIND: &str = "webdataset";

/// One indexed, mapped shard.
#[derive(Debug)]
struct Shard {
    /// The path as the spec names it, for messages.
    path: String,
    /// The whole file, read-only, guarded (`crate::mapped`).
    map: MappedFile,
    /// Its samples, in file order.
    samples: Vec<ShardSample>,
}

/// Indexed tar shards.
#[derive(Debug)]
pub struct WebDataset {
    /// In dataset order.
    shards: Vec<Shard>,
    /// `starts[s]`: dataset index of the first sample of shard `s`.
    starts: Vec<u64>,
    /// Samples in all shards.
    len: u64,
    /// The pipeline and the `image`/`label` tensors.
    images: ImageSamples,
}

impl WebDataset {
    /// Indexes and maps every shard a spec names, checking each holds the
    /// samples the submitter counted.
    pub fn open(spec: &WebDatasetSpec, transforms: &[Transform]) -> Result<Self, DatasetError> {
        let images = ImageSamples::new(KIND, transforms)?;
        if spec.shard_samples.len() != spec.shards.len() {
            return Err(DatasetError::Spec(format!(
                "webdataset dataset: {} sample counts for {} shards",
                spec.shard_samples.len(),
                spec.shards.len()
            )));
        }
        let mut shards = Vec::with_capacity(spec.shards.len());
        let mut starts = Vec::with_capacity(spec.shards.len());
        let mut len = 0u64;
        for (path, &expected) in spec.shards.iter().zip(&spec.shard_samples) {
            let samples = index(Path::new(path)).map_err(|e| DatasetError::listing(KIND, e))?.samples;
            if samples.len() as u64 != expected {
                return Err(DatasetError::Mismatch {
                    kind: KIND,
                    path: path.clone(),
                    problem: format!(
                        "holds {} samples, the job was submitted with {expected}; the shard changed since",
                        samples.len()
                    ),
                });
            }
            let open_err = |source| DatasetError::Open { kind: KIND, path: path.clone(), source };
            let file = File::open(path).map_err(open_err)?;
            let map = MappedFile::map(&file).map_err(open_err)?;
            starts.push(len);
            len += expected;
            shards.push(Shard { path: path.clone(), map, samples });
        }
        Ok(Self { shards, starts, len, images })
    }

    /// Keeps decoded frames in `frames` (a cache made for this job).
    pub fn keep_frames(mut self, frames: Option<FrameCache>) -> Self {
        self.images.keep_frames(frames);
        self
    }

    /// The shard and sample of dataset index `i`.
    fn locate(&self, i: u64) -> Option<(&Shard, &ShardSample)> {
        // The last shard starting at or before i; empty shards share their
        // start with the next one and are passed over.
        let s = self.starts.partition_point(|&start| start <= i).checked_sub(1)?;
        let shard = self.shards.get(s)?;
        let j = usize::try_from(i - self.starts.get(s)?).ok()?;
        Some((shard, shard.samples.get(j)?))
    }
}

impl Shard {
    /// The bytes of `m`, or None when the index points past the file.
    fn bytes(&self, m: &Member) -> Option<&[u8]> {
        let start = usize::try_from(m.offset).ok()?;
        let end = start.checked_add(usize::try_from(m.len).ok()?)?;
        self.map.bytes().get(start..end)
    }
}

impl Dataset for WebDataset {
    fn tensors(&self) -> &[SampleTensor] {
        self.images.tensors()
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        self.images.check(key.index, rows)?;
        let Some((shard, sample)) = self.locate(key.index) else {
            return Err(DatasetError::IndexOutOfRange { index: key.index, len: self.len });
        };
        let name = || format!("{}:{}", shard.path, sample.key);
        let corrupt = |reason: &str| DatasetError::Corrupt { path: name(), reason: reason.to_owned() };
        let image = sample.image.as_ref().ok_or_else(|| corrupt("no .jpg, .jpeg or .png member"))?;
        let image = shard.bytes(image).ok_or_else(|| corrupt("image member runs past the end of the shard"))?;
        let label = sample.label.as_ref().ok_or_else(|| corrupt("no .cls member"))?;
        let label = shard.bytes(label).ok_or_else(|| corrupt("label member runs past the end of the shard"))?;
        let changed = |c| DatasetError::changed(&shard.path, c);
        let parsed = std::str::from_utf8(label).ok().and_then(|l| l.trim().parse::<i64>().ok());
        shard.map.intact().map_err(changed)?;
        let label = parsed.ok_or_else(|| corrupt(&format!("label {:?} is not an integer", String::from_utf8_lossy(label))))?;
        let written = self.images.write(key, || Ok::<_, DatasetError>(image), label, name, rows);
        // The decoder read the image from the mapping: zeros, if it faulted.
        shard.map.intact().map_err(changed)?;
        written
    }
}
