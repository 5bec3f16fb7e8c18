//! One step of a spec file's `transforms` list: a bare name (`decode`,
//! `horizontal_flip`) or a one-key map of the name to its settings
//! (`{resize: {size: 256}}`), read into the protocol's [`Transform`].

use std::fmt;

use loader_proto::pb::{
    CenterCrop, HorizontalFlip, Interpolation, Normalize, RandomResizedCrop, Resize, Transform, transform::Op,
};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::values::{DtypeName, InterpolationName, LayoutName, Size};
use crate::authoring::transforms;

/// Names of the transforms, for messages.
const TRANSFORMS: &str = "decode, random_resized_crop, resize, center_crop, horizontal_flip, normalize, cast, layout";

/// One pipeline step: a bare name (`decode`, `horizontal_flip`) or a
/// one-key map of the name to its settings (`{resize: {size: 256}}`).
#[derive(Debug)]
pub(super) struct TransformFile(pub(super) Transform);

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
                    interpolation: interpolation(c.interpolation),
                }))
            }
            "resize" => {
                let r: ResizeFile = map.next_value()?;
                op(Op::Resize(Resize { size: r.size.0, interpolation: interpolation(r.interpolation) }))
            }
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

/// The wire value of an optional `interpolation:`; left out stays
/// unspecified (bilinear), so a spec without it encodes as before.
fn interpolation(name: Option<InterpolationName>) -> i32 {
    name.map_or(Interpolation::Unspecified, |n| n.0) as i32
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CropFile {
    size: Size,
    #[serde(default)]
    scale: Option<[f32; 2]>,
    #[serde(default)]
    ratio: Option<[f32; 2]>,
    #[serde(default)]
    interpolation: Option<InterpolationName>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResizeFile {
    size: Size,
    #[serde(default)]
    interpolation: Option<InterpolationName>,
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

