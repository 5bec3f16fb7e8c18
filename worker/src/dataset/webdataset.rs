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

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use loader_listing::shard::{Member, ShardSample, index, index_of};
use loader_listing::source::Source;
use loader_proto::pb::{Transform, WebDatasetSpec};

use super::FrameCache;
use super::data_file::DataFile;
use super::images::ImageSamples;
use super::{Dataset, DatasetError, SampleKey, SampleTensor};

const KIND: &str = "webdataset";

/// One indexed shard: a mapped file or an object (`data_file`).
#[derive(Debug)]
struct Shard {
    /// The path as the spec names it, for messages.
    path: String,
    file: DataFile,
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
    /// Some shard is an object in a store: only then is a batch's
    /// `fetches_ahead` worth a look at every shard.
    in_store: bool,
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
            let (file, samples) = Self::indexed(path)?;
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
            starts.push(len);
            len += expected;
            shards.push(Shard { path: path.clone(), file, samples });
        }
        let in_store = shards.iter().any(|s| s.file.object().is_some());
        Ok(Self { shards, starts, len, in_store, images })
    }

    /// The shard at `path`, opened, and its samples. An object is opened
    /// first and its index walked through the chunks its samples are read
    /// from, so the shard is fetched once; a local file is indexed first,
    /// as the submitter did.
    fn indexed(path: &str) -> Result<(DataFile, Vec<ShardSample>), DatasetError> {
        let listing = |e| DatasetError::listing(KIND, e);
        if loader_storage::is_url(path) {
            let file = DataFile::open(KIND, path)?;
            let object = file.object().map(|o| Source::object(Arc::clone(o)));
            let samples = match object {
                Some(object) => index_of(object, Path::new(path)),
                None => index(Path::new(path)),
            };
            return Ok((file, samples.map_err(listing)?.samples));
        }
        let samples = index(Path::new(path)).map_err(listing)?.samples;
        Ok((DataFile::open(KIND, path)?, samples))
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
    /// The bytes of `m` (borrowed from a mapping, fetched from a store), or
    /// None when the index points past the file.
    fn bytes(&self, m: &Member) -> Option<Result<Cow<'_, [u8]>, DatasetError>> {
        if !self.file.holds(m.offset, m.len) {
            return None;
        }
        Some(match self.file.mapped(m.offset, m.len) {
            Some(bytes) => Ok(Cow::Borrowed(bytes)),
            None => self.file.read_vec(KIND, m.offset, m.len).map(Cow::Owned),
        })
    }
}

impl Dataset for WebDataset {
    fn tensors(&self) -> &[SampleTensor] {
        self.images.tensors()
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn fetches_ahead(&self) -> bool {
        self.in_store && self.shards.iter().any(|s| s.file.may_fetch())
    }

    fn prefetch_batch(&self, keys: &[SampleKey]) {
        if !self.in_store {
            return;
        }
        for &key in keys {
            if let Some((shard, sample)) = self.locate(key.index).filter(|(s, _)| s.file.may_fetch()) {
                for m in sample.image.iter().chain(&sample.label) {
                    shard.file.prefetch(m.offset, usize::try_from(m.len).unwrap_or(usize::MAX));
                }
            }
        }
    }

    fn read_batch(&self, keys: &[SampleKey], batch: &mut super::BatchRows<'_>) -> Result<(), DatasetError> {
        // Shards in a store: every member the batch needs is asked for at once.
        self.prefetch_batch(keys);
        super::read_each(self, keys, batch)
    }

    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        self.images.check(key.index, rows)?;
        let Some((shard, sample)) = self.locate(key.index) else {
            return Err(DatasetError::IndexOutOfRange { index: key.index, len: self.len });
        };
        let name = || format!("{}:{}", shard.path, sample.key);
        let corrupt = |reason: &str| DatasetError::Corrupt { path: name(), reason: reason.to_owned() };
        let image = sample.image.as_ref().ok_or_else(|| corrupt("no .jpg, .jpeg or .png member"))?;
        let image = shard.bytes(image).ok_or_else(|| corrupt("image member runs past the end of the shard"))??;
        let label = sample.label.as_ref().ok_or_else(|| corrupt("no .cls member"))?;
        let label = shard.bytes(label).ok_or_else(|| corrupt("label member runs past the end of the shard"))??;
        let parsed = std::str::from_utf8(&label).ok().and_then(|l| l.trim().parse::<i64>().ok());
        shard.file.intact()?;
        let label = parsed.ok_or_else(|| corrupt(&format!("label {:?} is not an integer", String::from_utf8_lossy(&label))))?;
        let written = self.images.write(key, || Ok::<_, DatasetError>(image), label, name, rows);
        // The decoder read the image from the mapping: zeros, if it faulted.
        shard.file.intact()?;
        written
    }
}
