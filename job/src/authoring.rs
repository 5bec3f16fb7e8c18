//! Job specs as a user writes them: [`JobSpec`]s built in code, one builder
//! per dataset kind, or read from a spec file (YAML or JSON, [`file`](mod@file)),
//! validated locally with [`crate::spec::plan`] so a bad spec fails
//! before any network call, with the same one-line message the coordinator
//! would give.
//!
//! ```
//! use loader_proto::pb::Dtype;
//!
//! # fn main() -> Result<(), loader_job::Error> {
//! let job = loader_job::authoring::synthetic(10_000, &[3, 224, 224], Dtype::U8).batch_size(64).shuffle(0).build()?;
//! assert_eq!(loader_job::authoring::validate(&job)?.batches_per_epoch(), 157);
//! # Ok(())
//! # }
//! ```
//!
//! Three programs author specs and only one of them loads batches:
//! `loaderctl run --spec`, the Python SDK (which parses the dict a user
//! wrote) and the trainer SDK (`loader_client`, which re-exports this module
//! as `loader_client::spec` and its [`file`](mod@file) as
//! `loader_client::spec_file`). Nothing here opens a connection: the trainer
//! SDK sizes its ring by a spec, uploads its blobs and submits it.
//!
//! # Layout
//! - this module: the builders, one per dataset kind, and the settings every
//!   job shares.
//! - [`transforms`]: constructors of the image pipeline's steps, and the
//!   standard training pipeline.
//! - [`file`](mod@file): a spec file becomes a builder ([`file::parse`]). Named `file`,
//!   not `spec_file` as in the trainer SDK, because the module already says
//!   what it authors: `loader_job::authoring::file::parse`.
//! - `counts`: what [`JobSpecBuilder::build`] reads from the dataset's files
//!   (token count, image listing and fingerprint, shard sizes, npy rows).
//! - `blobs`: the files a job needs beside its spec (an image folder's
//!   manifest among them), hashed by [`JobSpecBuilder::build`] so the spec
//!   names their bytes.
//! - [`Error`]: the crate's one error, re-exported here so that
//!   `loader_client::spec::Error` keeps its name.

mod blobs;
mod counts;
pub mod file;
pub mod transforms;

use std::path::Path;

use loader_proto::pb::{
    BlobRef, CorruptPolicy, CustomSpec, DatasetSpec, Dtype, ImageFolderSpec, JobSpec, MixSource,
    MixSpec, NpyArray, NpySpec, ParquetSpec, SamplerSpec, SyntheticSpec, TokensSpec, Transform, WebDatasetSpec,
    dataset_spec::Kind,
};
use crate::sampler::Plan;

pub use crate::Error;

/// Validates `spec` exactly as the coordinator will.
pub fn validate(spec: &JobSpec) -> Result<Plan, Error> {
    Ok(crate::spec::plan(spec)?)
}

/// A job spec under construction. Start from a dataset: [`synthetic`],
/// [`tokens`], [`image_folder`], [`webdataset`], [`npy`], [`custom`], or a
/// [`mix`] of them.
#[derive(Debug, Clone)]
pub struct JobSpecBuilder {
    /// Everything but the counts, which `build` reads from the dataset's
    /// files (paths in it are absolute).
    spec: JobSpec,
}

/// Workers may run elsewhere in the same tree: specs carry absolute paths
/// (an object's URL, `s3://...`, is kept as it is).
fn absolute(path: &Path) -> String {
    if loader_storage::is_url(&path.to_string_lossy()) {
        return path.to_string_lossy().into_owned();
    }
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .to_string_lossy()
        .into_owned()
}

/// Generated samples: `data` of `shape`/`dtype` and an int64 `label` per
/// sample. No files; the transport-only benchmark.
pub fn synthetic(num_samples: u64, shape: &[u64], dtype: Dtype) -> JobSpecBuilder {
    JobSpecBuilder::new(Kind::Synthetic(SyntheticSpec {
        num_samples,
        shape: shape.to_vec(),
        dtype: dtype as i32,
        cost_ns: 0,
        wait_ns_by_epoch: Vec::new(),
    }))
}

/// Windows of `context_length + 1` token ids from a flat binary file of
/// `dtype` (uint16 or uint32) ids. The file is stat'ed in
/// [`JobSpecBuilder::build`] to fill in the token count.
pub fn tokens(path: impl AsRef<Path>, dtype: Dtype, context_length: u64) -> JobSpecBuilder {
    JobSpecBuilder::new(Kind::Tokens(TokensSpec {
        path: absolute(path.as_ref()),
        dtype: dtype as i32,
        context_length,
        num_tokens: 0,
    }))
}

/// Class folders of JPEG/PNG images under `root`, labelled by folder in
/// sorted order like torchvision's `ImageFolder` (or listed by a manifest,
/// see [`JobSpecBuilder::manifest`]). The folder is listed in
/// [`JobSpecBuilder::build`]; give the pipeline with
/// [`JobSpecBuilder::transforms`] (e.g. [`transforms::standard_train`]).
/// Batches hold `image` (the pipeline's output) and int64 `label`.
pub fn image_folder(root: impl AsRef<Path>) -> JobSpecBuilder {
    JobSpecBuilder::new(Kind::ImageFolder(ImageFolderSpec {
        path: absolute(root.as_ref()),
        ..Default::default()
    }))
}

/// WebDataset tar shards, in dataset order: members sharing a key form a
/// sample (image `jpg`/`jpeg`/`png`, label `cls`). Shuffling reorders whole
/// shards so each is read front to back. Indexed in
/// [`JobSpecBuilder::build`]; batches hold `image` and int64 `label`.
pub fn webdataset<P: AsRef<Path>>(shards: impl IntoIterator<Item = P>) -> JobSpecBuilder {
    JobSpecBuilder::new(Kind::Webdataset(WebDatasetSpec {
        shards: shards.into_iter().map(|p| absolute(p.as_ref())).collect(),
        shard_samples: Vec::new(),
    }))
}

/// Rows of `.npy` arrays (C order, little-endian), each array a tensor
/// named by its key; all must have the same number of rows. Headers are
/// read in [`JobSpecBuilder::build`].
pub fn npy<N: Into<String>, P: AsRef<Path>>(
    arrays: impl IntoIterator<Item = (N, P)>,
) -> JobSpecBuilder {
    JobSpecBuilder::new(Kind::Npy(NpySpec {
        arrays: arrays
            .into_iter()
            .map(|(name, path)| NpyArray {
                name: name.into(),
                path: absolute(path.as_ref()),
            })
            .collect(),
        num_samples: 0,
    }))
}

/// Rows of Parquet `files`, taken one after another; each of `columns` (every
/// column of the first file when empty) is a tensor of that name. Footers
/// are read in [`JobSpecBuilder::build`]. Shuffle within a few row groups at
/// a time ([`JobSpecBuilder::block_shuffle`]) to read each row group once.
pub fn parquet<P: AsRef<Path>, C: Into<String>>(
    files: impl IntoIterator<Item = P>,
    columns: impl IntoIterator<Item = C>,
) -> JobSpecBuilder {
    JobSpecBuilder::new(Kind::Parquet(ParquetSpec {
        files: files.into_iter().map(|p| absolute(p.as_ref())).collect(),
        columns: columns.into_iter().map(Into::into).collect(),
        ..Default::default()
    }))
}

/// Like [`parquet`], with the binary column `image_column` of encoded
/// images (JPEG or PNG) decoded and augmented by the job's transforms into
/// a tensor of that name, after the tensors of `columns`.
pub fn parquet_images<P: AsRef<Path>, C: Into<String>>(
    files: impl IntoIterator<Item = P>,
    columns: impl IntoIterator<Item = C>,
    image_column: impl Into<String>,
) -> JobSpecBuilder {
    let mut builder = parquet(files, columns);
    if let Some(Kind::Parquet(p)) = builder.spec.dataset.as_mut().and_then(|d| d.kind.as_mut()) {
        p.image_column = image_column.into();
    }
    builder
}

/// A dataset that only a custom worker binary serves (registered there
/// under `name`), with `num_samples` samples and free-form `params`.
pub fn custom<K: Into<String>, V: Into<String>>(
    name: impl Into<String>,
    num_samples: u64,
    params: impl IntoIterator<Item = (K, V)>,
) -> JobSpecBuilder {
    JobSpecBuilder::new(Kind::Custom(CustomSpec {
        name: name.into(),
        num_samples,
        params: params
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect(),
        ..Default::default()
    }))
}

/// A weighted mixture of datasets (see docs/mixtures.md): each source a
/// name, a weight (its share is weight / sum of the weights) and a builder
/// of any other dataset kind, of which only the dataset, its image
/// pipeline and its blobs count (batch size, epochs and shuffling are the
/// mixture's). Every block of `batch_size x consumers` positions gives each
/// source its share within one sample; each source walks its own seeded
/// permutation, one pass after another.
pub fn mix<N: Into<String>>(
    sources: impl IntoIterator<Item = (N, f64, JobSpecBuilder)>,
) -> JobSpecBuilder {
    let mut transforms = Vec::new();
    let mut blobs = Vec::new();
    let sources = sources
        .into_iter()
        .map(|(name, weight, builder)| {
            let name = name.into();
            let JobSpec {
                dataset,
                transforms: own,
                blobs: own_blobs,
                ..
            } = builder.spec;
            if transforms.is_empty() {
                transforms = own;
            }
            blobs.extend(own_blobs.into_iter().map(|b| BlobRef {
                name: format!("{name}/{}", b.name),
                ..b
            }));
            MixSource {
                name,
                weight,
                dataset,
            }
        })
        .collect();
    let mut builder = JobSpecBuilder::new(Kind::Mix(MixSpec {
        sources,
        ..Default::default()
    }));
    builder.spec.transforms = transforms;
    builder.spec.blobs = blobs;
    builder
}

impl JobSpecBuilder {
    fn new(kind: Kind) -> Self {
        Self::from_spec(JobSpec {
            name: String::new(),
            dataset: Some(DatasetSpec { kind: Some(kind) }),
            sampler: Some(SamplerSpec::default()),
            batch_size: 64,
            epochs: 1,
            consumers: 1,
            ..Default::default()
        })
    }

    /// Continues from a whole spec (e.g. parsed from a spec file); paths in
    /// it must already be absolute or relative to where workers run.
    pub(crate) fn from_spec(spec: JobSpec) -> Self {
        Self { spec }
    }

    /// The spec as it stands, counts not yet filled in.
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// Names the job, so other ranks (or a restarted trainer) attach to it.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.spec.name = name.into();
        self
    }

    /// Makes the job a shared stream: every trainer that opens it (by its
    /// name, which it needs) receives every batch of its rank, in the same
    /// order, made once by the workers (docs/sharing.md). `max_lag`: how
    /// many consumed batches a trainer may trail the one furthest ahead and
    /// still share (0: the default, 1,024); one further behind gets its
    /// batches made for it alone until it comes back within it. What a
    /// slow subscriber may hold on a worker is bounded apart from it (four
    /// windows of batches).
    pub fn shared(mut self, max_lag: u32) -> Self {
        self.spec.shared = Some(loader_proto::pb::SharedStream { max_lag });
        self
    }

    /// Samples per batch (default 64).
    pub fn batch_size(mut self, batch_size: u32) -> Self {
        self.spec.batch_size = batch_size;
        self
    }

    /// Number of epochs (default 1).
    pub fn epochs(mut self, epochs: u32) -> Self {
        self.spec.epochs = epochs;
        self
    }

    /// Data-parallel ranks (default 1); a trainer's world size
    /// (`loader_client::LoaderBuilder::world_size`) overrides it.
    pub fn consumers(mut self, consumers: u32) -> Self {
        self.spec.consumers = consumers;
        self
    }

    /// Shuffles each epoch with a permutation seeded by `seed`.
    pub fn shuffle(mut self, seed: u64) -> Self {
        let sampler = self.spec.sampler.get_or_insert_default();
        sampler.shuffle = true;
        sampler.seed = seed;
        self
    }

    /// Shuffles with `seed` in blocks: a Parquet dataset's row groups in a
    /// new order each epoch, the rows of each row group among themselves,
    /// so a batch reads one or two row groups instead of `batch_size`.
    pub fn block_shuffle(mut self, seed: u64) -> Self {
        self = self.shuffle(seed);
        self.spec.sampler.get_or_insert_default().block_shuffle = true;
        self
    }

    /// Drops the incomplete tail instead of padding (DataLoader's `drop_last`).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.spec.sampler.get_or_insert_default().drop_last = drop_last;
        self
    }

    /// The image pipeline of an image dataset, applied in order (see
    /// [`transforms`]).
    pub fn transforms(mut self, transforms: impl IntoIterator<Item = Transform>) -> Self {
        self.spec.transforms = transforms.into_iter().collect();
        self
    }

    /// What workers do with a corrupt sample: fail the job (the default) or
    /// skip it (its batch is one shorter, and the worker logs its path).
    pub fn on_corrupt(mut self, policy: CorruptPolicy) -> Self {
        self.spec.on_corrupt = policy as i32;
        self
    }

    /// Lists an image folder from a manifest of `relative/path<TAB>label`
    /// lines (paths relative to the folder) instead of its class folders.
    /// The manifest travels with the job as the blob `manifest`
    /// (`loader_proto::blob::IMAGE_FOLDER_MANIFEST`), so workers on other
    /// hosts need only the folder.
    pub fn manifest(mut self, manifest: impl AsRef<Path>) -> Self {
        if let Some(DatasetSpec {
            kind: Some(Kind::ImageFolder(f)),
        }) = &mut self.spec.dataset
        {
            f.manifest = absolute(manifest.as_ref());
        }
        self
    }

    /// Sends the file at `path` with the job as the blob `name` (see
    /// `loader_proto::blob`): hashed by [`build`](Self::build), uploaded to
    /// the coordinator before the job is submitted, and made local once per
    /// worker host before the dataset opens, where a `custom` dataset finds
    /// its local path in `params[name]`. For files too large for the spec
    /// (a pickled dataset, a vocabulary, an index).
    pub fn blob(mut self, name: impl Into<String>, path: impl AsRef<Path>) -> Self {
        self.spec.blobs.push(BlobRef {
            name: name.into(),
            source: absolute(path.as_ref()),
            ..Default::default()
        });
        self
    }

    /// Positions of one epoch of a mixture (default: until the source with
    /// the largest weight has been drawn once whole).
    pub fn samples_per_epoch(mut self, samples: u64) -> Self {
        if let Some(DatasetSpec {
            kind: Some(Kind::Mix(m)),
        }) = &mut self.spec.dataset
        {
            m.samples_per_epoch = samples;
        }
        self
    }

    /// Adds to a mixture's samples the int64 tensor `name`: the index of
    /// the source each sample was drawn from.
    pub fn source_field(mut self, name: impl Into<String>) -> Self {
        if let Some(DatasetSpec {
            kind: Some(Kind::Mix(m)),
        }) = &mut self.spec.dataset
        {
            m.source_field = name.into();
        }
        self
    }

    /// Busy CPU time per synthetic sample, standing in for decode/augment.
    pub fn cost_ns(mut self, cost_ns: u64) -> Self {
        if let Some(DatasetSpec {
            kind: Some(Kind::Synthetic(s)),
        }) = &mut self.spec.dataset
        {
            s.cost_ns = cost_ns;
        }
        self
    }

    /// Per-sample wait (sleep) of a synthetic dataset in each epoch, standing
    /// in for storage latency; the last entry holds for later epochs.
    pub fn wait_ns_by_epoch(mut self, waits: Vec<u64>) -> Self {
        if let Some(DatasetSpec {
            kind: Some(Kind::Synthetic(s)),
        }) = &mut self.spec.dataset
        {
            s.wait_ns_by_epoch = waits;
        }
        self
    }

    /// Checks the spec's fields, reads the counts from the dataset's files
    /// (token count; image listing and its fingerprint; samples per shard;
    /// npy rows), makes an image folder's manifest (or, in a bucket, its
    /// listing) one of its blobs, hashes the files of its blobs, and
    /// validates the whole spec.
    pub fn build(mut self) -> Result<JobSpec, Error> {
        crate::spec::check(&self.spec)?;
        let mut listings = Vec::new();
        if let Some(DatasetSpec { kind: Some(kind) }) = &mut self.spec.dataset {
            counts::fill(kind, &mut listings)?;
        }
        blobs::carry_manifests(&mut self.spec);
        blobs::carry_listings(&mut self.spec, listings);
        blobs::hash_sources(&mut self.spec)?;
        validate(&self.spec)?;
        Ok(self.spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_builds_and_validates() {
        let spec = synthetic(100, &[3, 4], Dtype::U8)
            .batch_size(8)
            .epochs(2)
            .shuffle(5)
            .build()
            .expect("valid");
        assert_eq!(validate(&spec).expect("plan").batches_per_epoch(), 13);
        assert_eq!(spec.sampler.map(|s| (s.shuffle, s.seed)), Some((true, 5)));
        let e = synthetic(100, &[3], Dtype::U8)
            .batch_size(0)
            .build()
            .expect_err("batch 0");
        assert_eq!(e.to_string(), "invalid job spec: batch_size: must be > 0");
    }

    #[test]
    fn tokens_reads_the_count_from_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("toks.bin");
        std::fs::write(&path, vec![0u8; 2 * 1000]).expect("write");
        let spec = tokens(&path, Dtype::U16, 99)
            .batch_size(2)
            .build()
            .expect("valid");
        match spec.dataset.and_then(|d| d.kind) {
            Some(Kind::Tokens(t)) => assert_eq!(t.num_tokens, 1000),
            other => panic!("unexpected dataset {other:?}"),
        }
        std::fs::write(&path, vec![0u8; 2001]).expect("write");
        let e = tokens(&path, Dtype::U16, 99).build().expect_err("odd size");
        assert!(e.to_string().contains("2001 bytes"), "{e}");
    }

    #[test]
    fn image_folders_are_listed_and_fingerprinted_at_build() {
        let dir = tempfile::tempdir().expect("tempdir");
        for rel in ["b/2.jpg", "a/1.png", "a/0.JPG", "a/readme.txt"] {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, b"x").expect("write");
        }
        let build = || {
            image_folder(dir.path())
                .transforms(transforms::standard_train(224))
                .on_corrupt(CorruptPolicy::Skip)
                .build()
                .expect("valid")
        };
        let spec = build();
        assert_eq!(spec.on_corrupt, CorruptPolicy::Skip as i32);
        let Some(Kind::ImageFolder(f)) = spec.dataset.and_then(|d| d.kind) else {
            panic!("not an image folder");
        };
        assert_eq!(f.num_samples, 3);
        std::fs::write(dir.path().join("b/3.jpeg"), b"x").expect("write");
        let Some(Kind::ImageFolder(g)) = build().dataset.and_then(|d| d.kind) else {
            panic!("not an image folder");
        };
        assert_ne!(
            f.fingerprint, g.fingerprint,
            "a new file changes the fingerprint"
        );
        let e = image_folder(dir.path())
            .build()
            .expect_err("no pipeline")
            .to_string();
        assert!(
            e.starts_with("invalid job spec: transforms: an image dataset needs a pipeline"),
            "{e}"
        );
    }

    #[test]
    fn a_manifest_travels_as_a_blob_named_by_its_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        for rel in ["a/0.jpg", "b/1.jpg"] {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, b"x").expect("write");
        }
        let manifest = dir.path().join("list.tsv");
        std::fs::write(&manifest, b"b/1.jpg\t0\na/0.jpg\t1\n").expect("write");
        let (sha, size) = loader_proto::blob::hash_file(&manifest).expect("hash");
        let blobs = |spec: &JobSpec| -> Vec<(String, String, u64)> {
            spec.blobs.iter().map(|b| (b.name.clone(), b.sha256.clone(), b.size)).collect()
        };
        let pipeline = || transforms::standard_train(8);

        let built = image_folder(dir.path()).manifest(&manifest).transforms(pipeline()).build().expect("valid");
        assert_eq!(blobs(&built), vec![("manifest".to_owned(), sha.clone(), size)]);
        assert_eq!(built.blobs[0].source, manifest.to_string_lossy(), "the SDK uploads it from here");
        let Some(Kind::ImageFolder(f)) = &built.dataset.as_ref().and_then(|d| d.kind.clone()) else {
            panic!("not an image folder");
        };
        assert_eq!(f.manifest, manifest.to_string_lossy(), "a worker given no blob (an older one) reads the path");

        // The spec-file form, and a mixture's source under its name.
        let text = format!(
            "dataset: {{image_folder: {{path: {root}, manifest: list.tsv}}}}\ntransforms: [decode, {{center_crop: {{size: 8}}}}]\nbatch_size: 2\n",
            root = dir.path().display()
        );
        let parsed = file::parse(&text, dir.path()).expect("parse").build().expect("valid");
        assert_eq!(blobs(&parsed), vec![("manifest".to_owned(), sha.clone(), size)]);
        let mixed = mix([
            ("listed", 1.0, image_folder(dir.path()).manifest(&manifest).transforms(pipeline())),
            ("folders", 1.0, image_folder(dir.path()).transforms(pipeline())),
        ])
        .batch_size(2)
        .build()
        .expect("valid");
        assert_eq!(blobs(&mixed), vec![("listed/manifest".to_owned(), sha, size)]);

        let folders = image_folder(dir.path()).transforms(pipeline()).build().expect("valid");
        assert!(folders.blobs.is_empty(), "class folders need no blob");
    }

    #[test]
    fn npy_arrays_must_agree_on_their_rows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, rows: u64| {
            let dict = format!("{{'descr': '|u1', 'fortran_order': False, 'shape': ({rows},), }}");
            let mut out = b"\x93NUMPY\x01\x00".to_vec();
            out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
            out.extend_from_slice(dict.as_bytes());
            out.extend(std::iter::repeat_n(0u8, rows as usize));
            let path = dir.path().join(name);
            std::fs::write(&path, out).expect("write");
            path
        };
        let (x, y) = (write("x.npy", 12), write("y.npy", 12));
        let spec = npy([("x", &x), ("y", &y)])
            .batch_size(4)
            .build()
            .expect("valid");
        assert!(
            matches!(spec.dataset.and_then(|d| d.kind), Some(Kind::Npy(n)) if n.num_samples == 12)
        );
        let z = write("z.npy", 11);
        let e = npy([("x", &x), ("z", &z)])
            .build()
            .expect_err("rows differ")
            .to_string();
        assert_eq!(
            e,
            format!(
                "{}: holds 11 rows, array `x` holds 12; every array needs the same rows",
                z.display()
            )
        );
    }

    #[test]
    fn missing_token_file_names_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nope.bin");
        let e = tokens(&path, Dtype::U16, 16).build().expect_err("missing");
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("token file {}: ", path.display())),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }
}
