//! `parquet`: sample `i` is row `i` of Parquet files taken one after
//! another; each column read is a tensor of that name.
//!
//! Parquet is read a row group at a time (its pages are compressed and
//! encoded per column chunk), so a worker decodes a whole row group's
//! columns at once, into row-major bytes, and keeps the latest row groups
//! it decoded: a batch whose rows share row groups (the sampler's block
//! shuffle, or no shuffle) decodes each once, and a row is then one copy.
//! Footers are read with `loader_listing::parquet`, the code the submitter
//! counted the rows with, and checked against the job's counts at open.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use loader_listing::source::ParquetSource;
use loader_proto::pb::{Dtype, ParquetSpec, Transform};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};

use super::images::run_pipeline;
use super::{BatchRows, Dataset, DatasetError, SampleKey, SampleTensor, check_rows, sample_bytes};
use crate::image::Pipeline;

const KIND: &str = "parquet";

/// Decoded row groups kept per job, in bytes: a few row groups of any
/// usual size (pyarrow writes up to 1 Mi rows a group; a 128 MB group is
/// common for wide tables).
const CACHE_BYTES: usize = 256 << 20;
/// Row groups kept however large they are, so that a batch spanning two
/// row groups does not decode one of them twice.
const CACHE_MIN_GROUPS: usize = 2;

/// One file: its path and its footer, parsed once.
#[derive(Debug)]
struct ParquetFile {
    path: String,
    /// The file or object, opened once (an object's chunks are then
    /// fetched once per job).
    source: ParquetSource,
    metadata: ArrowReaderMetadata,
    /// Root column index in the file's schema of each column read (the
    /// image column's last, if any).
    roots: Vec<usize>,
}

/// A binary column of encoded images and the job's pipeline for them.
#[derive(Debug)]
struct ImageColumn {
    name: String,
    pipeline: Pipeline,
}

/// Where a row group of the dataset lives.
#[derive(Debug, Clone, Copy)]
struct Group {
    /// Index into `files`.
    file: usize,
    /// Row group index within the file.
    in_file: usize,
    /// Dataset index of its first row.
    first: u64,
    /// Rows it holds.
    rows: u64,
}

/// One row group's columns, decoded.
#[derive(Debug)]
struct Decoded {
    /// Per column read, its rows one after another (`rows x row_bytes`).
    columns: Vec<Vec<u8>>,
    /// The image column's encoded images: row r is
    /// `encoded[offsets[r]..offsets[r + 1]]`.
    encoded: Vec<u8>,
    offsets: Vec<usize>,
    /// Rows holding a null in some column, with that column's index (the
    /// image column's is the number of `columns`): such a row is no tensor
    /// (a corrupt sample).
    nulls: Vec<(u64, usize)>,
}

impl Decoded {
    fn bytes(&self) -> usize {
        self.columns.iter().map(Vec::len).sum::<usize>() + self.encoded.len() + self.offsets.len() * 8
    }
}

/// Rows of Parquet files.
#[derive(Debug)]
pub struct Parquet {
    files: Vec<ParquetFile>,
    groups: Vec<Group>,
    /// The columns' tensors, then the image column's.
    tensors: Vec<SampleTensor>,
    /// Bytes of each tensor's row.
    row_bytes: Vec<usize>,
    image: Option<ImageColumn>,
    len: u64,
    /// The latest row groups decoded, oldest first.
    cache: Mutex<VecDeque<(usize, Arc<Decoded>)>>,
}

impl Parquet {
    /// Reads every file's footer and checks it against the job: the same
    /// row groups, and each column the tensor the submitter saw.
    pub fn open(spec: &ParquetSpec, transforms: &[Transform]) -> Result<Self, DatasetError> {
        if spec.file_rows.len() != spec.files.len() || spec.row_bytes.len() != spec.columns.len() {
            return Err(DatasetError::Spec("dataset.parquet: row groups and columns are not filled in".into()));
        }
        let mut files = Vec::with_capacity(spec.files.len());
        let mut groups = Vec::new();
        let mut tensors: Vec<SampleTensor> = Vec::new();
        let mut first = 0u64;
        for (path, planned) in spec.files.iter().zip(&spec.file_rows) {
            let mismatch = |problem: String| DatasetError::Mismatch { kind: KIND, path: path.clone(), problem };
            let footer = loader_listing::parquet::read_footer(Path::new(path)).map_err(|e| DatasetError::listing(KIND, e))?;
            if footer.row_groups != planned.row_groups {
                return Err(mismatch(format!(
                    "holds row groups of {:?} rows, the job was planned for {:?}",
                    footer.row_groups, planned.row_groups
                )));
            }
            if !spec.image_column.is_empty() {
                footer.check_image(Path::new(path), &spec.image_column).map_err(|e| DatasetError::listing(KIND, e))?;
            }
            let columns = footer
                .select(Path::new(path), &spec.columns, &spec.image_column)
                .map_err(|e| DatasetError::listing(KIND, e))?;
            let these: Vec<SampleTensor> = columns
                .into_iter()
                .map(|(name, t)| SampleTensor { name, dtype: t.dtype, shape: t.shape })
                .collect();
            if tensors.is_empty() {
                tensors = these;
            } else if these != tensors {
                return Err(mismatch(format!("its columns are {these:?}, the first file's {tensors:?}")));
            }
            let file = ParquetSource::open(Path::new(path)).map_err(|e| DatasetError::listing(KIND, e))?;
            let metadata = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new())
                .map_err(|e| mismatch(format!("unreadable footer: {e}")))?;
            let schema = metadata.metadata().file_metadata().schema_descr();
            let roots = spec
                .columns
                .iter()
                .chain(Some(&spec.image_column).filter(|c| !c.is_empty()))
                .map(|name| {
                    (0..schema.num_columns())
                        .map(|leaf| schema.get_column_root_idx(leaf))
                        .find(|&root| schema.root_schema().get_fields().get(root).is_some_and(|f| f.name() == name))
                        .ok_or_else(|| mismatch(format!("has no column `{name}`")))
                })
                .collect::<Result<_, _>>()?;
            for (in_file, &rows) in planned.row_groups.iter().enumerate() {
                groups.push(Group { file: files.len(), in_file, first, rows });
                first = first.checked_add(rows).ok_or_else(|| DatasetError::Spec("dataset.parquet: row counts overflow".into()))?;
            }
            files.push(ParquetFile { path: path.clone(), source: file, metadata, roots });
        }
        if first != spec.num_samples {
            return Err(DatasetError::Spec(format!(
                "dataset.parquet: the row groups hold {first} rows, the job was planned for {}",
                spec.num_samples
            )));
        }
        let mut row_bytes = tensors
            .iter()
            .map(|t| sample_bytes(t).ok_or_else(|| DatasetError::Spec(format!("column `{}`: rows too large", t.name))))
            .collect::<Result<Vec<_>, _>>()?;
        if row_bytes.len() != spec.row_bytes.len() || row_bytes.iter().zip(&spec.row_bytes).any(|(&a, &b)| a as u64 != b) {
            return Err(DatasetError::Spec(format!(
                "dataset.parquet.row_bytes: {:?}, the files' columns make {row_bytes:?}",
                spec.row_bytes
            )));
        }
        let image = if spec.image_column.is_empty() {
            None
        } else {
            let pipeline = Pipeline::new(transforms).map_err(|e| DatasetError::Spec(format!("{KIND} dataset: {e}")))?;
            let (dtype, shape) = pipeline.output();
            tensors.push(SampleTensor { name: spec.image_column.clone(), dtype, shape: shape.to_vec() });
            row_bytes.push(pipeline.output_bytes());
            Some(ImageColumn { name: spec.image_column.clone(), pipeline })
        };
        // Nested fixed-size lists come out of the reader as such; their
        // element type is checked again when a row group is decoded.
        Ok(Self { files, groups, tensors, row_bytes, image, len: first, cache: Mutex::new(VecDeque::new()) })
    }

    /// The row group holding dataset index `index` (< len).
    fn group_of(&self, index: u64) -> usize {
        self.groups.partition_point(|g| g.first <= index).saturating_sub(1)
    }

    /// Row group `g`, decoded now or earlier.
    fn decoded(&self, g: usize) -> Result<Arc<Decoded>, DatasetError> {
        {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, d)) = cache.iter().find(|(at, _)| *at == g) {
                return Ok(Arc::clone(d));
            }
        }
        // Decoded outside the lock: other threads read other row groups
        // meanwhile (two threads may decode the same one; both copies are
        // equal and one is kept).
        let decoded = Arc::new(self.decode(g)?);
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if !cache.iter().any(|(at, _)| *at == g) {
            cache.push_back((g, Arc::clone(&decoded)));
            let mut total: usize = cache.iter().map(|(_, d)| d.bytes()).sum();
            while cache.len() > CACHE_MIN_GROUPS && total > CACHE_BYTES {
                if let Some((_, old)) = cache.pop_front() {
                    total -= old.bytes();
                }
            }
        }
        Ok(decoded)
    }

    /// Decodes the columns read of row group `g`.
    fn decode(&self, g: usize) -> Result<Decoded, DatasetError> {
        let group = self.groups[g];
        let file = &self.files[group.file];
        let corrupt = |reason: String| DatasetError::Corrupt {
            path: format!("{} (row group {})", file.path, group.in_file),
            reason,
        };
        let handle = file.source.share().map_err(|source| DatasetError::Open { kind: KIND, path: file.path.clone(), source })?;
        let schema = file.metadata.metadata().file_metadata().schema_descr_ptr();
        let rows = usize::try_from(group.rows).map_err(|_| corrupt("too many rows".into()))?;
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(handle, file.metadata.clone())
            .with_row_groups(vec![group.in_file])
            .with_projection(ProjectionMask::roots(&schema, file.roots.iter().copied()))
            .with_batch_size(rows.max(1))
            .build()
            .map_err(|e| corrupt(e.to_string()))?;
        // The numeric columns: every tensor but the image's.
        let numeric = self.tensors.len() - usize::from(self.image.is_some());
        let mut columns: Vec<Vec<u8>> = self.row_bytes[..numeric].iter().map(|&n| Vec::with_capacity(n * rows)).collect();
        let (mut encoded, mut offsets) = (Vec::new(), vec![0usize]);
        let mut nulls = Vec::new();
        let mut row = 0u64;
        for batch in reader {
            let batch = batch.map_err(|e| corrupt(e.to_string()))?;
            if let Some(image) = &self.image {
                let array = batch
                    .column_by_name(&image.name)
                    .ok_or_else(|| corrupt(format!("no column `{}` decoded", image.name)))?;
                let null_rows = append_binary(array, &mut encoded, &mut offsets)
                    .map_err(|e| corrupt(format!("column `{}`: {e}", image.name)))?;
                nulls.extend(null_rows.into_iter().map(|r| (row + r, numeric)));
            }
            for (c, tensor) in self.tensors[..numeric].iter().enumerate() {
                let array = batch
                    .column_by_name(&tensor.name)
                    .ok_or_else(|| corrupt(format!("no column `{}` decoded", tensor.name)))?;
                let per_row = tensor.shape.iter().product::<u64>().max(1);
                let mut null_rows = Vec::new();
                flatten(array, tensor.dtype, per_row, &mut columns[c], &mut null_rows)
                    .map_err(|e| corrupt(format!("column `{}`: {e}", tensor.name)))?;
                nulls.extend(null_rows.into_iter().map(|r| (row + r, c)));
            }
            row += batch.num_rows() as u64;
        }
        if row != group.rows {
            return Err(corrupt(format!("decoded {row} rows, the footer says {}", group.rows)));
        }
        if self.image.is_some() && offsets.len() != rows + 1 {
            return Err(corrupt(format!("decoded {} images, the footer says {rows} rows", offsets.len() - 1)));
        }
        for (c, column) in columns.iter().enumerate() {
            if column.len() != self.row_bytes[c] * rows {
                return Err(corrupt(format!("column `{}` decoded to {} bytes, not {}", self.tensors[c].name, column.len(), self.row_bytes[c] * rows)));
            }
        }
        nulls.sort_unstable();
        Ok(Decoded { columns, encoded, offsets, nulls })
    }
}

/// Appends the rows of a binary column to `encoded`, each row's end to
/// `offsets`; returns the rows that are null (empty).
fn append_binary(array: &ArrayRef, encoded: &mut Vec<u8>, offsets: &mut Vec<usize>) -> Result<Vec<u64>, String> {
    let mut nulls = Vec::new();
    let mut push = |i: usize, value: &[u8], null: bool| {
        if null {
            nulls.push(i as u64);
        } else {
            encoded.extend_from_slice(value);
        }
        offsets.push(encoded.len());
    };
    match array.data_type() {
        DataType::Binary => {
            let a = array.as_binary::<i32>();
            (0..a.len()).for_each(|i| push(i, a.value(i), a.is_null(i)));
        }
        DataType::LargeBinary => {
            let a = array.as_binary::<i64>();
            (0..a.len()).for_each(|i| push(i, a.value(i), a.is_null(i)));
        }
        DataType::BinaryView => {
            let a = array.as_binary_view();
            (0..a.len()).for_each(|i| push(i, a.value(i), a.is_null(i)));
        }
        other => return Err(format!("{other} is not a binary column")),
    }
    Ok(nulls)
}

/// Appends the values of `array` (a column of `dtype` elements, or nested
/// fixed-size lists of them, `per_row` elements a row) to `out`, row-major;
/// rows holding a null anywhere go to `null_rows` (their bytes are zeros).
fn flatten(array: &ArrayRef, dtype: Dtype, per_row: u64, out: &mut Vec<u8>, null_rows: &mut Vec<u64>) -> Result<(), String> {
    // Descend through the lists to the leaf values, as one flat array;
    // `group` is how many elements of the current level make one row, so
    // a null at element i of any level nulls row i / group.
    let mut leaf: ArrayRef = Arc::clone(array);
    let mut row_nulls: Vec<u64> = Vec::new();
    let mut group = 1u64;
    while let DataType::FixedSizeList(_, size) = leaf.data_type() {
        let size = u64::try_from(*size).map_err(|_| "a negative list size".to_owned())?;
        let list = leaf.as_fixed_size_list();
        if list.null_count() > 0 {
            row_nulls.extend((0..list.len()).filter(|&i| list.is_null(i)).map(|i| i as u64 / group));
        }
        let start = usize::try_from(list.value_offset(0)).map_err(|_| "a negative list offset".to_owned())?;
        let count = usize::try_from(size).ok().and_then(|n| n.checked_mul(list.len())).ok_or("a list too long")?;
        if start.checked_add(count).is_none_or(|end| end > list.values().len()) {
            return Err("lists reaching past their values".to_owned());
        }
        let values = list.values().slice(start, count);
        group *= size;
        leaf = values;
    }
    if group != per_row {
        return Err(format!("rows of {group} elements, the job expects {per_row}"));
    }
    if loader_listing::parquet::element(leaf.data_type()) != Some(dtype) {
        return Err(format!("values of {}, the job expects {dtype:?}", leaf.data_type()));
    }
    if leaf.null_count() > 0 {
        row_nulls.extend((0..leaf.len()).filter(|&i| leaf.is_null(i)).map(|i| i as u64 / per_row));
    }
    match leaf.data_type() {
        DataType::Boolean => {
            let values = leaf.as_boolean();
            out.extend((0..values.len()).map(|i| u8::from(values.value(i))));
        }
        _ => {
            let data = leaf.to_data();
            let size = data.data_type().primitive_width().ok_or_else(|| format!("values of {}", data.data_type()))?;
            let buffer = data.buffers().first().ok_or_else(|| "no value buffer".to_owned())?;
            let bytes = buffer
                .as_slice()
                .get(data.offset() * size..(data.offset() + data.len()) * size)
                .ok_or_else(|| "a value buffer shorter than its values".to_owned())?;
            out.extend_from_slice(bytes);
        }
    }
    row_nulls.sort_unstable();
    row_nulls.dedup();
    null_rows.extend(row_nulls);
    Ok(())
}

impl Dataset for Parquet {
    fn tensors(&self) -> &[SampleTensor] {
        &self.tensors
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn writes_whole_rows(&self) -> bool {
        // Each numeric row is copied whole; the image pipeline's rows are
        // left to its own contract, so they are zeroed first.
        self.image.is_none()
    }

    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        let g = self.checked_group(key.index, rows)?;
        let decoded = self.decoded(g)?;
        self.read_row(key, g, &decoded, rows)
    }

    /// Looks up each row group once per run of the batch's rows in it (one
    /// cache lookup and lock per row group, not per row).
    fn read_batch(&self, keys: &[SampleKey], batch: &mut BatchRows<'_>) -> Result<(), DatasetError> {
        let mut current: Option<(usize, Arc<Decoded>)> = None;
        for &key in keys {
            let mut rows = batch.next_rows();
            let read = self.checked_group(key.index, &rows).and_then(|g| {
                let decoded = match current.take() {
                    Some((at, d)) if at == g => d,
                    _ => self.decoded(g)?,
                };
                let read = self.read_row(key, g, &decoded, &mut rows);
                current = Some((g, decoded));
                read
            });
            batch.settle(key.index, read)?;
        }
        Ok(())
    }
}

impl Parquet {
    /// The row group of `index`, once the rows handed in are checked
    /// against the tensors and the index against the dataset.
    fn checked_group(&self, index: u64, rows: &[&mut [u8]]) -> Result<usize, DatasetError> {
        check_rows(index, rows, &self.row_bytes)?;
        if index >= self.len {
            return Err(DatasetError::IndexOutOfRange { index, len: self.len });
        }
        Ok(self.group_of(index))
    }

    /// Writes sample `key` of row group `g`, decoded as `decoded`, into
    /// `rows` (checked by `checked_group`).
    fn read_row(&self, key: SampleKey, g: usize, decoded: &Decoded, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        let index = key.index;
        let group = self.groups[g];
        let at = index - group.first;
        let path = || format!("{} (row group {}, row {at})", self.files[group.file].path, group.in_file);
        if let Ok(i) = decoded.nulls.binary_search_by(|&(r, _)| r.cmp(&at)) {
            let column = &self.tensors[decoded.nulls[i].1].name;
            return Err(DatasetError::Corrupt { path: path(), reason: format!("column `{column}` is null") });
        }
        for ((column, row), &n) in decoded.columns.iter().zip(rows.iter_mut()).zip(&self.row_bytes) {
            let start = at as usize * n;
            let Some(bytes) = column.get(start..start + n) else {
                return Err(DatasetError::IndexOutOfRange { index, len: self.len });
            };
            row.copy_from_slice(bytes);
        }
        if let (Some(image), Some(row)) = (&self.image, rows.last_mut()) {
            let r = at as usize;
            let Some(bytes) = decoded.offsets.get(r..r + 2).and_then(|o| decoded.encoded.get(o[0]..o[1])) else {
                return Err(DatasetError::IndexOutOfRange { index, len: self.len });
            };
            run_pipeline(&image.pipeline, bytes, key, row, path)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::path::PathBuf;

    use arrow_array::builder::{FixedSizeListBuilder, Float32Builder};
    use arrow_array::{BooleanArray, Int64Array, RecordBatch, StringArray};
    use loader_proto::pb::ParquetFileRows;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::*;

    /// Writes `rows` rows (x: 3 x f32 = row*10 + k, y: i64 = -row, flag:
    /// row % 3 == 0, name: text) in row groups of `group` rows; row `null`
    /// has a null y.
    fn write(path: &Path, rows: usize, group: usize, null: Option<usize>) {
        let mut x = FixedSizeListBuilder::new(Float32Builder::new(), 3);
        for r in 0..rows {
            for k in 0..3 {
                x.values().append_value((r * 10 + k) as f32);
            }
            x.append(true);
        }
        let y: Int64Array = (0..rows).map(|r| (Some(r) != null).then_some(-(r as i64))).collect();
        let flag: BooleanArray = (0..rows).map(|r| Some(r % 3 == 0)).collect();
        let name: StringArray = (0..rows).map(|r| Some(format!("row {r}"))).collect();
        let batch = RecordBatch::try_from_iter([
            ("x", Arc::new(x.finish()) as ArrayRef),
            ("y", Arc::new(y) as ArrayRef),
            ("flag", Arc::new(flag) as ArrayRef),
            ("name", Arc::new(name) as ArrayRef),
        ])
        .expect("batch");
        let props = WriterProperties::builder().set_max_row_group_size(group).build();
        let mut writer = ArrowWriter::try_new(File::create(path).expect("create"), batch.schema(), Some(props)).expect("writer");
        writer.write(&batch).expect("write");
        writer.close().expect("close");
    }

    fn spec(files: &[PathBuf], columns: &[&str]) -> ParquetSpec {
        let mut spec = ParquetSpec {
            files: files.iter().map(|p| p.display().to_string()).collect(),
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
            ..Default::default()
        };
        for f in &spec.files {
            let footer = loader_listing::parquet::read_footer(Path::new(f)).expect("footer");
            spec.file_rows.push(ParquetFileRows { row_groups: footer.row_groups.clone() });
            spec.num_samples += footer.rows();
            if spec.row_bytes.is_empty() {
                let cols = footer.select(Path::new(f), &spec.columns, &spec.image_column).expect("columns");
                spec.row_bytes = cols.iter().map(|(_, t)| t.row_bytes().expect("size")).collect();
            }
        }
        spec
    }

    fn read(d: &Parquet, index: u64) -> Result<Vec<Vec<u8>>, DatasetError> {
        let mut rows: Vec<Vec<u8>> = d.row_bytes.iter().map(|&n| vec![0; n]).collect();
        let mut refs: Vec<&mut [u8]> = rows.iter_mut().map(Vec::as_mut_slice).collect();
        d.read_into(SampleKey { seed: 0, epoch: 0, index }, &mut refs)?;
        Ok(rows)
    }

    #[test]
    fn rows_of_every_file_and_row_group_arrive_byte_for_byte() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (dir.path().join("a.parquet"), dir.path().join("b.parquet"));
        write(&a, 17, 5, None);
        write(&b, 4, 3, None);
        let d = Parquet::open(&spec(&[a, b], &["flag", "x", "y"]), &[]).expect("open");
        let names: Vec<(&str, Dtype, &[u64])> = d.tensors().iter().map(|t| (t.name.as_str(), t.dtype, t.shape.as_slice())).collect();
        assert_eq!(names, vec![("flag", Dtype::Bool, &[][..]), ("x", Dtype::F32, &[3][..]), ("y", Dtype::I64, &[][..])]);
        assert_eq!(d.len(), 21);
        // Backwards, so that row groups are decoded out of order.
        for index in (0..21u64).rev() {
            let r = if index < 17 { index } else { index - 17 };
            let rows = read(&d, index).expect("row");
            assert_eq!(rows[0], vec![u8::from(r % 3 == 0)], "flag of {index}");
            let x: Vec<u8> = (0..3).flat_map(|k| ((r * 10 + k) as f32).to_le_bytes()).collect();
            assert_eq!(rows[1], x, "x of {index}");
            assert_eq!(rows[2], (-(r as i64)).to_le_bytes().to_vec(), "y of {index}");
        }
        assert!(matches!(read(&d, 21), Err(DatasetError::IndexOutOfRange { index: 21, len: 21 })));
    }

    #[test]
    fn a_batch_across_row_groups_reads_as_its_rows_do_one_by_one() {
        use loader_proto::pb::CorruptPolicy;

        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.parquet");
        write(&a, 12, 4, Some(5));
        let d = Parquet::open(&spec(std::slice::from_ref(&a), &["x", "y"]), &[]).expect("open");
        // Rows from three row groups, back and forth, and the null row 5.
        let indices = [9u64, 1, 2, 5, 6, 10, 3];
        let keys: Vec<SampleKey> = indices.iter().map(|&index| SampleKey { seed: 0, epoch: 0, index }).collect();
        let (mut x, mut y) = (vec![0u8; 12 * keys.len()], vec![0u8; 8 * keys.len()]);
        let mut batch = BatchRows::new(vec![&mut x[..], &mut y[..]], keys.len(), CorruptPolicy::Skip, true);
        d.read_batch(&keys, &mut batch).expect("batch");
        let (kept, skipped) = batch.finish();
        assert_eq!(kept, vec![9, 1, 2, 6, 10, 3], "row 5 left out under skip");
        assert_eq!(skipped.iter().map(|s| s.index).collect::<Vec<_>>(), vec![5]);
        for (k, &index) in kept.iter().enumerate() {
            let one = read(&d, index).expect("row");
            assert_eq!(x[k * 12..(k + 1) * 12], one[0][..], "x of {index}");
            assert_eq!(y[k * 8..(k + 1) * 8], one[1][..], "y of {index}");
        }
    }

    #[test]
    fn a_null_is_a_corrupt_sample_naming_the_row_and_column() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.parquet");
        write(&a, 9, 4, Some(6));
        let d = Parquet::open(&spec(&[a], &["y"]), &[]).expect("open");
        let e = read(&d, 6).expect_err("null");
        assert!(
            matches!(&e, DatasetError::Corrupt { path, reason } if path.ends_with("(row group 1, row 2)") && reason.contains("`y`")),
            "{e}"
        );
        // Only that row: the rest of its row group reads.
        assert_eq!(read(&d, 5).expect("row 5")[0], (-5i64).to_le_bytes().to_vec());
        assert_eq!(read(&d, 7).expect("row 7")[0], (-7i64).to_le_bytes().to_vec());
    }

    /// A solid 8 x 6 PNG of `rgb`.
    fn png(rgb: [u8; 3]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut e = ::png::Encoder::new(&mut out, 8, 6);
        e.set_color(::png::ColorType::Rgb);
        let mut w = e.write_header().expect("header");
        w.write_image_data(&rgb.repeat(48)).expect("pixels");
        w.finish().expect("finish");
        out
    }

    #[test]
    fn an_image_column_goes_through_the_jobs_pipeline_and_a_bad_image_is_corrupt() {
        use arrow_array::BinaryArray;
        use loader_proto::pb::transform::Op;
        use loader_proto::pb::{Decode, Resize};

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("images.parquet");
        let images: Vec<Option<Vec<u8>>> = (0..6u8)
            .map(|r| match r {
                3 => Some(b"not an image".to_vec()),
                4 => None,
                _ => Some(png([r * 20, 100, 200])),
            })
            .collect();
        let jpg = BinaryArray::from_iter(images.iter().map(Option::as_deref));
        let label: Int64Array = (0..6).map(|r| Some(r as i64)).collect();
        let batch = RecordBatch::try_from_iter([("label", Arc::new(label) as ArrayRef), ("jpg", Arc::new(jpg) as ArrayRef)]).expect("batch");
        let props = WriterProperties::builder().set_max_row_group_size(4).build();
        let mut writer = ArrowWriter::try_new(File::create(&path).expect("create"), batch.schema(), Some(props)).expect("writer");
        writer.write(&batch).expect("write");
        writer.close().expect("close");

        let transforms = vec![
            Transform { op: Some(Op::Decode(Decode {})) },
            Transform { op: Some(Op::Resize(Resize { size: vec![4, 4], ..Default::default() })) },
        ];
        // The columns named, then the image.
        let planned = ParquetSpec { image_column: "jpg".into(), ..spec(std::slice::from_ref(&path), &["label"]) };
        let d = Parquet::open(&planned, &transforms).expect("open");
        let names: Vec<(&str, Dtype, &[u64])> = d.tensors().iter().map(|t| (t.name.as_str(), t.dtype, t.shape.as_slice())).collect();
        assert_eq!(names, vec![("label", Dtype::I64, &[][..]), ("jpg", Dtype::U8, &[3, 4, 4][..])]);
        for r in [0u8, 1, 2, 5] {
            let rows = read(&d, u64::from(r)).expect("row");
            assert_eq!(rows[0], i64::from(r).to_le_bytes().to_vec());
            let want: Vec<u8> = [r * 20, 100, 200].iter().flat_map(|&c| [c; 16]).collect();
            assert_eq!(rows[1], want, "the pixels of row {r}, channel by channel");
        }
        let e = read(&d, 3).expect_err("garbage");
        assert!(matches!(&e, DatasetError::Corrupt { path, .. } if path.ends_with("(row group 0, row 3)")), "{e}");
        let e = read(&d, 4).expect_err("null");
        assert!(matches!(&e, DatasetError::Corrupt { reason, .. } if reason.contains("`jpg` is null")), "{e}");
        // A numeric column named as the image column is refused.
        let wrong = ParquetSpec { image_column: "label".into(), columns: vec![], row_bytes: vec![], ..planned.clone() };
        let e = Parquet::open(&wrong, &transforms).expect_err("not binary");
        assert!(e.to_string().contains("image column `label` is not a binary column"), "{e}");
    }

    #[test]
    fn changed_files_and_columns_that_are_not_tensors_are_refused_in_one_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.parquet");
        write(&a, 10, 5, None);
        let planned = spec(std::slice::from_ref(&a), &["x"]);
        write(&a, 10, 4, None);
        let e = Parquet::open(&planned, &[]).expect_err("rewritten");
        assert!(e.to_string().contains("row groups of [4, 4, 2] rows, the job was planned for [5, 5]"), "{e}");
        let e = loader_listing::parquet::read_footer(&a).expect("footer").select(&a, &["name".into()], "").expect_err("text");
        assert!(e.to_string().contains("column `name`") && !e.to_string().contains('\n'), "{e}");
        let e = loader_listing::parquet::read_footer(&a).expect("footer").select(&a, &["z".into()], "").expect_err("missing");
        assert!(e.to_string().contains("has no column `z`; its columns: x, y, flag, name"), "{e}");
    }
}
