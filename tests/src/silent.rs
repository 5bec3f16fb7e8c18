//! A trainer that opens its session and never fetches a batch: one stuck
//! before its first step. It speaks the real `TrainerService` to the real
//! coordinator (create or attach the job, open the session, heartbeat its
//! lease) and simply never opens a `Fetch` stream, which the SDK cannot be
//! made to do.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use loader_proto::PROTOCOL_VERSION;
use loader_proto::pb::trainer_service_client::TrainerServiceClient;
use loader_proto::pb::{CreateOrAttachJobRequest, JobSpec, OpenSessionRequest, SessionHeartbeatRequest};

/// Longest one call may take.
const CALL: Duration = Duration::from_secs(5);

/// A session kept alive by heartbeats, consuming nothing; its lease ends
/// (it stops heartbeating) when this is dropped.
#[derive(Debug)]
pub struct SilentTrainer {
    /// The session's id at the coordinator.
    pub session_id: u64,
    /// The job's id at the coordinator.
    pub job_id: u64,
    /// Dropped to stop the heartbeat thread.
    stop: Option<mpsc::Sender<()>>,
    /// The heartbeat thread.
    thread: Option<JoinHandle<()>>,
}

impl SilentTrainer {
    /// Creates or attaches to `spec` at the coordinator `url` and opens a
    /// session of consumer 0 (no ring: batches wait in the workers'
    /// outboxes), heartbeating every `interval`. Panics if the coordinator
    /// refuses or does not answer within 5 s.
    pub fn open(url: &str, spec: JobSpec, interval: Duration) -> SilentTrainer {
        let (opened_tx, opened_rx) = mpsc::channel();
        let (stop, stopped) = mpsc::channel::<()>();
        let url = url.to_owned();
        let thread = std::thread::Builder::new()
            .name("e2e-silent-trainer".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                runtime.block_on(async move {
                    let channel = loader_process::grpc::endpoint(&url, &loader_process::security::ClientSecurity::none())
                        .expect("coordinator URL")
                        .connect_lazy();
                    let mut client = TrainerServiceClient::new(channel);
                    let job = tokio::time::timeout(
                        CALL,
                        client.create_or_attach_job(CreateOrAttachJobRequest {
                            protocol_version: PROTOCOL_VERSION,
                            spec: Some(spec),
                        }),
                    )
                    .await
                    .expect("CreateOrAttachJob answered")
                    .expect("CreateOrAttachJob")
                    .into_inner()
                    .job
                    .expect("job");
                    let session = tokio::time::timeout(
                        CALL,
                        client.open_session(OpenSessionRequest {
                            protocol_version: PROTOCOL_VERSION,
                            job_id: job.job_id,
                            consumer: 0,
                            node: "silent-trainer".into(),
                            ..Default::default()
                        }),
                    )
                    .await
                    .expect("OpenSession answered")
                    .expect("OpenSession")
                    .into_inner();
                    let _ = opened_tx.send((session.session_id, job.job_id));
                    // Heartbeat until told to stop (or the test is gone).
                    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(Duration::ZERO) {
                        let beat = client.heartbeat(SessionHeartbeatRequest {
                            protocol_version: PROTOCOL_VERSION,
                            session_id: session.session_id,
                            consumed: 0,
                            stall_ms: 0,
                            session_key: String::new(),
                            unreachable_workers: Vec::new(),
                            late_seq: None,
                        });
                        let _ = tokio::time::timeout(CALL, beat).await;
                        tokio::time::sleep(interval).await;
                    }
                });
            })
            .expect("spawn silent trainer");
        let (session_id, job_id) =
            opened_rx.recv_timeout(2 * CALL + Duration::from_secs(1)).expect("the silent trainer opened its session");
        SilentTrainer { session_id, job_id, stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for SilentTrainer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // At most one heartbeat (bounded) and one interval away.
            let _ = thread.join();
        }
    }
}
