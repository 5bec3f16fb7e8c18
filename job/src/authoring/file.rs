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
//! - this module: the entry points and the top level.
//! - `dataset`: the `dataset` entry, one kind at a time (`python` and `mix`
//!   among them), and the paths in it.
//! - `bounds`: the text's size and nesting depth, checked before parsing.
//! - `transform`: one step of the `transforms` list.
//! - `values`: counts, sizes, dtype and layout names, parameters, npy
//!   arrays and shard lists (with WebDataset's `{000..099}` ranges).

use std::path::Path;

use loader_proto::pb::{CorruptPolicy, DatasetSpec, JobSpec, SamplerSpec};
use serde::Deserialize;

use super::JobSpecBuilder;
use crate::Error;

mod bounds;
mod dataset;
mod transform;
mod values;

pub use bounds::{MAX_DEPTH, MAX_SPEC_BYTES};
pub use dataset::{COLLATE_PICKLE_FILE, PICKLE_FILE, PYTHON_DATASET, WORKER_INIT_PICKLE_FILE};

use dataset::DatasetFile;
use transform::TransformFile;
use values::Count;

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

#[cfg(test)]
mod tests;
