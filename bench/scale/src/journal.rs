//! A coordinator's journal filled as a busy deployment's would be, and the
//! wait for its replay after a restart (`run.sh --journal`).

use std::time::{Duration, Instant};

use loader_client::{Dtype, spec};
use loader_proto::PROTOCOL_VERSION;
use loader_proto::pb::admin_service_client::AdminServiceClient;
use loader_proto::pb::trainer_service_client::TrainerServiceClient;
use loader_proto::pb::{CloseSessionRequest, CreateOrAttachJobRequest, ListJobsRequest, OpenSessionRequest, SessionHeartbeatRequest};
use tonic::transport::Endpoint;

/// Fills a coordinator's journal as a busy deployment would: `jobs` shuffled
/// jobs of `samples` samples (batch 64) with `ranks` ranks each, every rank
/// halfway through its epoch (a session opened, half its batches
/// acknowledged, the session closed). For measuring a restart from that
/// journal (`run.sh --journal`). Returns the watermarks written.
pub async fn fill_journal(url: &str, jobs: u32, ranks: u32, samples: u64) -> anyhow::Result<u64> {
    /// Jobs filled at once.
    const AT_ONCE: u32 = 32;
    let channel = Endpoint::from_shared(url.to_owned())?.connect().await?;
    let mut written = 0;
    for first in (0..jobs).step_by(AT_ONCE as usize) {
        let mut fills = tokio::task::JoinSet::new();
        for j in first..(first + AT_ONCE).min(jobs) {
            let mut client = TrainerServiceClient::new(channel.clone());
            let spec = spec::synthetic(samples, &[1], Dtype::U8)
                .batch_size(64)
                .shuffle(u64::from(j))
                .consumers(ranks)
                .name(format!("journal-fill-{j}"))
                .build()?;
            fills.spawn(async move {
                let job = client
                    .create_or_attach_job(CreateOrAttachJobRequest { protocol_version: PROTOCOL_VERSION, spec: Some(spec) })
                    .await?
                    .into_inner()
                    .job
                    .ok_or_else(|| anyhow::anyhow!("no job in the answer"))?;
                let half = job.batches_per_epoch / u64::from(ranks) / 2;
                for rank in 0..ranks {
                    let opened = client
                        .open_session(OpenSessionRequest {
                            protocol_version: PROTOCOL_VERSION,
                            job_id: job.job_id,
                            consumer: rank,
                            node: "harness-trainers".into(),
                            ..Default::default()
                        })
                        .await?
                        .into_inner();
                    let session = |session_id| SessionHeartbeatRequest {
                        protocol_version: PROTOCOL_VERSION,
                        session_id,
                        consumed: half,
                        ..Default::default()
                    };
                    client.heartbeat(session(opened.session_id)).await?;
                    client
                        .close_session(CloseSessionRequest {
                            protocol_version: PROTOCOL_VERSION,
                            session_id: opened.session_id,
                            consumed: half,
                            ..Default::default()
                        })
                        .await?;
                }
                anyhow::Ok(u64::from(ranks))
            });
        }
        while let Some(filled) = fills.join_next().await {
            written += filled??;
        }
    }
    Ok(written)
}

/// Waits until the coordinator at `url` serves at least `jobs` jobs (after
/// a restart: until its journal is replayed), for at most `limit`.
/// Returns how many it serves.
pub async fn wait_for_jobs(url: &str, jobs: usize, limit: Duration) -> anyhow::Result<usize> {
    let deadline = Instant::now() + limit;
    let endpoint = Endpoint::from_shared(url.to_owned())?;
    loop {
        let served = match endpoint.connect().await {
            Ok(channel) => match AdminServiceClient::new(channel).list_jobs(ListJobsRequest {}).await {
                Ok(r) => r.into_inner().jobs.len(),
                Err(_) => 0,
            },
            Err(_) => 0,
        };
        if served >= jobs {
            return Ok(served);
        }
        if Instant::now() >= deadline {
            anyhow::bail!("{served} jobs served after {limit:?}, not {jobs}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
