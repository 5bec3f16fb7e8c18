//! `loaderctl status`: the coordinator's workers and jobs, from AdminService.

use loader_proto::pb::admin_service_client::AdminServiceClient;
use loader_proto::pb::dataset_spec::Kind;
use loader_proto::pb::{Dtype, JobInfo, ListJobsRequest, ListWorkersRequest, WorkerInfo};

use super::StatusArgs;
use super::table::render;
use crate::connect;
use crate::error::LoaderError;

/// Prints the tables on stdout.
pub(crate) fn run(args: &StatusArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| LoaderError::Runtime(e.to_string()))?;
    let (workers, jobs) = runtime.block_on(fetch(&connect::normalize(&args.coordinator)))?;
    print!("{}", render_status(&workers, &jobs));
    Ok(())
}

async fn fetch(address: &str) -> Result<(Vec<WorkerInfo>, Vec<JobInfo>), LoaderError> {
    let channel = connect::coordinator(address).await?;
    let mut admin = AdminServiceClient::new(channel).max_decoding_message_size(usize::MAX);
    let workers = admin
        .list_workers(ListWorkersRequest {})
        .await
        .map_err(|s| LoaderError::rpc(address, "ListWorkers", s))?
        .into_inner()
        .workers;
    let jobs = admin
        .list_jobs(ListJobsRequest {})
        .await
        .map_err(|s| LoaderError::rpc(address, "ListJobs", s))?
        .into_inner()
        .jobs;
    Ok((workers, jobs))
}

fn render_status(workers: &[WorkerInfo], jobs: &[JobInfo]) -> String {
    let worker_rows: Vec<Vec<String>> = workers
        .iter()
        .map(|w| {
            vec![
                w.worker_id.to_string(),
                w.address.clone(),
                w.node.clone(),
                w.outstanding.to_string(),
                w.delivered.to_string(),
                format!("{:.1}s ago", w.last_seen_ms as f64 / 1000.0),
            ]
        })
        .collect();
    let job_rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|info| {
            let job = info.job.clone().unwrap_or_default();
            let spec = job.spec.unwrap_or_default();
            let consumers = info
                .consumers
                .iter()
                .map(|c| format!("{}:{}/{}/{}", c.consumer, c.delivered, c.consumed, c.total))
                .collect::<Vec<_>>()
                .join(" ");
            vec![
                job.job_id.to_string(),
                if spec.name.is_empty() {
                    "-".into()
                } else {
                    spec.name.clone()
                },
                dataset(&spec.dataset.and_then(|d| d.kind)),
                job.num_samples.to_string(),
                job.batches_per_epoch.to_string(),
                consumers,
                if info.error.is_empty() {
                    "-".into()
                } else {
                    info.error.clone()
                },
            ]
        })
        .collect();
    format!(
        "WORKERS ({})\n{}\nJOBS ({})\n{}",
        workers.len(),
        render(
            &[
                "ID",
                "ADDRESS",
                "NODE",
                "OUTSTANDING",
                "DELIVERED",
                "LAST SEEN"
            ],
            &worker_rows
        ),
        jobs.len(),
        render(
            &[
                "ID",
                "NAME",
                "DATASET",
                "N",
                "BATCHES/EPOCH",
                "RANK:DELIVERED/CONSUMED/TOTAL",
                "ERROR"
            ],
            &job_rows
        ),
    )
}

fn dataset(kind: &Option<Kind>) -> String {
    let dtype = |d: i32| Dtype::try_from(d).map_or("?", Dtype::short_name);
    match kind {
        Some(Kind::Synthetic(s)) => {
            let shape = s
                .shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join("x");
            format!("synthetic {shape} {}", dtype(s.dtype))
        }
        Some(Kind::Tokens(t)) => format!(
            "tokens {} ctx {} {}",
            t.path,
            t.context_length,
            dtype(t.dtype)
        ),
        None => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use loader_proto::pb::{ConsumerProgress, DatasetSpec, Job, JobSpec, SyntheticSpec};

    use super::*;

    #[test]
    fn renders_workers_and_jobs() {
        let workers = vec![WorkerInfo {
            worker_id: 1,
            address: "http://127.0.0.1:7070".into(),
            node: "n1".into(),
            outstanding: 2,
            delivered: 10,
            last_seen_ms: 250,
            draining: false,
        }];
        let spec = JobSpec {
            name: "demo".into(),
            dataset: Some(DatasetSpec {
                kind: Some(Kind::Synthetic(SyntheticSpec {
                    num_samples: 100,
                    shape: vec![3, 4],
                    dtype: Dtype::U8 as i32,
                    cost_ns: 0,
                })),
            }),
            ..Default::default()
        };
        let jobs = vec![JobInfo {
            job: Some(Job {
                job_id: 3,
                spec: Some(spec),
                num_samples: 100,
                batches_per_epoch: 2,
            }),
            consumers: vec![ConsumerProgress {
                consumer: 0,
                assigned: 2,
                delivered: 2,
                consumed: 1,
                total: 2,
            }],
            error: String::new(),
        }];
        let out = render_status(&workers, &jobs);
        assert!(out.contains("http://127.0.0.1:7070"), "{out}");
        assert!(
            out.contains("0.2s ago") || out.contains("0.3s ago"),
            "{out}"
        );
        assert!(out.contains("synthetic 3x4 uint8"), "{out}");
        assert!(out.contains("0:2/1/2"), "{out}");
    }
}
