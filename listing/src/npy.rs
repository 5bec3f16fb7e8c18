//! The header of a `.npy` file: what numpy's `np.save` writes.
//!
//! ```text
//! \x93NUMPY major minor  header_len (u16 in v1, u32 in v2/v3)  header  data
//! ```
//! The header is a Python dict literal such as
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 3), }`.
//! Only what a batch can hold as-is is accepted: C order, little-endian (or
//! single-byte) numeric and bool dtypes, at least one dimension (the rows).
//! Everything else is refused with the reason, never reinterpreted.

use std::io::Read;
use std::path::Path;

use loader_proto::pb::Dtype;

use crate::ListingError;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Largest header accepted: real headers are a few hundred bytes, and this
/// bounds what a lying length can make a reader allocate.
const MAX_HEADER: u64 = 1 << 20;

/// Where an array's rows lie in its `.npy` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    /// Element type.
    pub dtype: Dtype,
    /// Full shape; the first dimension counts the rows (samples).
    pub shape: Vec<u64>,
    /// Byte offset of the first element.
    pub data_offset: u64,
}

impl NpyHeader {
    /// Number of rows (samples).
    pub fn rows(&self) -> u64 {
        self.shape.first().copied().unwrap_or(0)
    }

    /// Shape of one row.
    pub fn row_shape(&self) -> &[u64] {
        self.shape.get(1..).unwrap_or(&[])
    }

    /// Bytes of one row, or None on overflow.
    pub fn row_bytes(&self) -> Option<u64> {
        loader_proto::batch::tensor_bytes(self.dtype, self.row_shape())
    }

    /// Bytes of all the data, or None on overflow.
    pub fn data_bytes(&self) -> Option<u64> {
        loader_proto::batch::tensor_bytes(self.dtype, &self.shape)
    }

    /// Where the data ends in the file, or None on overflow.
    pub fn data_end(&self) -> Option<u64> {
        self.data_bytes()?.checked_add(self.data_offset)
    }
}

/// Reads the header of the `.npy` file at `path` and checks that the file
/// holds all the data the header promises.
pub fn read_header(path: &Path) -> Result<NpyHeader, ListingError> {
    let (file, file_len) = crate::source::open(path)?;
    let header = read_header_of(file, file_len, path)?;
    check_data_fits(&header, file_len, path)?;
    Ok(header)
}

/// Reads the header of the `.npy` file at `path` without checking the
/// data's length: for a reader that checks it against its own view of the
/// file (a worker's mapping, whose length is what it will read).
pub fn read_header_only(path: &Path) -> Result<NpyHeader, ListingError> {
    let (file, file_len) = crate::source::open(path)?;
    read_header_of(file, file_len, path)
}

/// Checks that a file of `file_len` bytes holds all the data `header`
/// promises.
fn check_data_fits(header: &NpyHeader, file_len: u64, path: &Path) -> Result<(), ListingError> {
    if header.data_end().is_none_or(|n| n > file_len) {
        return Err(ListingError::new(
            path,
            format!(
                "shape {:?} of {} needs {} bytes after the header, the file has {}",
                header.shape,
                header.dtype.short_name(),
                header.data_bytes().map_or_else(|| "too many".into(), |d| d.to_string()),
                file_len.saturating_sub(header.data_offset)
            ),
        ));
    }
    Ok(())
}

/// The header of the npy file `path` names, read from `file` of
/// `file_len` bytes: an object the caller holds open already, so that the
/// header's chunk is fetched once, for the header and the rows after it.
/// The data's length is not checked (`read_header` checks it).
pub fn read_header_of(mut file: crate::source::Source, file_len: u64, path: &Path) -> Result<NpyHeader, ListingError> {
    let mut prefix = [0u8; 12];
    let got = read_up_to(&mut file, &mut prefix).map_err(|e| ListingError::io(path, &e))?;
    let (header_len, start) = header_span(&prefix[..got]).map_err(|p| ListingError::new(path, p))?;
    if header_len > MAX_HEADER || start + header_len > file_len {
        return Err(ListingError::new(path, format!("npy header of {header_len} bytes does not fit the file")));
    }
    let mut text = vec![0u8; header_len as usize];
    // The prefix read may have taken a few header bytes (v1 headers start at 10).
    let taken = got.saturating_sub(start as usize);
    text[..taken].copy_from_slice(&prefix[start as usize..got]);
    file.read_exact(&mut text[taken..]).map_err(|e| ListingError::io(path, &e))?;
    parse_dict(&text, start + header_len).map_err(|p| ListingError::new(path, p))
}

fn read_up_to(file: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// `(header length, header start)` from the first bytes of the file.
fn header_span(prefix: &[u8]) -> Result<(u64, u64), String> {
    if prefix.len() < 10 || &prefix[..6] != MAGIC {
        return Err("not a .npy file (no \\x93NUMPY magic)".into());
    }
    match prefix[6] {
        1 => Ok((u64::from(u16::from_le_bytes([prefix[8], prefix[9]])), 10)),
        2 | 3 if prefix.len() >= 12 => {
            Ok((u64::from(u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]])), 12))
        }
        v => Err(format!("npy format version {v} is not supported (1, 2 or 3)")),
    }
}

/// Parses the header dict; `data_offset` is where the data starts.
pub fn parse_dict(text: &[u8], data_offset: u64) -> Result<NpyHeader, String> {
    let text = std::str::from_utf8(text).map_err(|_| "npy header is not text".to_owned())?;
    let descr = dict_value(text, "descr")?;
    let descr = descr
        .strip_prefix('\'')
        .and_then(|d| d.strip_suffix('\''))
        .or_else(|| descr.strip_prefix('"').and_then(|d| d.strip_suffix('"')))
        .ok_or_else(|| format!("dtype {descr} is not supported (structured dtypes cannot be batched)"))?;
    let dtype = parse_descr(descr)?;
    match dict_value(text, "fortran_order")? {
        "False" => {}
        "True" => return Err("array is in Fortran order; save it C-contiguous (np.ascontiguousarray)".into()),
        other => return Err(format!("fortran_order is {other}, expected True or False")),
    }
    let shape = dict_value(text, "shape")?;
    let inner = shape
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("shape {shape} is not a tuple"))?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.trim_end_matches('L').parse::<u64>().map_err(|_| format!("shape ({inner}) is not a tuple of sizes")))
        .collect::<Result<Vec<u64>, String>>()?;
    if shape.is_empty() {
        return Err("array is a scalar; expected rows (at least one dimension)".into());
    }
    if shape.len() > loader_proto::batch::MAX_NDIM {
        return Err(format!("{} dimensions; a batch holds rows of at most {} more", shape.len(), loader_proto::batch::MAX_NDIM - 1));
    }
    Ok(NpyHeader { dtype, shape, data_offset })
}

/// The value text of `'key': value` in a Python dict literal whose values
/// are strings, booleans or tuples (never nested dicts).
fn dict_value<'a>(text: &'a str, key: &str) -> Result<&'a str, String> {
    let missing = || format!("npy header has no '{key}'");
    let at = [format!("'{key}'"), format!("\"{key}\"")]
        .iter()
        .find_map(|k| text.find(k.as_str()).map(|i| i + k.len()))
        .ok_or_else(missing)?;
    let rest = text[at..].trim_start().strip_prefix(':').ok_or_else(missing)?.trim_start();
    let end = match rest.chars().next() {
        Some('(') => rest.find(')').map(|i| i + 1),
        Some(q @ ('\'' | '"')) => rest[1..].find(q).map(|i| i + 2),
        Some('[') => rest.find(']').map(|i| i + 1),
        _ => rest.find([',', '}']),
    }
    .ok_or_else(|| format!("npy header value of '{key}' is not terminated"))?;
    Ok(rest[..end].trim())
}

/// numpy's type string (`<f4`, `|u1`, ...) as a dtype.
fn parse_descr(descr: &str) -> Result<Dtype, String> {
    let unsupported = || {
        format!(
            "dtype '{descr}' is not supported; expected little-endian bool, (u)int8/16/32/64 or float16/32/64"
        )
    };
    let (order, kind) = descr.split_at_checked(1).ok_or_else(unsupported)?;
    let dtype = match kind {
        "b1" | "?" => Dtype::Bool,
        "u1" => Dtype::U8,
        "i1" => Dtype::I8,
        "u2" => Dtype::U16,
        "i2" => Dtype::I16,
        "u4" => Dtype::U32,
        "i4" => Dtype::I32,
        "u8" => Dtype::U64,
        "i8" => Dtype::I64,
        "f2" => Dtype::F16,
        "f4" => Dtype::F32,
        "f8" => Dtype::F64,
        _ => return Err(unsupported()),
    };
    // '=' is native order, little-endian on every platform this runs on.
    let little = matches!(order, "<" | "=") || (order == "|" || order == ">") && dtype.size() == 1;
    if !little {
        return Err(unsupported());
    }
    Ok(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes `np.save` writes for an array of `descr` and `shape`.
    pub(crate) fn npy_bytes(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + dict.len() + 1) % 64 != 0 {
            dict.push(' ');
        }
        dict.push('\n');
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        out.extend_from_slice(dict.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn headers_numpy_writes_parse() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.npy");
        std::fs::write(&path, npy_bytes("<f4", "(5, 2, 3)", &[0u8; 5 * 6 * 4])).expect("write");
        let h = read_header(&path).expect("header");
        assert_eq!((h.dtype, h.shape.clone(), h.data_offset), (Dtype::F32, vec![5, 2, 3], 128));
        assert_eq!((h.rows(), h.row_shape(), h.row_bytes()), (5, &[2u64, 3][..], Some(24)));

        std::fs::write(&path, npy_bytes("|u1", "(7,)", &[0u8; 7])).expect("write");
        let h = read_header(&path).expect("header");
        assert_eq!((h.dtype, h.rows(), h.row_shape()), (Dtype::U8, 7, &[][..]));
    }

    #[test]
    fn unsupported_or_short_files_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.npy");
        let cases = [
            (npy_bytes(">f4", "(2,)", &[0; 8]), "dtype '>f4' is not supported"),
            (npy_bytes("<c8", "(2,)", &[0; 16]), "dtype '<c8' is not supported"),
            (npy_bytes("<i8", "()", &[0; 8]), "array is a scalar"),
            (npy_bytes("<i8", "(3,)", &[0; 16]), "shape [3] of int64 needs 24 bytes after the header, the file has 16"),
            (b"PK\x03\x04 not npy".to_vec(), "not a .npy file"),
        ];
        for (bytes, expect) in cases {
            std::fs::write(&path, &bytes).expect("write");
            let e = read_header(&path).expect_err(expect).to_string();
            assert!(e.starts_with(&format!("{}: {expect}", path.display())), "{e}");
        }
        let e = parse_dict(b"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 128).expect_err("fortran");
        assert!(e.starts_with("array is in Fortran order"), "{e}");
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = parse_dict(&bytes, 0);
            let _ = header_span(&bytes);
        }
    }
}
