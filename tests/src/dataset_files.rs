//! Dataset files written by tests: JPEG and PNG images, class folders with
//! a corrupt file among them, WebDataset tar shards, `.npy` arrays and
//! Parquet files. All made here, small, and a pure function of their
//! arguments.

use std::path::{Path, PathBuf};

/// Classes of [`ImageFolder`], in sorted (label) order.
pub const CLASSES: [&str; 3] = ["ant", "bee", "cow"];

/// Images per class folder, not counting the corrupt file.
pub const PER_CLASS: usize = 6;

/// An RGB image of `width` x `height` whose pixels lean to channel
/// `dominant` (so a test can tell the class from the pixels after any crop),
/// with a little texture so crops differ.
pub fn rgb(width: u32, height: u32, dominant: usize, seed: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity((width * height * 3) as usize);
    for y in 0..height {
        for x in 0..width {
            let texture = ((x * 7 + y * 13 + seed * 29) % 40) as u8;
            for c in 0..3 {
                out.push(if c == dominant { 200 + texture / 2 } else { 20 + texture });
            }
        }
    }
    out
}

/// `pixels` (RGB) encoded as a JPEG of quality 90.
pub fn jpeg(pixels: &[u8], width: u32, height: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let encoder = jpeg_encoder::Encoder::new(&mut out, 90);
    encoder
        .encode(pixels, width as u16, height as u16, jpeg_encoder::ColorType::Rgb)
        .expect("encode jpeg");
    out
}

/// `pixels` (RGB) encoded as a PNG.
pub fn png(pixels: &[u8], width: u32, height: u32) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, width, height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().expect("png header");
        writer.write_image_data(pixels).expect("png data");
    }
    out
}

/// A class folder tree: [`PER_CLASS`] images in each of [`CLASSES`], all
/// JPEGs except one PNG (`bee/img03.png`), plus a corrupt JPEG
/// (`cow/broken.jpg`). Image `i` of class `c` has pixels leaning to channel
/// `c` and a size that varies with `i`.
#[derive(Debug)]
pub struct ImageFolder {
    /// The root (kept until dropped).
    pub dir: tempfile::TempDir,
    /// The corrupt file.
    pub corrupt: PathBuf,
    /// The PNG.
    pub png: PathBuf,
    /// Label of every sample in listing order (the corrupt one included).
    pub labels: Vec<i64>,
    /// Listing index of the corrupt file.
    pub corrupt_index: u64,
    /// Listing index of the PNG.
    pub png_index: u64,
}

impl ImageFolder {
    /// Writes the tree.
    pub fn write() -> ImageFolder {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut labels = Vec::new();
        let (mut corrupt, mut png_path) = (PathBuf::new(), PathBuf::new());
        let (mut corrupt_index, mut png_index) = (0, 0);
        for (label, class) in CLASSES.iter().enumerate() {
            let folder = dir.path().join(class);
            std::fs::create_dir_all(&folder).expect("class folder");
            if *class == "cow" {
                // Sorts first in its folder ("b" < "i").
                corrupt = folder.join("broken.jpg");
                std::fs::write(&corrupt, b"\xff\xd8\xff\xe0 this is not a JPEG").expect("corrupt file");
                corrupt_index = labels.len() as u64;
                labels.push(label as i64);
            }
            for i in 0..PER_CLASS as u32 {
                let (w, h) = (40 + 9 * i, 56 - 5 * i);
                let pixels = rgb(w, h, label, i);
                let is_png = *class == "bee" && i == 3;
                let path = folder.join(format!("img{i:02}.{}", if is_png { "png" } else { "jpg" }));
                let bytes = if is_png { png(&pixels, w, h) } else { jpeg(&pixels, w, h) };
                std::fs::write(&path, bytes).expect("image");
                if is_png {
                    png_path = path;
                    png_index = labels.len() as u64;
                }
                labels.push(label as i64);
            }
        }
        ImageFolder { dir, corrupt, png: png_path, labels, corrupt_index, png_index }
    }

    /// The root folder.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Writes a WebDataset shard at `path` holding `samples` samples
/// `first..first + samples`: key `s/<index>`, a small JPEG leaning to
/// channel `index % 3`, and the index itself as the `.cls` label.
pub fn write_shard(path: &Path, first: u64, samples: u64) {
    let mut builder = tar::Builder::new(Vec::new());
    for index in first..first + samples {
        let (w, h) = (20 + (index % 5) as u32 * 3, 18 + (index % 4) as u32 * 4);
        let image = jpeg(&rgb(w, h, (index % 3) as usize, index as u32), w, h);
        for (ext, data) in [("jpg", image), ("cls", index.to_string().into_bytes())] {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            builder.append_data(&mut header, format!("s/{index:06}.{ext}"), data.as_slice()).expect("tar member");
        }
    }
    std::fs::write(path, builder.into_inner().expect("tar")).expect("write shard");
}

/// Writes a version 1 `.npy` file: `descr` (e.g. `<f4`), `shape` and the
/// raw little-endian `data`.
pub fn write_npy(path: &Path, descr: &str, shape: &[u64], data: &[u8]) {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).expect("write npy");
}

/// Writes a Parquet file of `rows` rows in row groups of `group` rows, row
/// `r` of the dataset being `first + r`: `x` a fixed-size list of 3 float32
/// (`10 * i + k`), `y` int64 (`-i`), and `name` text (a column that is no
/// tensor).
pub fn write_parquet(path: &Path, first: u64, rows: u64, group: usize) {
    use std::sync::Arc;

    use arrow_array::builder::{FixedSizeListBuilder, Float32Builder};
    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};

    let mut x = FixedSizeListBuilder::new(Float32Builder::new(), 3);
    for i in first..first + rows {
        for k in 0..3 {
            x.values().append_value((10 * i + k) as f32);
        }
        x.append(true);
    }
    let y: Int64Array = (first..first + rows).map(|i| Some(-(i as i64))).collect();
    let name: StringArray = (first..first + rows).map(|i| Some(format!("row {i}"))).collect();
    let batch = RecordBatch::try_from_iter([
        ("x", Arc::new(x.finish()) as ArrayRef),
        ("y", Arc::new(y) as ArrayRef),
        ("name", Arc::new(name) as ArrayRef),
    ])
    .expect("record batch");
    let props = parquet::file::properties::WriterProperties::builder().set_max_row_group_size(group).build();
    let file = std::fs::File::create(path).expect("create parquet file");
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).expect("parquet writer");
    writer.write(&batch).expect("write parquet");
    writer.close().expect("close parquet");
}
