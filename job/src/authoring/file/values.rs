//! The scalar values of a spec file, each read with a message that names
//! what was expected: counts, sizes in pixels, dtype and layout names,
//! custom-dataset parameters, npy arrays and shard lists.

use std::fmt;

use loader_proto::pb::{Dtype, Interpolation, Layout};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

/// A count that fits a u32 (batch size, epochs, consumers); zero passes
/// here and fails in the spec check, with the spec check's message.
#[derive(Debug)]
pub(super) struct Count(pub(super) u32);

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

/// A size in pixels: one positive number or `[height, width]`.
#[derive(Debug)]
pub(super) struct Size(pub(super) Vec<u32>);

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
pub(super) struct DtypeName(pub(super) Dtype);

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
pub(super) struct LayoutName(pub(super) Layout);

impl<'de> Deserialize<'de> for LayoutName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(NameVisitor("chw or hwc", |name| match name.to_ascii_lowercase().as_str() {
            "chw" => Ok(LayoutName(Layout::Chw)),
            "hwc" => Ok(LayoutName(Layout::Hwc)),
            _ => Err(format!("unknown layout `{name}`; expected chw or hwc")),
        }))
    }
}

/// A resize's filter: `bilinear` or `bicubic` (torchvision's
/// `InterpolationMode` values).
#[derive(Debug)]
pub(super) struct InterpolationName(pub(super) Interpolation);

impl<'de> Deserialize<'de> for InterpolationName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(NameVisitor("bilinear or bicubic", |name| match name.to_ascii_lowercase().as_str() {
            "bilinear" => Ok(InterpolationName(Interpolation::Bilinear)),
            "bicubic" => Ok(InterpolationName(Interpolation::Bicubic)),
            _ => Err(format!("unknown interpolation `{name}`; expected bilinear or bicubic")),
        }))
    }
}

/// A string, number or boolean, kept as text (custom dataset params).
#[derive(Debug)]
pub(super) struct Scalar(pub(super) String);

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
pub(super) struct NamedPaths(pub(super) Vec<(String, String)>);

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
pub(super) struct Shards(pub(super) Vec<String>);

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
pub(super) fn expand_braces(pattern: &str) -> Result<Vec<String>, String> {
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

