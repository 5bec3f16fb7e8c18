//! The `rpc_requests` driver.
//!
//! Input: a sequence of calls, each `[rpc: u8][len: u8][len bytes]`, at
//! most [`MAX_CALLS`]. `rpc % RPCS` picks the RPC (see [`Rpc`]); the bytes
//! are decoded as its request message (bytes that do not decode are what
//! tonic would refuse before any handler runs: skipped, except for Fetch,
//! which gets them raw). Ids are what a client would send: a worker,
//! session or job id below [`IDS`] in a request is replaced by the id the
//! coordinator handed out for the `n`-th worker, session or job of this
//! input, so a sequence can register, create, open, beat and close.

use std::sync::OnceLock;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use loader_proto::keda::{GetMetricsRequest, ScaledObjectRef, external_scaler_server::ExternalScaler};
use loader_proto::pb::{
    self, admin_service_server::AdminService, batch_service_server::BatchServiceServer,
    trainer_service_server::TrainerService, worker_service_server::WorkerService,
};
use prost::Message;
use tonic::Request;
use tonic::codegen::{Service, http};

/// Most calls one input makes.
pub const MAX_CALLS: usize = 48;
/// Ids below this are indices into the ids handed out so far.
pub const IDS: u64 = 8;

/// The RPCs, in the order of their selector byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Rpc {
    RegisterWorker = 0,
    WorkerHeartbeat,
    Deregister,
    CreateOrAttachJob,
    OpenSession,
    SessionHeartbeat,
    Routes,
    CloseSession,
    ListWorkers,
    ListJobs,
    DrainWorker,
    ScaleWorkers,
    Autoscale,
    ListSessions,
    KedaIsActive,
    KedaStreamIsActive,
    KedaGetMetricSpec,
    KedaGetMetrics,
    Fetch,
    // After Fetch, so that the selector bytes of the corpus's calls keep
    // naming the RPCs they were written for.
    PutBlob,
    GetBlob,
}

/// Number of RPCs.
pub const RPCS: u8 = Rpc::GetBlob as u8 + 1;

impl Rpc {
    fn from_byte(b: u8) -> Self {
        const ALL: [Rpc; RPCS as usize] = [
            Rpc::RegisterWorker,
            Rpc::WorkerHeartbeat,
            Rpc::Deregister,
            Rpc::CreateOrAttachJob,
            Rpc::OpenSession,
            Rpc::SessionHeartbeat,
            Rpc::Routes,
            Rpc::CloseSession,
            Rpc::ListWorkers,
            Rpc::ListJobs,
            Rpc::DrainWorker,
            Rpc::ScaleWorkers,
            Rpc::Autoscale,
            Rpc::ListSessions,
            Rpc::KedaIsActive,
            Rpc::KedaStreamIsActive,
            Rpc::KedaGetMetricSpec,
            Rpc::KedaGetMetrics,
            Rpc::Fetch,
            Rpc::PutBlob,
            Rpc::GetBlob,
        ];
        ALL[usize::from(b % RPCS)]
    }
}

/// Appends one call to an input being built (seeds).
pub fn call(out: &mut Vec<u8>, rpc: Rpc, msg: &impl Message) {
    let body = msg.encode_to_vec();
    let len = body.len().min(255);
    out.push(rpc as u8);
    out.push(len as u8);
    out.extend_from_slice(&body[..len]);
}

/// `LOADER_FUZZ_DEBUG=1`: print each call (to see what an input does).
fn debug() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("LOADER_FUZZ_DEBUG").is_some())
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    // A paused clock: a long-poll heartbeat's wait, a Fetch stream with
    // nothing to send, end at once instead of taking real seconds.
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime")
    })
}

#[derive(Default)]
struct Ids {
    workers: Vec<u64>,
    sessions: Vec<u64>,
    jobs: Vec<u64>,
}

fn pick(id: &mut u64, handed: &[u64]) {
    if *id < IDS
        && let Some(&real) = handed.get(*id as usize)
    {
        *id = real;
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    block_on(run_calls(data));
}

/// Runs `f` on the targets' runtime (one thread, paused clock).
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

async fn run_calls(mut data: &[u8]) {
    let (workers, trainers, admin, keda) = loader_server::fuzzing::services(loader_server::ServerConfig::default());
    let fetch = loader_worker::fuzzing::Fetch::default();
    let mut batches = BatchServiceServer::new(fetch.service());
    let mut ids = Ids::default();
    let mut calls = 0;
    while let [rpc, len, rest @ ..] = data {
        let len = usize::from(*len).min(rest.len());
        let (body, tail) = rest.split_at(len);
        data = tail;
        calls += 1;
        if calls > MAX_CALLS {
            break;
        }
        let rpc = Rpc::from_byte(*rpc);
        if debug() {
            eprintln!("call {calls}: {rpc:?}, {} bytes; ids so far: workers {:?} sessions {:?} jobs {:?}", body.len(), ids.workers, ids.sessions, ids.jobs);
        }
        match rpc {
            Rpc::RegisterWorker => {
                let Ok(r) = pb::RegisterWorkerRequest::decode(body) else { continue };
                if let Ok(resp) = workers.register_worker(Request::new(r)).await {
                    ids.workers.push(resp.into_inner().worker_id);
                }
            }
            Rpc::WorkerHeartbeat => {
                let Ok(mut r) = pb::WorkerHeartbeatRequest::decode(body) else { continue };
                pick(&mut r.worker_id, &ids.workers);
                for d in &mut r.delivered {
                    pick(&mut d.job_id, &ids.jobs);
                }
                for f in &mut r.failed {
                    pick(&mut f.job_id, &ids.jobs);
                }
                for w in &mut r.windows {
                    pick(&mut w.job_id, &ids.jobs);
                }
                if let Ok(resp) = workers.heartbeat(Request::new(r)).await {
                    let resp = resp.into_inner();
                    // What a worker does with its tasks: queue their
                    // batches, which trainers then fetch.
                    for t in resp.tasks.iter().take(4) {
                        let job = t.job.as_ref().map_or(0, |j| j.job_id);
                        for seq in t.start_seq..t.end_seq.min(t.start_seq.saturating_add(4)) {
                            fetch.push(job, t.consumer, seq, Bytes::from_static(b"LDRB"));
                        }
                    }
                }
            }
            Rpc::Deregister => {
                let Ok(mut r) = pb::DeregisterRequest::decode(body) else { continue };
                pick(&mut r.worker_id, &ids.workers);
                let _ = workers.deregister(Request::new(r)).await;
            }
            Rpc::CreateOrAttachJob => {
                let Ok(r) = pb::CreateOrAttachJobRequest::decode(body) else { continue };
                if let Ok(resp) = trainers.create_or_attach_job(Request::new(r)).await
                    && let Some(job) = resp.into_inner().job
                {
                    ids.jobs.push(job.job_id);
                }
            }
            Rpc::OpenSession => {
                let Ok(mut r) = pb::OpenSessionRequest::decode(body) else { continue };
                pick(&mut r.job_id, &ids.jobs);
                if let Ok(resp) = trainers.open_session(Request::new(r)).await {
                    ids.sessions.push(resp.into_inner().session_id);
                }
            }
            Rpc::SessionHeartbeat => {
                let Ok(mut r) = pb::SessionHeartbeatRequest::decode(body) else { continue };
                pick(&mut r.session_id, &ids.sessions);
                let _ = trainers.heartbeat(Request::new(r)).await;
            }
            Rpc::Routes => {
                let Ok(mut r) = pb::RoutesRequest::decode(body) else { continue };
                pick(&mut r.session_id, &ids.sessions);
                let _ = trainers.routes(Request::new(r)).await;
            }
            Rpc::CloseSession => {
                let Ok(mut r) = pb::CloseSessionRequest::decode(body) else { continue };
                pick(&mut r.session_id, &ids.sessions);
                let _ = trainers.close_session(Request::new(r)).await;
            }
            Rpc::ListWorkers => {
                let Ok(r) = pb::ListWorkersRequest::decode(body) else { continue };
                let _ = admin.list_workers(Request::new(r)).await;
            }
            Rpc::ListJobs => {
                let Ok(r) = pb::ListJobsRequest::decode(body) else { continue };
                let _ = admin.list_jobs(Request::new(r)).await;
            }
            Rpc::DrainWorker => {
                let Ok(mut r) = pb::DrainWorkerRequest::decode(body) else { continue };
                pick(&mut r.worker_id, &ids.workers);
                let _ = admin.drain_worker(Request::new(r)).await;
            }
            Rpc::ScaleWorkers => {
                let Ok(r) = pb::ScaleWorkersRequest::decode(body) else { continue };
                // No pool here: refused before any process would start.
                let _ = admin.scale_workers(Request::new(r)).await;
            }
            Rpc::Autoscale => {
                let Ok(r) = pb::AutoscaleRequest::decode(body) else { continue };
                let _ = loader_server::fuzzing::check_autoscale(&r);
                let _ = admin.autoscale(Request::new(r)).await;
            }
            Rpc::ListSessions => {
                let Ok(r) = pb::ListSessionsRequest::decode(body) else { continue };
                let _ = admin.list_sessions(Request::new(r)).await;
            }
            Rpc::KedaIsActive => {
                let Ok(r) = ScaledObjectRef::decode(body) else { continue };
                let _ = keda.is_active(Request::new(r)).await;
            }
            Rpc::KedaStreamIsActive => {
                let Ok(r) = ScaledObjectRef::decode(body) else { continue };
                let _ = keda.stream_is_active(Request::new(r)).await;
            }
            Rpc::KedaGetMetricSpec => {
                let Ok(r) = ScaledObjectRef::decode(body) else { continue };
                let _ = keda.get_metric_spec(Request::new(r)).await;
            }
            Rpc::KedaGetMetrics => {
                let Ok(r) = GetMetricsRequest::decode(body) else { continue };
                let _ = keda.get_metrics(Request::new(r)).await;
            }
            Rpc::Fetch => fetch_call(&mut batches, body, &ids).await,
            Rpc::PutBlob => {
                // A chunk of an upload: hash, offset, size and bytes as
                // the input says (the store checks each against the rest).
                let Ok(r) = pb::PutBlobRequest::decode(body) else { continue };
                let _ = trainers.put_blob(Request::new(r)).await;
            }
            Rpc::GetBlob => {
                let Ok(r) = pb::GetBlobRequest::decode(body) else { continue };
                let _ = workers.get_blob(Request::new(r)).await;
            }
        }
    }
    fetch.stop();
}

/// One `Fetch` stream through the worker's generated server: the body is
/// split into gRPC frames at `;` (the first frame names the consumer),
/// each frame decoded by tonic as a `FetchRequest`; the response stream is
/// read until it has nothing more to send (a paused clock makes that
/// instant).
async fn fetch_call<S>(server: &mut BatchServiceServer<S>, body: &[u8], ids: &Ids)
where
    S: loader_proto::pb::batch_service_server::BatchService,
{
    let mut framed = BytesMut::new();
    for (i, part) in body.split(|&b| b == b';').enumerate() {
        let mut part = part.to_vec();
        if i == 0
            && let Ok(mut first) = pb::FetchRequest::decode(&part[..])
        {
            pick(&mut first.session_id, &ids.sessions);
            pick(&mut first.job_id, &ids.jobs);
            part = first.encode_to_vec();
        }
        framed.put_u8(0);
        framed.put_u32(part.len() as u32);
        framed.put_slice(&part);
    }
    let request = http::Request::builder()
        .method("POST")
        .uri("http://worker/loader.v1.BatchService/Fetch")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(framed.freeze()))
        .expect("request");
    let Ok(response) = server.call(request).await;
    let mut body = response.into_body();
    // At most a few frames, each bounded by the paused clock.
    for _ in 0..8 {
        match tokio::time::timeout(Duration::from_secs(1), body.frame()).await {
            Ok(Some(Ok(_))) => {}
            _ => break,
        }
    }
}
