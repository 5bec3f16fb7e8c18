//! Element types: the one table of sizes and names, shared by the wire format,
//! the datasets and the SDK.

use crate::pb::Dtype;

impl Dtype {
    /// Bytes per element; 0 for `DTYPE_UNSPECIFIED`.
    pub fn size(self) -> usize {
        match self {
            Dtype::Unspecified => 0,
            Dtype::U8 | Dtype::I8 | Dtype::Bool => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
        }
    }

    /// The short name users write (`uint8`, `float32`, ...), as numpy spells it.
    pub fn short_name(self) -> &'static str {
        match self {
            Dtype::Unspecified => "unspecified",
            Dtype::U8 => "uint8",
            Dtype::I8 => "int8",
            Dtype::U16 => "uint16",
            Dtype::I16 => "int16",
            Dtype::U32 => "uint32",
            Dtype::I32 => "int32",
            Dtype::U64 => "uint64",
            Dtype::I64 => "int64",
            Dtype::F16 => "float16",
            Dtype::Bf16 => "bfloat16",
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
            Dtype::Bool => "bool",
        }
    }

    /// Parses a numpy-style name (`uint8`, `u8`, `float32`, `f32`, ...).
    pub fn parse(name: &str) -> Option<Dtype> {
        Some(match name.to_ascii_lowercase().as_str() {
            "uint8" | "u8" => Dtype::U8,
            "int8" | "i8" => Dtype::I8,
            "uint16" | "u16" => Dtype::U16,
            "int16" | "i16" => Dtype::I16,
            "uint32" | "u32" => Dtype::U32,
            "int32" | "i32" => Dtype::I32,
            "uint64" | "u64" => Dtype::U64,
            "int64" | "i64" => Dtype::I64,
            "float16" | "f16" | "half" => Dtype::F16,
            "bfloat16" | "bf16" => Dtype::Bf16,
            "float32" | "f32" | "float" => Dtype::F32,
            "float64" | "f64" | "double" => Dtype::F64,
            "bool" => Dtype::Bool,
            _ => return None,
        })
    }

    /// The dtype whose wire code is `code`, if any (never `Unspecified`).
    pub fn from_code(code: u8) -> Option<Dtype> {
        match Dtype::try_from(i32::from(code)) {
            Ok(Dtype::Unspecified) | Err(_) => None,
            Ok(d) => Some(d),
        }
    }

    /// The code written into the batch wire format.
    pub fn code(self) -> u8 {
        // Enum values are small and fixed by the .proto file.
        self as i32 as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_names_parse() {
        for code in 0..=255u8 {
            if let Some(d) = Dtype::from_code(code) {
                assert_eq!(d.code(), code);
                assert_eq!(Dtype::parse(d.short_name()), Some(d));
                assert!(d.size() > 0);
            }
        }
        assert_eq!(Dtype::from_code(0), None);
        assert_eq!(Dtype::parse("complex128"), None);
    }
}
