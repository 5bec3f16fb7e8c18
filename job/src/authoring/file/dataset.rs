//! The `dataset` entry of a spec file: a one-key map of the kind to its
//! settings, each kind's fields, what parsing alone can check, and the
//! dataset spec (and blobs) it becomes, its relative paths resolved
//! against the spec file's folder.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use loader_proto::pb::{
    BlobRef, CustomSpec, DatasetSpec, ImageFolderSpec, MixSource, MixSpec, NpyArray, NpySpec, ParquetSpec, SyntheticSpec,
    TokensSpec, WebDatasetSpec, dataset_spec::Kind,
};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::values::{DtypeName, NamedPaths, Scalar, Shards};

/// The dataset: a one-key map of the kind to its settings. (Written by
/// hand: serde_norway reads derived enums from YAML tags, `!npy {..}`,
/// which nobody writes.)
#[derive(Debug)]
pub(super) enum DatasetFile {
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
pub(super) struct MixFile {
    sources: Vec<MixSourceFile>,
    #[serde(default)]
    samples_per_epoch: u64,
    #[serde(default)]
    source_field: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MixSourceFile {
    name: String,
    weight: f64,
    dataset: DatasetFile,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ImageFolderFile {
    path: String,
    #[serde(default)]
    manifest: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WebDatasetFile {
    shards: Shards,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NpyFile {
    arrays: NamedPaths,
}

/// Parquet files: a list, a `{000..009}` range or a glob (`*.parquet`,
/// expanded when the job is submitted), the columns to read (all when left
/// out), and optionally a binary column of encoded images for the job's
/// transforms.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ParquetFile {
    files: Shards,
    #[serde(default)]
    columns: Vec<String>,
    #[serde(default)]
    image_column: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TokensFile {
    path: String,
    dtype: DtypeName,
    context_length: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SyntheticFile {
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
pub(super) struct CustomFile {
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
pub(super) struct PythonFile {
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

impl DatasetFile {
    /// Checks what parsing alone can tell (a `python` entry given two ways),
    /// naming the entry.
    pub(super) fn check(&self) -> Result<(), String> {
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
    pub(super) fn into_kind(self, base: &Path, prefix: &str, blobs: &mut Vec<BlobRef>) -> Kind {
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
