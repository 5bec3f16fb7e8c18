//! Spec files: a whole job written as YAML or JSON, for `loaderctl run
//! --spec FILE` and for the Python SDK (which hands over `json.dumps(dict)`).
//!
//! ```yaml
//! dataset: {image_folder: {path: ./train}}   # or webdataset: {shards: [...]},
//!                                            # npy: {arrays: {x: a.npy}}, tokens, synthetic, custom
//! transforms: [decode, {random_resized_crop: {size: 224}}, horizontal_flip,
//!              {normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}}]
//! batch_size: 64
//! epochs: 1                                  # default 1
//! sampler: {shuffle: true, seed: 0, drop_last: false}
//! on_corrupt: skip                           # or fail (the default)
//! ```
//!
//! The field names are the protocol's (`dataset.image_folder.path`,
//! `transforms[1].random_resized_crop.size`), so an error from this parser
//! and one from the coordinator's validation name a field the same way.
//! Unknown fields are errors, not silently ignored settings. Every error is
//! one line: `<file>: <field>: <what was wrong and what was expected>`.
//! Relative paths are resolved against the spec file's directory, so a spec
//! next to its data works from any working directory.
//!
//! Parsing checks every field that needs no dataset file (the same
//! [`loader_proto::spec::check`] the coordinator runs); the counts are read
//! from the files by [`JobSpecBuilder::build`].

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use loader_proto::pb::{
    CenterCrop, CorruptPolicy, CustomSpec, DatasetSpec, Dtype, HorizontalFlip, ImageFolderSpec,
    JobSpec, Layout, Normalize, NpyArray, NpySpec, RandomResizedCrop, Resize, SamplerSpec,
    SyntheticSpec, TokensSpec, Transform, WebDatasetSpec, dataset_spec::Kind, transform::Op,
};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::LoaderError;
use crate::spec::{JobSpecBuilder, transforms};

/// Parses a spec given as text: JSON when it starts with `{`, else YAML.
/// Relative paths resolve against `base_dir`; errors start with `spec: `.
pub fn parse(text: &str, base_dir: &Path) -> Result<JobSpecBuilder, LoaderError> {
    let format = if text.trim_start().starts_with('{') { Format::Json } else { Format::Yaml };
    parse_as(text, base_dir, "spec", format)
}

/// Parses a JSON spec (what the Python SDK sends as `json.dumps(dict)`).
pub fn parse_json(text: &str, base_dir: &Path) -> Result<JobSpecBuilder, LoaderError> {
    parse_as(text, base_dir, "spec", Format::Json)
}

/// Reads and parses the spec file at `path` (`.json` is JSON, anything
/// else YAML); errors start with the path, relative paths resolve against
/// its directory.
pub fn parse_file(path: &Path) -> Result<JobSpecBuilder, LoaderError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| LoaderError::SpecFile { origin: origin.clone(), message: e.to_string() })?;
    let is_json = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let base = path.parent().unwrap_or(Path::new("."));
    parse_as(&text, base, &origin, if is_json { Format::Json } else { Format::Yaml })
}

#[derive(Debug, Clone, Copy)]
enum Format {
    Json,
    Yaml,
}

fn parse_as(text: &str, base_dir: &Path, origin: &str, format: Format) -> Result<JobSpecBuilder, LoaderError> {
    let fail = |message: String| LoaderError::SpecFile {
        origin: origin.to_owned(),
        message: message.split_whitespace().collect::<Vec<_>>().join(" "),
    };
    let file: SpecFile = match format {
        Format::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            let file = serde_path_to_error::deserialize(&mut de).map_err(|e| fail(e.to_string()))?;
            de.end().map_err(|e| fail(e.to_string()))?;
            file
        }
        // serde_norway tracks the field path itself ("transforms[1]: ...").
        Format::Yaml => serde_norway::from_str(text).map_err(|e| fail(e.to_string()))?,
    };
    let spec = file.into_spec(base_dir);
    loader_proto::spec::check(&spec).map_err(|e| fail(format!("{}: {}", e.field, e.problem)))?;
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
}

fn one() -> Count {
    Count(1)
}

/// A count that fits a u32 (batch size, epochs, consumers); zero passes
/// here and fails in the spec check, with the spec check's message.
#[derive(Debug)]
struct Count(u32);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a positive integer")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
                u32::try_from(v).map(Count).map_err(|_| E::custom(format!("must be at most {}, got {v}", u32::MAX)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("must be > 0, got {v}"))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// The dataset: a one-key map of the kind to its settings. (Written by
/// hand: serde_norway reads derived enums from YAML tags, `!npy {..}`,
/// which nobody writes.)
#[derive(Debug)]
enum DatasetFile {
    ImageFolder(ImageFolderFile),
    Webdataset(WebDatasetFile),
    Npy(NpyFile),
    Tokens(TokensFile),
    Synthetic(SyntheticFile),
    Custom(CustomFile),
}

/// Names of the dataset kinds, for messages.
const DATASETS: &str = "image_folder, webdataset, npy, tokens, synthetic, custom";

impl<'de> Deserialize<'de> for DatasetFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DatasetFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a one-key map of the dataset kind ({DATASETS}) to its settings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DatasetFile, A::Error> {
                let Some(kind) = map.next_key::<String>()? else {
                    return Err(de::Error::custom(format!("empty; expected one of: {DATASETS}")));
                };
                let dataset = match kind.as_str() {
                    "image_folder" | "imagefolder" => DatasetFile::ImageFolder(map.next_value()?),
                    "webdataset" => DatasetFile::Webdataset(map.next_value()?),
                    "npy" => DatasetFile::Npy(map.next_value()?),
                    "tokens" => DatasetFile::Tokens(map.next_value()?),
                    "synthetic" => DatasetFile::Synthetic(map.next_value()?),
                    "custom" => DatasetFile::Custom(map.next_value()?),
                    other => {
                        return Err(de::Error::custom(format!("unknown dataset `{other}`; expected one of: {DATASETS}")));
                    }
                };
                if let Some(extra) = map.next_key::<String>()? {
                    return Err(de::Error::custom(format!("one dataset per job; got `{kind}` and `{extra}`")));
                }
                Ok(dataset)
            }
        }
        d.deserialize_map(V)
    }
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
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CustomFile {
    name: String,
    num_samples: u64,
    #[serde(default)]
    params: HashMap<String, Scalar>,
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
        let path = |p: &str| resolve(base, p);
        let kind = match self.dataset {
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
                arrays: n.arrays.0.into_iter().map(|(name, p)| NpyArray { name, path: path(&p) }).collect(),
                num_samples: 0,
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
            }),
            DatasetFile::Custom(c) => Kind::Custom(CustomSpec {
                name: c.name,
                num_samples: c.num_samples,
                params: c.params.into_iter().map(|(k, v)| (k, v.0)).collect(),
            }),
        };
        JobSpec {
            name: self.name,
            dataset: Some(DatasetSpec { kind: Some(kind) }),
            sampler: Some(SamplerSpec {
                shuffle: self.sampler.shuffle,
                seed: self.sampler.seed,
                drop_last: self.sampler.drop_last,
            }),
            batch_size: self.batch_size.0,
            epochs: self.epochs.0,
            consumers: self.consumers.0,
            transforms: self.transforms.into_iter().map(|t| t.0).collect(),
            on_corrupt: match self.on_corrupt {
                PolicyFile::Fail => CorruptPolicy::Fail,
                PolicyFile::Skip => CorruptPolicy::Skip,
            } as i32,
        }
    }
}

/// `p` relative to `base` when relative, made absolute (workers may run in
/// another working directory).
fn resolve(base: &Path, p: &str) -> String {
    let joined = base.join(p);
    std::path::absolute(&joined).unwrap_or(joined).to_string_lossy().into_owned()
}

/// Names of the transforms, for messages.
const TRANSFORMS: &str = "decode, random_resized_crop, resize, center_crop, horizontal_flip, normalize, cast, layout";

/// One pipeline step: a bare name (`decode`, `horizontal_flip`) or a
/// one-key map of the name to its settings (`{resize: {size: 256}}`).
#[derive(Debug)]
struct TransformFile(Transform);

impl<'de> Deserialize<'de> for TransformFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TransformVisitor).map(TransformFile)
    }
}

struct TransformVisitor;

fn unknown_transform<E: de::Error>(name: &str) -> E {
    E::custom(format!("unknown transform `{name}`; expected one of: {TRANSFORMS}"))
}

fn op(op: Op) -> Transform {
    Transform { op: Some(op) }
}

impl<'de> Visitor<'de> for TransformVisitor {
    type Value = Transform;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a transform: a name such as `decode`, or a one-key map such as `{resize: {size: 256}}`")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<Transform, E> {
        match name {
            "decode" => Ok(transforms::decode()),
            "horizontal_flip" => Ok(transforms::horizontal_flip()),
            "random_resized_crop" | "resize" | "center_crop" => {
                Err(E::custom(format!("transform `{name}` needs a size, e.g. `{{{name}: {{size: 224}}}}`")))
            }
            "normalize" => Err(E::custom("transform `normalize` needs `{normalize: {mean: [r, g, b], std: [r, g, b]}}`")),
            "cast" => Err(E::custom("transform `cast` needs a dtype, e.g. `{cast: {dtype: float32}}`")),
            "layout" => Err(E::custom("transform `layout` needs `{layout: chw}` or `{layout: hwc}`")),
            other => Err(unknown_transform(other)),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Transform, A::Error> {
        let Some(name) = map.next_key::<String>()? else {
            return Err(de::Error::custom(format!("empty transform; expected one of: {TRANSFORMS}")));
        };
        let transform = match name.as_str() {
            "decode" => {
                map.next_value::<NoSettings>()?;
                transforms::decode()
            }
            "random_resized_crop" => {
                let c: CropFile = map.next_value()?;
                op(Op::RandomResizedCrop(RandomResizedCrop {
                    size: c.size.0,
                    scale: c.scale.map(Vec::from).unwrap_or_default(),
                    ratio: c.ratio.map(Vec::from).unwrap_or_default(),
                }))
            }
            "resize" => op(Op::Resize(Resize { size: map.next_value::<SizeFile>()?.size.0 })),
            "center_crop" => op(Op::CenterCrop(CenterCrop { size: map.next_value::<SizeFile>()?.size.0 })),
            "horizontal_flip" => {
                let p = map.next_value::<Option<FlipFile>>()?.and_then(|f| f.p);
                op(Op::HorizontalFlip(HorizontalFlip { p }))
            }
            "normalize" => {
                let n: NormalizeFile = map.next_value()?;
                op(Op::Normalize(Normalize { mean: n.mean, std: n.std }))
            }
            "cast" => op(Op::Cast(loader_proto::pb::Cast { dtype: map.next_value::<CastFile>()?.dtype.0 as i32 })),
            "layout" => op(Op::Layout(map.next_value::<LayoutName>()?.0 as i32)),
            other => return Err(unknown_transform(other)),
        };
        if let Some(extra) = map.next_key::<String>()? {
            return Err(de::Error::custom(format!(
                "one transform per list item; `{name}` and `{extra}` share one"
            )));
        }
        Ok(transform)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CropFile {
    size: Size,
    #[serde(default)]
    scale: Option<[f32; 2]>,
    #[serde(default)]
    ratio: Option<[f32; 2]>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SizeFile {
    size: Size,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FlipFile {
    #[serde(default)]
    p: Option<f32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NormalizeFile {
    mean: Vec<f32>,
    std: Vec<f32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CastFile {
    dtype: DtypeName,
}

/// A transform without settings: `decode`, `{decode: }` or `{decode: {}}`.
#[derive(Debug)]
struct NoSettings;

impl<'de> Deserialize<'de> for NoSettings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NoSettings;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("no settings")
            }
            fn visit_unit<E: de::Error>(self) -> Result<NoSettings, E> {
                Ok(NoSettings)
            }
            fn visit_none<E: de::Error>(self) -> Result<NoSettings, E> {
                Ok(NoSettings)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NoSettings, A::Error> {
                match map.next_key::<String>()? {
                    None => Ok(NoSettings),
                    Some(k) => Err(de::Error::custom(format!("takes no settings, got `{k}`"))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A size in pixels: one positive number or `[height, width]`.
#[derive(Debug)]
struct Size(Vec<u32>);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SizeVisitor).map(Size)
    }
}

struct SizeVisitor;

fn pixels<E: de::Error>(v: i128) -> Result<u32, E> {
    match u32::try_from(v) {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(E::custom(format!("must be a positive number of pixels, got {v}"))),
    }
}

impl<'de> Visitor<'de> for SizeVisitor {
    type Value = Vec<u32>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a positive size in pixels or [height, width]")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Vec<u32>, E> {
        Ok(vec![pixels(i128::from(v))?])
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Vec<u32>, E> {
        Ok(vec![pixels(i128::from(v))?])
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u32>, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<i64>()? {
            out.push(pixels(i128::from(v))?);
        }
        if !(1..=2).contains(&out.len()) {
            return Err(de::Error::custom(format!("expected one size or [height, width], got {} values", out.len())));
        }
        Ok(out)
    }
}

/// An element type by its numpy name (`uint8`, `float32`, ...).
#[derive(Debug)]
struct DtypeName(Dtype);

impl<'de> Deserialize<'de> for DtypeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(NameVisitor("a dtype name such as uint8 or float32", |name| {
            Dtype::parse(name).map(DtypeName).ok_or_else(|| {
                format!(
                    "unknown dtype `{name}`; expected one of: uint8, int8, uint16, int16, uint32, int32, \
                     uint64, int64, float16, bfloat16, float32, float64, bool"
                )
            })
        }))
    }
}

/// Reads a name and maps it, failing inside the deserializer's call so the
/// error carries the name's own field path.
struct NameVisitor<T>(&'static str, fn(&str) -> Result<T, String>);

impl<T> Visitor<'_> for NameVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        (self.1)(v).map_err(E::custom)
    }
}

/// `chw` or `hwc`.
#[derive(Debug)]
struct LayoutName(Layout);

impl<'de> Deserialize<'de> for LayoutName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(NameVisitor("chw or hwc", |name| match name.to_ascii_lowercase().as_str() {
            "chw" => Ok(LayoutName(Layout::Chw)),
            "hwc" => Ok(LayoutName(Layout::Hwc)),
            _ => Err(format!("unknown layout `{name}`; expected chw or hwc")),
        }))
    }
}

/// A string, number or boolean, kept as text (custom dataset params).
#[derive(Debug)]
struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, number or boolean")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_owned()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// `name: path` pairs in the order written (npy arrays).
#[derive(Debug)]
struct NamedPaths(Vec<(String, String)>);

impl<'de> Deserialize<'de> for NamedPaths {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NamedPaths;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of tensor name to .npy path, e.g. {x: x.npy, y: y.npy}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NamedPaths, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, String>()? {
                    out.push((k, v));
                }
                Ok(NamedPaths(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Shard paths: a list, or one pattern with a numeric range in braces as
/// WebDataset writes them (`train-{000000..000146}.tar`).
#[derive(Debug)]
struct Shards(Vec<String>);

/// Most shards one brace range may expand to.
const MAX_SHARDS: u64 = 1_000_000;

impl<'de> Deserialize<'de> for Shards {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Shards;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of tar paths or a pattern such as `train-{000..099}.tar`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Shards, E> {
                expand_braces(v).map(Shards).map_err(E::custom)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shards, A::Error> {
                let mut out = Vec::new();
                while let Some(p) = seq.next_element::<String>()? {
                    out.extend(expand_braces(&p).map_err(de::Error::custom)?);
                }
                Ok(Shards(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// Expands one `{first..last}` range (zero-padded to the width of `first`
/// when it has leading zeros); text without a range stays as it is.
fn expand_braces(pattern: &str) -> Result<Vec<String>, String> {
    let Some(open) = pattern.find('{') else {
        return Ok(vec![pattern.to_owned()]);
    };
    let bad = || format!("bad shard range in `{pattern}`; expected e.g. `train-{{000..099}}.tar`");
    let close = pattern[open..].find('}').map(|i| i + open).ok_or_else(bad)?;
    let (first, last) = pattern[open + 1..close].split_once("..").ok_or_else(bad)?;
    let (a, b) = (first.parse::<u64>().map_err(|_| bad())?, last.parse::<u64>().map_err(|_| bad())?);
    if b < a || b - a >= MAX_SHARDS {
        return Err(bad());
    }
    let width = if first.starts_with('0') { first.len() } else { 0 };
    let (head, tail) = (&pattern[..open], &pattern[close + 1..]);
    Ok((a..=b).map(|i| format!("{head}{i:0width$}{tail}")).collect())
}

#[cfg(test)]
mod tests;
