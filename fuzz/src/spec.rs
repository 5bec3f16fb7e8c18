//! The `spec_yaml` and `spec_json` driver: a spec file parsed as the SDK and
//! `loaderctl run --spec` parse it, then planned and submitted as the
//! coordinator plans and admits it.
//!
//! Paths in a spec resolve against one temporary directory, and nothing
//! reads them: the counts `JobSpecBuilder::build` would read from the
//! dataset's files are filled in here instead, so no file outside the
//! temporary directory (or in it) is opened.

use std::path::Path;
use std::sync::OnceLock;

use loader_proto::pb::{self, dataset_spec::Kind, trainer_service_server::TrainerService};
use tonic::Request;

fn base_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temporary directory")).path()
}

/// Counts as `build` would read them from files, made up: a few thousand
/// samples, or what the spec itself says where it says it.
fn fill_counts(kind: &mut Kind) {
    match kind {
        Kind::Synthetic(_) | Kind::Custom(_) => {}
        Kind::Tokens(t) if t.num_tokens == 0 => t.num_tokens = 1 << 16,
        Kind::ImageFolder(f) if f.num_samples == 0 => {
            f.num_samples = 1000;
            f.fingerprint = 0x5eed;
        }
        Kind::Webdataset(w) if w.shard_samples.is_empty() => {
            w.shard_samples = (0..w.shards.len() as u64).map(|i| 10 + i % 7).collect();
        }
        Kind::Npy(n) if n.num_samples == 0 => n.num_samples = 1000,
        Kind::Mix(m) => {
            for source in &mut m.sources {
                if let Some(kind) = source.dataset.as_mut().and_then(|d| d.kind.as_mut()) {
                    fill_counts(kind);
                }
            }
            if m.samples_per_epoch == 0 {
                m.samples_per_epoch = 1000;
            }
        }
        _ => {}
    }
}

/// Parses `text` (as JSON when `json`, else as `parse` picks), and when it
/// parses, plans and submits it.
pub fn run(text: &str, json: bool) {
    let parsed = if json {
        loader_job::authoring::file::parse_json(text, base_dir())
    } else {
        loader_job::authoring::file::parse(text, base_dir())
    };
    let Ok(builder) = parsed else { return };
    let mut spec = builder.spec().clone();
    // Parsing runs the coordinator's own check: what parses, checks.
    if let Err(e) = loader_job::spec::check(&spec) {
        panic!("a parsed spec fails the coordinator's check: {e}");
    }
    if let Some(pb::DatasetSpec { kind: Some(kind) }) = &mut spec.dataset {
        fill_counts(kind);
    }
    let Ok(plan) = loader_job::authoring::validate(&spec) else { return };
    let _ = loader_job::footprint::batch_bytes(&spec);
    let _ = loader_job::transforms::check(&spec.transforms);
    // The first and last batch of the first and last consumer: the sampler's
    // arithmetic at both ends of the job.
    let total = plan.total_batches();
    if total > 0 {
        for consumer in [0, plan.consumers.saturating_sub(1)] {
            for seq in [0, total - 1] {
                let indices = plan.batch_indices(consumer, seq);
                assert_eq!(indices.len() as u64, plan.batch_len(seq));
                assert!(indices.iter().all(|&i| i < plan.num_samples), "an index past the dataset");
            }
        }
    }
    // Submitted as a trainer submits it: admitted, planned and queued by a
    // fresh in-memory coordinator, then a session opened on it.
    crate::rpc::block_on(async {
        let (_, trainers, _, _) = loader_server::fuzzing::services(loader_server::ServerConfig::default());
        let request = pb::CreateOrAttachJobRequest { protocol_version: loader_proto::PROTOCOL_VERSION, spec: Some(spec) };
        let Ok(created) = trainers.create_or_attach_job(Request::new(request)).await else { return };
        let job_id = created.into_inner().job.map_or(0, |j| j.job_id);
        let open = pb::OpenSessionRequest {
            protocol_version: loader_proto::PROTOCOL_VERSION,
            job_id,
            consumer: 0,
            ..Default::default()
        };
        if let Ok(session) = trainers.open_session(Request::new(open)).await {
            let session_id = session.into_inner().session_id;
            let _ = trainers.routes(Request::new(pb::RoutesRequest { session_id, ..Default::default() })).await;
        }
    });
}
