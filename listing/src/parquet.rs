//! The footer of a Parquet file: its row groups' row counts and, for each
//! top-level column, the tensor one row of it becomes. Read from the footer
//! alone (a few KB at the end of the file), by the submitter to fill in the
//! job's counts and row sizes, and by each worker to check that the files
//! still hold what the job was planned for.
//!
//! A column is a tensor when each row holds a fixed number of elements of
//! one numeric or boolean type: a plain column (one element) or a
//! fixed-size list of them, nested lists giving more dimensions (a
//! `FixedSizeList<FixedSizeList<u8, 3>, 32>` row is a `[32, 3]` tensor).
//! Strings, variable-length lists, structs and maps are not, and a job
//! that asks for one is refused with the column and its type named. So is
//! a file compressed with a codec this build leaves out (gzip, brotli,
//! LZO): pyarrow, polars and Spark write snappy or zstd by default.

use std::path::Path;

use arrow_schema::{DataType, Field};
use loader_proto::pb::Dtype;
use parquet::arrow::parquet_to_arrow_schema;
use parquet::basic::Compression;
use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::ListingError;

/// What one row of a column is as a tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnTensor {
    /// Element type.
    pub dtype: Dtype,
    /// Shape of one row's tensor (empty: one element).
    pub shape: Vec<u64>,
}

impl ColumnTensor {
    /// Bytes of one row's tensor, or None on overflow.
    pub fn row_bytes(&self) -> Option<u64> {
        loader_proto::batch::tensor_bytes(self.dtype, &self.shape)
    }
}

/// One top-level column: its name, and its tensor or why it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// The column's name in the file's schema.
    pub name: String,
    /// Its tensor, or why a row of it is not one.
    pub tensor: Result<ColumnTensor, String>,
    /// A binary column: its rows may be encoded images.
    pub binary: bool,
}

/// What a Parquet file's footer says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    /// Rows of each row group, in file order.
    pub row_groups: Vec<u64>,
    /// Top-level columns, in schema order.
    pub columns: Vec<Column>,
}

impl Footer {
    /// Rows in the file.
    pub fn rows(&self) -> u64 {
        self.row_groups.iter().sum()
    }

    /// The tensors of the columns `names` (when empty, every column but
    /// `image_column`), in that order; an error names the file, the column
    /// and why.
    pub fn select(&self, path: &Path, names: &[String], image_column: &str) -> Result<Vec<(String, ColumnTensor)>, ListingError> {
        let wanted: Vec<&Column> = if names.is_empty() {
            self.columns.iter().filter(|c| c.name != image_column).collect()
        } else {
            names
                .iter()
                .map(|n| {
                    self.columns.iter().find(|c| &c.name == n).ok_or_else(|| {
                        let have: Vec<&str> = self.columns.iter().map(|c| c.name.as_str()).collect();
                        ListingError::new(path, format!("has no column `{n}`; its columns: {}", have.join(", ")))
                    })
                })
                .collect::<Result<_, _>>()?
        };
        if wanted.is_empty() && image_column.is_empty() {
            return Err(ListingError::new(path, "has no columns"));
        }
        wanted
            .into_iter()
            .map(|c| match &c.tensor {
                Ok(t) => Ok((c.name.clone(), t.clone())),
                Err(why) => Err(ListingError::new(
                    path,
                    format!("column `{}`: {why}; name the columns to read (`columns`) to leave it out", c.name),
                )),
            })
            .collect()
    }
}

impl Footer {
    /// Checks that `name` is a binary column (of encoded images).
    pub fn check_image(&self, path: &Path, name: &str) -> Result<(), ListingError> {
        match self.columns.iter().find(|c| c.name == name) {
            Some(c) if c.binary => Ok(()),
            Some(_) => Err(ListingError::new(path, format!("image column `{name}` is not a binary column (of encoded JPEG or PNG images)"))),
            None => Err(ListingError::new(path, format!("has no image column `{name}`"))),
        }
    }
}

/// Reads the footer of the Parquet file at `path`.
pub fn read_footer(path: &Path) -> Result<Footer, ListingError> {
    let file = crate::source::ParquetSource::open(path)?;
    let reader = SerializedFileReader::new(file).map_err(|e| ListingError::new(path, format!("not a readable Parquet file: {e}")))?;
    let meta = reader.metadata();
    let row_groups = meta
        .row_groups()
        .iter()
        .map(|g| u64::try_from(g.num_rows()).map_err(|_| ListingError::new(path, "a row group has a negative row count")))
        .collect::<Result<_, _>>()?;
    for group in meta.row_groups() {
        for column in group.columns() {
            let codec = column.compression();
            if !matches!(
                codec,
                Compression::UNCOMPRESSED | Compression::SNAPPY | Compression::ZSTD(_) | Compression::LZ4 | Compression::LZ4_RAW
            ) {
                return Err(ListingError::new(
                    path,
                    format!(
                        "column `{}` is compressed with {codec}, which Loader does not read (it reads snappy, zstd, lz4 and uncompressed files: rewrite it with one of those)",
                        column.column_path()
                    ),
                ));
            }
        }
    }
    let file_meta = meta.file_metadata();
    let schema = parquet_to_arrow_schema(file_meta.schema_descr(), file_meta.key_value_metadata())
        .map_err(|e| ListingError::new(path, format!("its schema has no Arrow equivalent: {e}")))?;
    let columns = schema
        .fields()
        .iter()
        .map(|f| Column {
            name: f.name().clone(),
            tensor: tensor_of(f),
            binary: matches!(f.data_type(), DataType::Binary | DataType::LargeBinary | DataType::BinaryView),
        })
        .collect();
    Ok(Footer { row_groups, columns })
}

/// The tensor one row of `field` is, or why it is not one.
fn tensor_of(field: &Field) -> Result<ColumnTensor, String> {
    let mut shape = Vec::new();
    let mut ty = field.data_type();
    loop {
        match ty {
            DataType::FixedSizeList(inner, n) => {
                let n = u64::try_from(*n).map_err(|_| format!("a fixed-size list of {n} elements"))?;
                shape.push(n);
                ty = inner.data_type();
            }
            other => {
                let dtype = element(other).ok_or_else(|| {
                    format!("{other} is not a tensor (numeric or boolean values, or fixed-size lists of them)")
                })?;
                return Ok(ColumnTensor { dtype, shape });
            }
        }
    }
}

/// The tensor element type of an Arrow value type, if it has one.
pub fn element(ty: &DataType) -> Option<Dtype> {
    Some(match ty {
        DataType::Boolean => Dtype::Bool,
        DataType::Int8 => Dtype::I8,
        DataType::Int16 => Dtype::I16,
        DataType::Int32 => Dtype::I32,
        DataType::Int64 => Dtype::I64,
        DataType::UInt8 => Dtype::U8,
        DataType::UInt16 => Dtype::U16,
        DataType::UInt32 => Dtype::U32,
        DataType::UInt64 => Dtype::U64,
        DataType::Float16 => Dtype::F16,
        DataType::Float32 => Dtype::F32,
        DataType::Float64 => Dtype::F64,
        _ => return None,
    })
}
