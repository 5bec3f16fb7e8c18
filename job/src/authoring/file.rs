//! Spec files: a whole job written as YAML or JSON, for `loaderctl run
//! --spec FILE` and for the Python SDK (which hands over `json.dumps(dict)`);
//! the trainer SDK offers it as `loader_client::spec_file`.
//!
//! ```yaml
//! dataset: {image_folder: {path: ./train}}   # or webdataset: {shards: [...]},
//!                                            # npy: {arrays: {x: a.npy}}, tokens, synthetic, custom,
//!                                            # python: {pickle_file: ds.pkl, num_samples: 1000},
//!                                            # mix: {sources: [{name: web, weight: 0.7, dataset: {...}}, ...]}
//! transforms: [decode, {random_resized_crop: {size: 224}}, horizontal_flip,
//!              {normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}}]
//! batch_size: 64
//! epochs: 1                                  # default 1
//! sampler: {shuffle: true, seed: 0, drop_last: false}
//!                                            # sharded datasets: lanes: 4 (read as 4 sequential
//!                                            # streams), shuffle_buffer: 1000 (shuffle in windows)
//! on_corrupt: skip                           # or fail (the default)
//! name: sweep                                # trainers attach to a named job
//! shared: true                               # every trainer receives every batch,
//!                                            # made once (or {max_lag: 256})
//! ```
//!
//! The field names are the protocol's (`dataset.image_folder.path`,
//! `transforms[1].random_resized_crop.size`), so an error from this parser
//! and one from the coordinator's validation name a field the same way.
//! Unknown fields are errors, not silently ignored settings. Every error is
//! one line: `<file>: <field>: <what was wrong and what was expected>`.
//! Relative paths are resolved against the spec file's directory, so a spec
//! next to its data works from any working directory. A `python` entry's
//! `pickle_file` (any size) becomes one of the job's blobs: hashed when the
//! spec is built and uploaded by the trainer SDK when it is submitted, never
//! carried in the spec; so does an `image_folder`'s `manifest` (the builder
//! adds it, `loader_proto::blob::IMAGE_FOLDER_MANIFEST`).
//!
//! Parsing checks every field that needs no dataset file (the same
//! [`crate::spec::check`] the coordinator runs); the counts are read
//! from the files by [`JobSpecBuilder::build`].
//!
//! A text is bounded before it is parsed ([`MAX_SPEC_BYTES`], nesting
//! [`MAX_DEPTH`] levels deep: `bounds`), so a hostile one is refused in
//! milliseconds; the job name's length is the protocol's check.
//!
//! - this module: the entry points, the top level and the datasets.
//! - `bounds`: the text's size and nesting depth, checked before parsing.
//! - `transform`: one step of the `transforms` list.
//! - `values`: counts, sizes, dtype and layout names, parameters, npy
//!   arrays and shard lists (with WebDataset's `{000..099}` ranges).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use loader_proto::pb::{
    BlobRef, CorruptPolicy, CustomSpec, DatasetSpec, ImageFolderSpec, JobSpec, MixSource, MixSpec,
    NpyArray, NpySpec, ParquetSpec, SamplerSpec, SyntheticSpec, TokensSpec, WebDatasetSpec, dataset_spec::Kind,
};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::JobSpecBuilder;
use crate::Error;

mod bounds;
mod transform;
mod values;

pub use bounds::{MAX_DEPTH, MAX_SPEC_BYTES};

use transform::TransformFile;
use values::{Count, DtypeName, NamedPaths, Scalar, Shards};

/// Parses a spec given as text: JSON when it starts with `{`, else YAML.
/// Relative paths resolve against `base_dir`; errors start with `spec: `.
pub fn parse(text: &str, base_dir: &Path) -> Result<JobSpecBuilder, Error> {
    let format = if text.trim_start().starts_with('{') {
        Format::Json
    } else {
        Format::Yaml
    };
    parse_as(text, base_dir, "spec", format)
}

/// Parses a JSON spec (what the Python SDK sends as `json.dumps(dict)`).
pub fn parse_json(text: &str, base_dir: &Path) -> Result<JobSpecBuilder, Error> {
    parse_as(text, base_dir, "spec", Format::Json)
}

/// Reads and parses the spec file at `path` (`.json` is JSON, anything
/// else YAML); errors start with the path, relative paths resolve against
/// its directory.
pub fn parse_file(path: &Path) -> Result<JobSpecBuilder, Error> {
    let origin = path.display().to_string();
    let fail = |message: String| Error::SpecFile { origin: origin.clone(), message };
    // Read at most one byte past the limit: a huge file is refused
    // without being read whole.
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(std::fs::File::open(path).map_err(|e| fail(e.to_string()))?, MAX_SPEC_BYTES as u64 + 1),
        &mut text,
    )
    .map_err(|e| fail(e.to_string()))?;
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let base = path.parent().unwrap_or(Path::new("."));
    parse_as(
        &text,
        base,
        &origin,
        if is_json { Format::Json } else { Format::Yaml },
    )
}

#[derive(Debug, Clone, Copy)]
enum Format {
    Json,
    Yaml,
}

fn parse_as(
    text: &str,
    base_dir: &Path,
    origin: &str,
    format: Format,
) -> Result<JobSpecBuilder, Error> {
    let fail = |message: String| Error::SpecFile {
        origin: origin.to_owned(),
        message: message.split_whitespace().collect::<Vec<_>>().join(" "),
    };
    if text.len() > MAX_SPEC_BYTES {
        return Err(fail(format!(
            "{} bytes or more, more than the {MAX_SPEC_BYTES} a spec may have (the coordinator's request limit); \
             list shards with ranges (`{{000..999}}`) or a glob",
            text.len()
        )));
    }
    if let Some(line) = bounds::too_deep(text, MAX_DEPTH) {
        return Err(fail(format!(
            "line {line}: nested more than {MAX_DEPTH} levels deep, the most a spec may nest; a spec needs fewer than 10"
        )));
    }
    let file: SpecFile = match format {
        Format::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            let file =
                serde_path_to_error::deserialize(&mut de).map_err(|e| fail(e.to_string()))?;
            de.end().map_err(|e| fail(e.to_string()))?;
            file
        }
        // serde_norway tracks the field path itself ("transforms[1]: ...").
        Format::Yaml => serde_norway::from_str(text).map_err(|e| fail(e.to_string()))?,
    };
    file.dataset.check().map_err(fail)?;
    let spec = file.into_spec(base_dir);
    crate::spec::check(&spec).map_err(|e| fail(format!("{}: {}", e.field, e.problem)))?;
    Ok(JobSpecBuilder::from_spec(spec))
}

/// The top level of a spec file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    /// Job name (ranks and restarted trainers attach by name).
    #[serde(default)]
    name: String,
    dataset: DatasetFile,
    #[serde(default)]
    transforms: Vec<TransformFile>,
    batch_size: Count,
    #[serde(default = "one")]
    epochs: Count,
    #[serde(default = "one")]
    consumers: Count,
    #[serde(default)]
    sampler: SamplerFile,
    #[serde(default)]
    on_corrupt: PolicyFile,
    /// A shared stream: `true`, or its settings.
    #[serde(default)]
    shared: Option<SharedFile>,
}

/// `shared: true | false | {max_lag: N}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SharedFile {
    On(bool),
    Settings {
        #[serde(default)]
        max_lag: u32,
    },
}

impl SharedFile {
    fn into_spec(self) -> Option<loader_proto::pb::SharedStream> {
        match self {
            SharedFile::On(false) => None,
            SharedFile::On(true) => Some(loader_proto::pb::SharedStream::default()),
            SharedFile::Settings { max_lag } => Some(loader_proto::pb::SharedStream { max_lag }),
        }
    }
}

fn one() -> Count {
    Count(1)
}

/// The dataset: a one-key map of the kind to its settings. (Written by
/// hand: serde_norway reads derived enums from YAML tags, `!npy {..}`,
/// which nobody writes.)
#[derive(Debug)]
enum DatasetFile {
    ImageFolder(ImageFolderFile),
    Webdataset(WebDatasetFile),
    Npy(NpyFile),
    Parquet(ParquetFile),
    Tokens(TokensFile),
    Synthetic(SyntheticFile),
    Custom(CustomFile),
    Python(PythonFile),
    Mix(MixFile),
}

/// Names of the dataset kinds, for messages.
const DATASETS: &str = "image_folder, webdataset, npy, parquet, tokens, synthetic, custom, python, mix";

/// The `custom` dataset name a `python` entry becomes: the Python SDK's
/// worker (`loader._worker`) serves it by running a Python dataset.
pub const PYTHON_DATASET: &str = "python";

impl<'de> Deserialize<'de> for DatasetFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DatasetFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "a one-key map of the dataset kind ({DATASETS}) to its settings"
                )
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DatasetFile, A::Error> {
                let Some(kind) = map.next_key::<String>()? else {
                    return Err(de::Error::custom(format!(
                        "empty; expected one of: {DATASETS}"
                    )));
                };
                let dataset = match kind.as_str() {
                    "image_folder" | "imagefolder" => DatasetFile::ImageFolder(map.next_value()?),
                    "webdataset" => DatasetFile::Webdataset(map.next_value()?),
                    "npy" => DatasetFile::Npy(map.next_value()?),
                    "parquet" => DatasetFile::Parquet(map.next_value()?),
                    "tokens" => DatasetFile::Tokens(map.next_value()?),
                    "synthetic" => DatasetFile::Synthetic(map.next_value()?),
                    "custom" => DatasetFile::Custom(map.next_value()?),
                    "python" => DatasetFile::Python(map.next_value()?),
                    "mix" => DatasetFile::Mix(map.next_value()?),
                    other => {
                        return Err(de::Error::custom(format!(
                            "unknown dataset `{other}`; expected one of: {DATASETS}"
                        )));
                    }
                };
                if let Some(extra) = map.next_key::<String>()? {
                    return Err(de::Error::custom(format!(
                        "one dataset per job; got `{kind}` and `{extra}`"
                    )));
                }
                Ok(dataset)
            }
        }
        d.deserialize_map(V)
    }
}

/// A weighted mixture: `sources` (each a `name`, a `weight` and a
/// `dataset` of any other kind), optionally `samples_per_epoch` and
/// `source_field` (see docs/mixtures.md).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MixFile {
    sources: Vec<MixSourceFile>,
    #[serde(default)]
    samples_per_epoch: u64,
    #[serde(default)]
    source_field: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MixSourceFile {
    name: String,
    weight: f64,
    dataset: DatasetFile,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageFolderFile {
    path: String,
    #[serde(default)]
    manifest: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebDatasetFile {
    shards: Shards,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NpyFile {
    arrays: NamedPaths,
}

/// Parquet files: a list, a `{000..009}` range or a glob (`*.parquet`,
/// expanded when the job is submitted), the columns to read (all when left
/// out), and optionally a binary column of encoded images for the job's
/// transforms.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ParquetFile {
    files: Shards,
    #[serde(default)]
    columns: Vec<String>,
    #[serde(default)]
    image_column: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    path: String,
    dtype: DtypeName,
    context_length: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SyntheticFile {
    num_samples: u64,
    shape: Vec<u64>,
    dtype: DtypeName,
    #[serde(default)]
    cost_ns: u64,
    #[serde(default)]
    wait_ns_by_epoch: Vec<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CustomFile {
    name: String,
    num_samples: u64,
    #[serde(default)]
    params: HashMap<String, Scalar>,
    #[serde(default)]
    shard_samples: Vec<u64>,
}

/// A Python map-style dataset run inside the workers: `factory`
/// (`package.module:function`, called with `args` as keywords) for
/// deployments, or the dataset object pickled: `pickle_file` (a file of any
/// size, as `loader.Loader.local(dataset)` writes it, which travels as a
/// blob: hashed, uploaded to the coordinator, fetched once per worker host)
/// or `pickle` (pickled and base64-encoded inline, for small hand-written
/// specs); optionally a `collate_fn` the workers make each batch with:
/// `collate` (`package.module:function`), `collate_pickle_file` or
/// `collate_pickle` (the same two ways as the dataset); optionally a
/// `worker_init_fn` each worker calls with its id before its first sample
/// (`worker_init_pickle_file`). `native_transforms` is the Python SDK's:
/// see [`PythonFile::native_transforms`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PythonFile {
    #[serde(default)]
    factory: Option<String>,
    #[serde(default)]
    args: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    pickle: Option<String>,
    #[serde(default)]
    pickle_file: Option<String>,
    #[serde(default)]
    collate: Option<String>,
    #[serde(default)]
    collate_pickle: Option<String>,
    #[serde(default)]
    collate_pickle_file: Option<String>,
    #[serde(default)]
    worker_init_pickle_file: Option<String>,
    num_samples: u64,
    /// For an IterableDataset read through `loader._stream`: samples per
    /// shard (see `CustomSpec.shard_samples`).
    #[serde(default)]
    shard_samples: Vec<u64>,
    /// True asks the Python SDK to run the factory's torchvision
    /// `ImageFolder` in the native image pipeline: `loader.Loader` (and
    /// `Loader.local`) given a dict spec compile it and replace this entry
    /// with an `image_folder` one (and drop a `false`) before the spec is
    /// parsed here. `false` here is the Python path, as without the key.
    /// Nothing in Rust compiles a torchvision dataset, so `true` here (a
    /// spec file, `loaderctl`, a mixture's source) is refused rather than
    /// run in Python unasked.
    #[serde(default)]
    native_transforms: bool,
}

/// The blob a `python` entry's `pickle_file` becomes; the worker hands the
/// dataset its local path under this name.
pub const PICKLE_FILE: &str = "pickle_file";
/// The blob of `collate_pickle_file`.
pub const COLLATE_PICKLE_FILE: &str = "collate_pickle_file";
/// The blob of `worker_init_pickle_file`: a pickled `worker_init_fn`.
pub const WORKER_INIT_PICKLE_FILE: &str = "worker_init_pickle_file";

impl PythonFile {
    /// The blobs of its `*_file` fields, files resolved against `base`;
    /// hashed when the spec is built.
    fn blobs(&self, base: &Path) -> Vec<BlobRef> {
        [
            (PICKLE_FILE, &self.pickle_file),
            (COLLATE_PICKLE_FILE, &self.collate_pickle_file),
            (WORKER_INIT_PICKLE_FILE, &self.worker_init_pickle_file),
        ]
        .into_iter()
        .filter_map(|(name, file)| {
            let source = resolve(base, file.as_deref()?);
            Some(BlobRef {
                name: name.to_owned(),
                source,
                ..Default::default()
            })
        })
        .collect()
    }

    /// Refuses a dataset or collate_fn given two ways, and a
    /// `native_transforms` the SDK did not compile.
    fn check(&self) -> Result<(), String> {
        if self.native_transforms {
            return Err("dataset.python: native_transforms is compiled by the Python SDK from a dict job spec's own \
                 python entry (loader.Loader(coordinator, {...})), not from a spec file or a mixture's source; \
                 give the job as a dict there, or leave native_transforms out"
                .into());
        }
        if self.pickle.is_some() && self.pickle_file.is_some() {
            return Err("dataset.python: give pickle or pickle_file, not both".into());
        }
        if self.collate_pickle.is_some() && self.collate_pickle_file.is_some() {
            return Err(
                "dataset.python: give collate_pickle or collate_pickle_file, not both".into(),
            );
        }
        Ok(())
    }

    /// The `params` of the `custom` spec the worker opens it from (the
    /// blobs' paths are added by the worker).
    fn params(self) -> HashMap<String, String> {
        let mut params = HashMap::new();
        if let Some(f) = self.factory {
            params.insert("factory".to_owned(), f);
        }
        if let Some(a) = self.args {
            params.insert("args".to_owned(), serde_json::Value::Object(a).to_string());
        }
        if let Some(p) = self.pickle {
            params.insert("pickle".to_owned(), p);
        }
        if let Some(c) = self.collate {
            params.insert("collate".to_owned(), c);
        }
        if let Some(c) = self.collate_pickle {
            params.insert("collate_pickle".to_owned(), c);
        }
        params
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SamplerFile {
    #[serde(default)]
    shuffle: bool,
    #[serde(default)]
    seed: u64,
    #[serde(default)]
    drop_last: bool,
    #[serde(default)]
    block_shuffle: bool,
    #[serde(default)]
    lanes: u32,
    #[serde(default)]
    shuffle_buffer: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
enum PolicyFile {
    #[default]
    Fail,
    Skip,
}

impl SpecFile {
    fn into_spec(self, base: &Path) -> JobSpec {
        let mut blobs = Vec::new();
        let kind = self.dataset.into_kind(base, "", &mut blobs);
        JobSpec {
            name: self.name,
            dataset: Some(DatasetSpec { kind: Some(kind) }),
            sampler: Some(SamplerSpec {
                shuffle: self.sampler.shuffle,
                seed: self.sampler.seed,
                drop_last: self.sampler.drop_last,
                block_shuffle: self.sampler.block_shuffle,
                lanes: self.sampler.lanes,
                shuffle_buffer: self.sampler.shuffle_buffer,
            }),
            batch_size: self.batch_size.0,
            epochs: self.epochs.0,
            consumers: self.consumers.0,
            transforms: self.transforms.into_iter().map(|t| t.0).collect(),
            on_corrupt: match self.on_corrupt {
                PolicyFile::Fail => CorruptPolicy::Fail,
                PolicyFile::Skip => CorruptPolicy::Skip,
            } as i32,
            blobs,
            resume: None,
            shared: self.shared.and_then(SharedFile::into_spec),
        }
    }
}

impl DatasetFile {
    /// Checks what parsing alone can tell (a `python` entry given two ways),
    /// naming the entry.
    fn check(&self) -> Result<(), String> {
        match self {
            DatasetFile::Python(p) => p.check(),
            DatasetFile::Mix(m) => {
                for (i, source) in m.sources.iter().enumerate() {
                    if matches!(source.dataset, DatasetFile::Mix(_)) {
                        return Err(format!(
                            "dataset.mix.sources[{i}].dataset: a mixture cannot hold a mixture; list its sources here instead"
                        ));
                    }
                    source
                        .dataset
                        .check()
                        .map_err(|e| format!("dataset.mix.sources[{i}].{e}"))?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The protocol's dataset, its paths resolved against `base`; the blobs
    /// of its files go to `blobs`, their names prefixed by `prefix` (a
    /// mixture's source `s` has its blobs under `s/`).
    fn into_kind(self, base: &Path, prefix: &str, blobs: &mut Vec<BlobRef>) -> Kind {
        let path = |p: &str| resolve(base, p);
        match self {
            DatasetFile::ImageFolder(f) => Kind::ImageFolder(ImageFolderSpec {
                path: path(&f.path),
                manifest: f.manifest.as_deref().map(path).unwrap_or_default(),
                ..Default::default()
            }),
            DatasetFile::Webdataset(w) => Kind::Webdataset(WebDatasetSpec {
                shards: w.shards.0.iter().map(|s| path(s)).collect(),
                shard_samples: Vec::new(),
            }),
            DatasetFile::Npy(n) => Kind::Npy(NpySpec {
                arrays: n
                    .arrays
                    .0
                    .into_iter()
                    .map(|(name, p)| NpyArray {
                        name,
                        path: path(&p),
                    })
                    .collect(),
                num_samples: 0,
            }),
            DatasetFile::Parquet(p) => Kind::Parquet(ParquetSpec {
                files: p.files.0.iter().map(|f| path(f)).collect(),
                columns: p.columns,
                image_column: p.image_column,
                ..Default::default()
            }),
            DatasetFile::Tokens(t) => Kind::Tokens(TokensSpec {
                path: path(&t.path),
                dtype: t.dtype.0 as i32,
                context_length: t.context_length,
                num_tokens: 0,
            }),
            DatasetFile::Synthetic(s) => Kind::Synthetic(SyntheticSpec {
                num_samples: s.num_samples,
                shape: s.shape,
                dtype: s.dtype.0 as i32,
                cost_ns: s.cost_ns,
                wait_ns_by_epoch: s.wait_ns_by_epoch,
            }),
            DatasetFile::Custom(c) => Kind::Custom(CustomSpec {
                name: c.name,
                num_samples: c.num_samples,
                params: c.params.into_iter().map(|(k, v)| (k, v.0)).collect(),
                shard_samples: c.shard_samples,
            }),
            DatasetFile::Python(mut p) => {
                blobs.extend(p.blobs(base).into_iter().map(|b| BlobRef {
                    name: format!("{prefix}{}", b.name),
                    ..b
                }));
                let shard_samples = std::mem::take(&mut p.shard_samples);
                Kind::Custom(CustomSpec {
                    name: PYTHON_DATASET.to_owned(),
                    num_samples: p.num_samples,
                    params: p.params(),
                    shard_samples,
                })
            }
            DatasetFile::Mix(m) => Kind::Mix(MixSpec {
                sources: m
                    .sources
                    .into_iter()
                    .map(|s| {
                        let kind = s.dataset.into_kind(base, &format!("{}/", s.name), blobs);
                        MixSource {
                            name: s.name,
                            weight: s.weight,
                            dataset: Some(DatasetSpec { kind: Some(kind) }),
                        }
                    })
                    .collect(),
                samples_per_epoch: m.samples_per_epoch,
                source_field: m.source_field,
                ..Default::default()
            }),
        }
    }
}

/// `p` relative to `base` when relative, made absolute (workers may run in
/// another working directory); a URL as it is.
fn resolve(base: &Path, p: &str) -> String {
    // An empty path stays empty, for the spec check to name the field
    // (joined, it would be the spec file's folder).
    if p.is_empty() {
        return String::new();
    }
    // An object's URL names the same object from anywhere.
    if loader_storage::is_url(p) {
        return p.to_owned();
    }
    let joined = base.join(p);
    std::path::absolute(&joined)
        .unwrap_or(joined)
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests;
