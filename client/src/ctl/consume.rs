//! `loaderctl consume`: the measurement of `run` against an external
//! coordinator whose workers already run, so that the client's CPU time is
//! measured without a coordinator in the same process.

use super::ConsumeArgs;
use super::measure::{configure, consume_and_report, job_spec};
use crate::Loader;

/// Consumes the job and prints the report.
pub(crate) fn run(args: &ConsumeArgs) -> anyhow::Result<()> {
    // Kept alive until the run ends: the workers read it.
    let (spec, _token_file) = job_spec(&args.dataset, args.job_name.as_deref())?;
    let builder = Loader::builder(args.coordinator.as_str())
        .job(spec)
        .rank(args.rank)
        .world_size(args.world_size);
    let loader = configure(builder, &args.measure).build()?;
    consume_and_report(loader, &args.measure, &args.dataset.dataset, None)
}
