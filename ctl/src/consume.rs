//! `loaderctl consume`: the measurement of `run` against an external
//! coordinator whose workers already run, so that the client's CPU time is
//! measured without a coordinator in the same process. It can also save the
//! loader's state part-way (`--save-state-after`) and continue from a saved
//! state (`--resume`).

use super::ConsumeArgs;
use super::measure::{SaveState, configure, consume_and_report, dataset_kind, job_spec};
use loader_client::{Loader, LoaderState};

/// Consumes the job and prints the report.
pub(crate) fn run(args: &ConsumeArgs) -> anyhow::Result<()> {
    let builder = Loader::builder(args.coordinator.as_str());
    // Kept alive until the run ends: the workers read it.
    let mut _token_file = None;
    let (builder, dataset) = match &args.resume {
        Some(path) => {
            let state = LoaderState::load(path)?;
            let dataset = dataset_kind(&state.spec()?);
            let mut builder = builder.resume(state);
            if let Some(rank) = args.rank {
                builder = builder.rank(rank);
            }
            if let Some(world_size) = args.world_size {
                builder = builder.world_size(world_size);
            }
            if let Some(batch_size) = args.resume_batch_size {
                builder = builder.resume_batch_size(batch_size);
            }
            (builder, dataset)
        }
        None => {
            let (mut spec, file) = job_spec(&args.dataset, args.job_name.as_deref())?;
            _token_file = file;
            if args.shared {
                spec.shared.get_or_insert_with(Default::default);
            }
            let dataset = dataset_kind(&spec);
            let builder = builder
                .job(spec)
                .rank(args.rank.unwrap_or(0))
                .world_size(args.world_size.unwrap_or(1));
            (builder, dataset)
        }
    };
    let loader = configure(builder, &args.measure)?.build()?;
    let save = match (args.save_state_after, &args.state_file) {
        (Some(after), Some(path)) => Some(SaveState {
            after,
            path: path.clone(),
        }),
        _ => None,
    };
    consume_and_report(loader, &args.measure, &dataset, None, save, None)
}
