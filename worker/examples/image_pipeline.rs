//! Runs the image pipeline alone over a folder of JPEG/PNG files, to see
//! what decode + transforms cost without batching or transport:
//!
//! ```text
//! cargo run --release -p loader-worker --example image_pipeline -- DIR [THREADS] [PASSES] [eval] [bicubic]
//! ```
//!
//! `DIR` (e.g. `bench/data/imagenet-shaped`, made by `bench/make_images.py`)
//! is read recursively; every file is held in memory first, so disk reads
//! are not measured. The default pipeline is the training one
//! (random_resized_crop 224 + horizontal flip, uint8 CHW); `eval` runs
//! resize 256 + center_crop 224 instead; `bicubic` resizes with bicubic
//! instead of bilinear.

use std::path::{Path, PathBuf};
use std::time::Instant;

use loader_proto::pb::{self, Transform, transform::Op};
use loader_worker::SampleKey;
use loader_worker::image::Pipeline;

fn files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).ok_or("usage: image_pipeline DIR [THREADS] [PASSES] [eval] [bicubic]")?;
    let threads: usize = args.get(2).map_or(Ok(2), |s| s.parse())?;
    let passes: u64 = args.get(3).map_or(Ok(1), |s| s.parse())?;
    let modes = args.get(4..).unwrap_or_default();
    let eval = modes.iter().any(|s| s == "eval");
    let interpolation =
        if modes.iter().any(|s| s == "bicubic") { pb::Interpolation::Bicubic } else { pb::Interpolation::Bilinear } as i32;
    let mut paths = Vec::new();
    files(Path::new(dir), &mut paths)?;
    paths.sort();
    let data: Vec<Vec<u8>> = paths.iter().map(std::fs::read).collect::<Result<_, _>>()?;
    let t = |op| Transform { op: Some(op) };
    let steps = if eval {
        vec![
            t(Op::Decode(pb::Decode {})),
            t(Op::Resize(pb::Resize { size: vec![256], interpolation })),
            t(Op::CenterCrop(pb::CenterCrop { size: vec![224] })),
        ]
    } else {
        vec![
            t(Op::Decode(pb::Decode {})),
            t(Op::RandomResizedCrop(pb::RandomResizedCrop { size: vec![224], interpolation, ..Default::default() })),
            t(Op::HorizontalFlip(pb::HorizontalFlip { p: None })),
        ]
    };
    let pipeline = Pipeline::new(&steps)?;
    let n = data.len() as u64 * passes;
    let start = Instant::now();
    std::thread::scope(|s| {
        for id in 0..threads as u64 {
            let (pipeline, data, paths) = (&pipeline, &data, &paths);
            s.spawn(move || {
                let mut out = vec![0u8; pipeline.output_bytes()];
                let mut i = id;
                while i < n {
                    let key = SampleKey { seed: 0, epoch: i / data.len() as u64, index: i % data.len() as u64 };
                    if let Err(e) = pipeline.run(&data[key.index as usize], key, &mut out) {
                        eprintln!("{}: {e}", paths[key.index as usize].display());
                    }
                    i += threads as u64;
                }
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{} samples on {threads} threads in {secs:.2} s: {:.0} samples/s ({:.0} µs per sample per thread)",
        n,
        n as f64 / secs,
        secs * 1e6 * threads as f64 / n as f64
    );
    Ok(())
}
