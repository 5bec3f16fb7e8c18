//! `loaderctl run`: builds a job from flags, runs it in embedded mode with
//! this very executable as the worker (`loaderctl __worker ...`), and reports
//! throughput measured from just before the first `next()` to the last batch.

use std::ffi::OsString;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use loader_proto::pb::{Dtype, JobSpec};
use serde::Serialize;
use tempfile::NamedTempFile;

use super::RunArgs;
use crate::{Loader, spec};

/// Windows per epoch in a generated token file (with the chosen batch size).
const GENERATED_TOKEN_BATCHES: u64 = 64;

/// The one JSON object `--json` prints.
#[derive(Debug, Serialize)]
struct Report {
    samples: u64,
    batches: u64,
    bytes: u64,
    seconds: f64,
    samples_per_s: f64,
    mb_per_s: f64,
    first_batch_s: f64,
    workers: u64,
    dataset: String,
}

/// Runs the job and prints the report.
pub(crate) fn run(args: &RunArgs) -> anyhow::Result<()> {
    // Kept alive until the run ends: the workers read it.
    let (spec, _token_file) = job_spec(args)?;
    let exe =
        std::env::current_exe().context("cannot find this executable to start workers from")?;
    let workers = usize::try_from(args.workers).unwrap_or(usize::MAX);
    let mut loader = Loader::local_builder(spec, workers)
        .prefetch(args.prefetch)
        .worker_command(Some(vec![exe.into_os_string(), OsString::from("__worker")]))
        .build()?;

    let bar = progress_bar(loader.total_batches(), args.json);
    let (mut samples, mut batches, mut bytes) = (0u64, 0u64, 0u64);
    let mut first_batch = None;
    let started = Instant::now();
    for batch in &mut loader {
        let batch = batch?;
        first_batch.get_or_insert_with(|| started.elapsed());
        samples += batch.len() as u64;
        bytes += batch.bytes().len() as u64;
        batches += 1;
        bar.inc(1);
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    // Stops the workers and the coordinator; not part of the measurement.
    drop(loader);

    let seconds = elapsed.as_secs_f64().max(1e-9);
    let report = Report {
        samples,
        batches,
        bytes,
        seconds,
        samples_per_s: samples as f64 / seconds,
        mb_per_s: bytes as f64 / 1e6 / seconds,
        first_batch_s: first_batch.unwrap_or(Duration::ZERO).as_secs_f64(),
        workers: args.workers,
        dataset: args.dataset.clone(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} samples in {} batches ({:.1} MB) from {} workers in {:.2} s\n\
             {:.0} samples/s, {:.1} MB/s, first batch after {:.1} ms",
            report.samples,
            report.batches,
            report.bytes as f64 / 1e6,
            report.workers,
            report.seconds,
            report.samples_per_s,
            report.mb_per_s,
            report.first_batch_s * 1e3,
        );
    }
    Ok(())
}

/// Drawn on stderr only when a person is watching.
fn progress_bar(total: u64, json: bool) -> ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {pos}/{len} batches ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// The job of the flags, and the generated token file it reads, if any.
fn job_spec(args: &RunArgs) -> anyhow::Result<(JobSpec, Option<NamedTempFile>)> {
    let dtype = |default: Dtype| -> anyhow::Result<Dtype> {
        match &args.dtype {
            None => Ok(default),
            Some(name) => Dtype::parse(name).ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown --dtype {name:?}; expected e.g. uint8, uint16, uint32, int64, float32"
                )
            }),
        }
    };
    let (builder, file) = match args.dataset.as_str() {
        "synthetic" => (
            spec::synthetic(args.samples, &parse_shape(&args.shape)?, dtype(Dtype::U8)?),
            None,
        ),
        "tokens" => {
            let dtype = dtype(Dtype::U16)?;
            let (path, file) = match &args.path {
                Some(path) => (path.clone(), None),
                None => {
                    let file = generate_tokens(args, dtype)?;
                    (file.path().to_path_buf(), Some(file))
                }
            };
            (spec::tokens(path, dtype, args.context_length), file)
        }
        other => anyhow::bail!("unknown dataset kind {other:?}; expected synthetic or tokens"),
    };
    let spec = builder
        .batch_size(args.batch_size)
        .epochs(args.epochs)
        .build()?;
    Ok((spec, file))
}

fn parse_shape(s: &str) -> anyhow::Result<Vec<u64>> {
    let dims: Option<Vec<u64>> = s
        .split(',')
        .map(|d| d.trim().parse().ok().filter(|&d| d > 0))
        .collect();
    dims.filter(|d| !d.is_empty()).ok_or_else(|| {
        anyhow::anyhow!(
            "invalid --shape {s:?}; expected positive comma-separated sizes like 3,224,224"
        )
    })
}

/// A temporary token file of `GENERATED_TOKEN_BATCHES` batches per epoch:
/// ids cycling through a GPT-2-sized vocabulary.
fn generate_tokens(args: &RunArgs, dtype: Dtype) -> anyhow::Result<NamedTempFile> {
    if args.batch_size == 0 || args.context_length == 0 {
        // Let spec validation name the field; any non-empty file will do.
        let mut f = NamedTempFile::new().context("cannot create a temporary token file")?;
        f.write_all(&[0; 8])
            .context("cannot write the temporary token file")?;
        return Ok(f);
    }
    let windows = u64::from(args.batch_size).saturating_mul(GENERATED_TOKEN_BATCHES);
    let tokens = windows
        .saturating_mul(args.context_length)
        .saturating_add(1);
    let file = tempfile::Builder::new()
        .prefix("loaderctl-tokens-")
        .suffix(".bin")
        .tempfile()
        .context("cannot create a temporary token file")?;
    let mut out = BufWriter::with_capacity(1 << 20, file.as_file());
    for i in 0..tokens {
        let id = (i.wrapping_mul(2_654_435_761) >> 7) % 50_257;
        match dtype {
            Dtype::U32 => out.write_all(&(id as u32).to_le_bytes()),
            _ => out.write_all(&(id as u16).to_le_bytes()),
        }
        .with_context(|| {
            format!(
                "cannot write the temporary token file {}",
                PathBuf::from(file.path()).display()
            )
        })?;
    }
    out.flush()
        .context("cannot write the temporary token file")?;
    drop(out);
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_or_say_what_is_expected() {
        assert_eq!(parse_shape("3,224, 224").expect("shape"), vec![3, 224, 224]);
        for bad in ["", "3,,4", "0", "a"] {
            let e = parse_shape(bad).expect_err(bad).to_string();
            assert!(e.starts_with("invalid --shape"), "{e}");
        }
    }
}
