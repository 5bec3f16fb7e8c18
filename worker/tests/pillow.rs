//! Pixel agreement with Pillow (what torchvision runs on PIL images):
//! resize(256) + center_crop(224) of the same files through
//! [`Pipeline`] and through Pillow, compared pixel by pixel, with each of
//! the two filters (Pillow's BILINEAR and BICUBIC).
//!
//! Tolerances, per channel value (0-255):
//! - PNG, and JPEG that shrinks by less than 2x (both decoded at full size
//!   by libjpeg-turbo with the same settings as Pillow's, so the decoded
//!   pixels are the same): max |diff| <= 1, and mean |diff| <= 0.3 for
//!   bilinear, <= 0.05 for bicubic. Bilinear runs in fast_image_resize's
//!   order, columns before rows, which rounds the 8-bit image between
//!   them otherwise than Pillow (measured: max 1, mean 0.15-0.24); bicubic
//!   runs in Pillow's order, rows first, because its overshoot is clipped
//!   there (`src/image/resample.rs`), and what is left is the rounding of
//!   16-bit fixed-point weights against Pillow's 22-bit ones (measured: max
//!   1, mean 0.001-0.005).
//! - JPEG that shrinks by 2x or more, which Loader decodes at a reduced DCT
//!   scale (the IDCT itself downsamples): max |diff| <= 10 and mean
//!   |diff| <= 1.2, on a picture with sharp texture (measured: max 6, mean
//!   0.77 bilinear, 1.02 bicubic; decoded at full size, bicubic gives max
//!   1, mean 0.002, so the DCT scaling is nearly all of it).
//!
//! Needs a Python with Pillow: `$LOADER_PYTHON`, else `bench/.venv/bin/python`,
//! else `python3`. Without one the test fails and says how to get it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use loader_proto::pb::{self, Transform, transform::Op};
use loader_worker::SampleKey;
use loader_worker::image::Pipeline;

/// Resizes and crops every file named on the command line as torchvision's
/// Resize(256, interpolation) + CenterCrop(224) do on a PIL image, with
/// each filter of [`FILTERS`], writing raw RGB next to it as
/// `<file>.<filter>.pil`.
const PILLOW: &str = r#"
import sys
from PIL import Image
for f in sys.argv[1:]:
    src = Image.open(f).convert("RGB")
    w, h = src.size
    if w <= h:
        size = (256, int(256 * h / w))
    else:
        size = (int(256 * w / h), 256)
    left = int(round((size[0] - 224) / 2.0))
    top = int(round((size[1] - 224) / 2.0))
    for name in ("bilinear", "bicubic"):
        im = src.resize(size, getattr(Image, name.upper()))
        im = im.crop((left, top, left + 224, top + 224))
        open(f + "." + name + ".pil", "wb").write(im.tobytes())
"#;

/// The filters compared: Pillow's name (as the script above spells it)
/// and the spec's value.
const FILTERS: [(&str, pb::Interpolation); 2] =
    [("bilinear", pb::Interpolation::Bilinear), ("bicubic", pb::Interpolation::Bicubic)];

/// Longest the Python side may take.
const PYTHON_LIMIT: Duration = Duration::from_secs(120);

fn python_with_pillow() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("LOADER_PYTHON") {
        candidates.push(p.into());
    }
    candidates.push(root.join("bench/.venv/bin/python"));
    candidates.push("python3".into());
    candidates.into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import PIL"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

fn run_bounded(mut cmd: Command) -> String {
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("start python");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait python") {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            assert!(status.success(), "Pillow script failed: {err}");
            return err;
        }
        if start.elapsed() > PYTHON_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("Pillow script took more than {PYTHON_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A photo-like test picture: smooth shading, an edge, and fine texture.
fn picture(w: u32, h: u32, seed: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity((w * h * 3) as usize);
    let mut noise = seed.wrapping_mul(2_654_435_761) | 1;
    for y in 0..h {
        for x in 0..w {
            noise ^= noise << 13;
            noise ^= noise >> 17;
            noise ^= noise << 5;
            let (fx, fy) = (x as f32 / w as f32, y as f32 / h as f32);
            let shade = 128.0 + 90.0 * ((fx * 6.0 + seed as f32).sin() * (fy * 4.0).cos());
            let edge = if (fx - 0.4).powi(2) + (fy - 0.5).powi(2) < 0.05 { 60.0 } else { 0.0 };
            let tex = ((x / 3 + y / 5) % 2) as f32 * 24.0 + (noise % 16) as f32;
            let c = |k: f32| (shade * k + edge + tex).clamp(0.0, 255.0) as u8;
            v.extend_from_slice(&[c(1.0), c(0.8), c(0.6)]);
        }
    }
    v
}

fn png_of(rgb: &[u8], w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, w, h);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    let mut writer = e.write_header().expect("png header");
    writer.write_image_data(rgb).expect("png data");
    writer.finish().expect("png finish");
    out
}

fn jpeg_of(rgb: &[u8], w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, 90)
        .encode(rgb, w as u16, h as u16, jpeg_encoder::ColorType::Rgb)
        .expect("jpeg encode");
    out
}

struct Case {
    file: PathBuf,
    /// Decoded at a reduced DCT scale by the pipeline.
    reduced: bool,
}

/// Allowed (max, mean) |diff| per channel value for `filter` on a file
/// decoded at full size or at a reduced DCT scale (see the module doc).
fn tolerance(filter: pb::Interpolation, reduced: bool) -> (u8, f64) {
    match (filter, reduced) {
        (_, true) => (10, 1.2),
        (pb::Interpolation::Bicubic, false) => (1, 0.05),
        (_, false) => (1, 0.3),
    }
}

#[test]
fn resize_and_center_crop_agree_with_pillow() {
    let Some(python) = python_with_pillow() else {
        panic!(
            "no Python with Pillow found: set LOADER_PYTHON, run bench/run.sh once (it makes bench/.venv), \
             or `pip install pillow` for python3"
        );
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cases = Vec::new();
    // (width, height): shrinks of 1.5x, 1.5x, 1.2x, 1.0x, an enlargement, and 3x.
    for (i, (w, h)) in [(500, 375), (375, 500), (400, 300), (256, 300), (200, 180), (1024, 768)].into_iter().enumerate() {
        let rgb = picture(w, h, i as u32);
        let png = dir.path().join(format!("{i}.png"));
        std::fs::write(&png, png_of(&rgb, w, h)).expect("write png");
        cases.push(Case { file: png, reduced: false });
        let jpg = dir.path().join(format!("{i}.jpg"));
        std::fs::write(&jpg, jpeg_of(&rgb, w, h)).expect("write jpeg");
        cases.push(Case { file: jpg, reduced: w.min(h) >= 512 });
    }
    let mut cmd = Command::new(&python);
    cmd.arg("-c").arg(PILLOW).args(cases.iter().map(|c| &c.file));
    run_bounded(cmd);

    let t = |op| Transform { op: Some(op) };
    let mut failures = Vec::new();
    for (filter, interpolation) in FILTERS {
        let pipeline = Pipeline::new(&[
            t(Op::Decode(pb::Decode {})),
            t(Op::Resize(pb::Resize { size: vec![256], interpolation: interpolation as i32 })),
            t(Op::CenterCrop(pb::CenterCrop { size: vec![224] })),
            t(Op::Layout(pb::Layout::Hwc as i32)),
        ])
        .expect("valid pipeline");
        for c in &cases {
            let encoded = std::fs::read(&c.file).expect("read image");
            let mut ours = vec![0u8; pipeline.output_bytes()];
            pipeline.run(&encoded, SampleKey { seed: 0, epoch: 0, index: 0 }, &mut ours).expect("run");
            let mut pil = c.file.clone().into_os_string();
            pil.push(format!(".{filter}.pil"));
            let theirs = std::fs::read(&pil).expect("read Pillow output");
            assert_eq!(theirs.len(), ours.len(), "{}", c.file.display());
            let diffs: Vec<u8> = ours.iter().zip(&theirs).map(|(a, b)| a.abs_diff(*b)).collect();
            let max = diffs.iter().copied().max().unwrap_or(0);
            let mean = diffs.iter().map(|&d| f64::from(d)).sum::<f64>() / diffs.len() as f64;
            let name = c.file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let (max_ok, mean_ok) = tolerance(interpolation, c.reduced);
            eprintln!("{name} {filter}: max |diff| {max}, mean |diff| {mean:.4} (allowed {max_ok} / {mean_ok})");
            if max > max_ok || mean > mean_ok {
                failures.push(format!("{name} {filter}: max {max} (<= {max_ok}), mean {mean:.4} (<= {mean_ok})"));
            }
        }
    }
    assert!(failures.is_empty(), "differs from Pillow: {failures:?}");
}
