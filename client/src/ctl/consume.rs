//! `loaderctl consume`: the measurement of `run` against an external
//! coordinator whose workers already run, so that the client's CPU time is
//! measured without a coordinator in the same process. It can also save the
//! loader's state part-way (`--save-state-after`) and continue from a saved
//! state (`--resume`).

use super::ConsumeArgs;
use super::measure::{SaveState, configure, consume_and_report, job_spec};
use crate::{Loader, LoaderState};

/// Consumes the job and prints the report.
pub(crate) fn run(args: &ConsumeArgs) -> anyhow::Result<()> {
    let builder = Loader::builder(args.coordinator.as_str());
    // Kept alive until the run ends: the workers read it.
    let mut _token_file = None;
    let (builder, dataset) = match &args.resume {
        Some(path) => {
            let state = LoaderState::load(path)?;
            let dataset = dataset_kind(&state.spec()?);
            (builder.resume(state), dataset)
        }
        None => {
            let (spec, file) = job_spec(&args.dataset, args.job_name.as_deref())?;
            _token_file = file;
            let builder = builder
                .job(spec)
                .rank(args.rank)
                .world_size(args.world_size);
            (builder, args.dataset.dataset.clone())
        }
    };
    let loader = configure(builder, &args.measure).build()?;
    let save = match (args.save_state_after, &args.state_file) {
        (Some(after), Some(path)) => Some(SaveState {
            after,
            path: path.clone(),
        }),
        _ => None,
    };
    consume_and_report(loader, &args.measure, &dataset, None, save)
}

/// The report's name for the dataset of a resumed job.
fn dataset_kind(spec: &loader_proto::pb::JobSpec) -> String {
    use loader_proto::pb::dataset_spec::Kind;
    match spec.dataset.as_ref().and_then(|d| d.kind.as_ref()) {
        Some(Kind::Synthetic(_)) => "synthetic".into(),
        Some(Kind::Tokens(_)) => "tokens".into(),
        Some(Kind::ImageFolder(_)) => "image_folder".into(),
        Some(Kind::Webdataset(_)) => "webdataset".into(),
        Some(Kind::Npy(_)) => "npy".into(),
        None => "-".into(),
    }
}
