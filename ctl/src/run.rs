//! `loaderctl run`: builds a job from flags, runs it in embedded mode with
//! this very executable as the worker (`loaderctl __worker ...`), and reports
//! throughput measured from just before the first `next()` to the last batch.

use std::ffi::OsString;
use std::sync::Arc;

use anyhow::Context;

use super::RunArgs;
use super::measure::{configure, consume_and_report, dataset_kind, job_spec, unlink_token_file};
use super::kept;
use loader_client::Loader;
use loader_client::embedded::CommandLauncher;

/// Runs the job and prints the report.
pub(crate) fn run(args: &RunArgs) -> anyhow::Result<()> {
    // Kept open until the run ends: the workers read it. Its name is gone
    // already, so no exit, even SIGKILL, leaves it behind.
    let (spec, _token_file) = job_spec(&args.dataset, None)?;
    let (spec, _token_file) = unlink_token_file(spec, _token_file)?;
    let dataset = dataset_kind(&spec);
    let exe =
        std::env::current_exe().context("cannot find this executable to start workers from")?;
    // Kept until the run ends: the workers inherit its descriptor.
    let (cache, env) = match args.cache {
        Some(bytes) => {
            let (cache, variable) = kept::create(&spec, bytes, args.cache_dir.as_deref())?;
            (Some(cache), vec![variable])
        }
        None => (None, Vec::new()),
    };
    let launcher = CommandLauncher::new(vec![exe.into_os_string(), OsString::from("__worker")])?.with_env(env);
    let workers = usize::try_from(args.workers).unwrap_or(usize::MAX);
    let loader = configure(Loader::local_builder(spec, workers), &args.measure)?
        .worker_launcher(Arc::new(launcher))
        .build()?;
    consume_and_report(
        loader,
        &args.measure,
        &dataset,
        Some(args.workers),
        None,
        cache.as_ref(),
    )
}
