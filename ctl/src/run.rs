//! `loaderctl run`: builds a job from flags, runs it in embedded mode with
//! this very executable as the worker (`loaderctl __worker ...`), and reports
//! throughput measured from just before the first `next()` to the last batch.

use std::ffi::OsString;

use anyhow::Context;

use super::RunArgs;
use super::measure::{configure, consume_and_report, dataset_kind, job_spec, unlink_token_file};
use loader_client::Loader;

/// Runs the job and prints the report.
pub(crate) fn run(args: &RunArgs) -> anyhow::Result<()> {
    // Kept open until the run ends: the workers read it. Its name is gone
    // already, so no exit, even SIGKILL, leaves it behind.
    let (spec, _token_file) = job_spec(&args.dataset, None)?;
    let (spec, _token_file) = unlink_token_file(spec, _token_file)?;
    let dataset = dataset_kind(&spec);
    let exe =
        std::env::current_exe().context("cannot find this executable to start workers from")?;
    let workers = usize::try_from(args.workers).unwrap_or(usize::MAX);
    let loader = configure(Loader::local_builder(spec, workers), &args.measure)?
        .worker_command(Some(vec![exe.into_os_string(), OsString::from("__worker")]))
        .build()?;
    consume_and_report(
        loader,
        &args.measure,
        &dataset,
        Some(args.workers),
        None,
    )
}
