//! Writes the binary seed inputs of `batch_header`, `ring_messages` and
//! `rpc_requests` into `corpus/<target>/` (the spec targets' seeds are the
//! spec files of the repository's tests and docs, copied by hand). Run by
//! `bench/fuzz.sh --seeds`; the committed corpus already holds them.
//!
//! A fuzz target whose `init` writes the seeds and exits: an instrumented
//! binary needs libFuzzer's runtime linked in, which only a target gets.
#![no_main]
// `init` exits, so the macro's fuzzing body is unreachable.
#![allow(unreachable_code)]

use std::path::Path;

use loader_fuzz::rpc::{Rpc, call};
use loader_proto::batch::{BatchLayout, BatchMeta, TensorDesc};
use loader_proto::pb::{self, Dtype, RingAttach, RingToTrainer, RingToWorker, ring_to_trainer, ring_to_worker};
use loader_ring::frame::encode;

fn put(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).expect("corpus dir");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("write seed");
}

fn batch(samples: usize, tensors: Vec<TensorDesc>, seq: u64) -> Vec<u8> {
    let layout = BatchLayout::new(samples, tensors).expect("layout");
    let meta = BatchMeta { job_id: 1, epoch: (seq / 4) as u32, consumer: 0, seq };
    let mut buf = vec![0u8; layout.total_len()];
    let indices: Vec<u64> = (0..samples as u64).collect();
    for p in layout.write(&meta, &indices, &mut buf).expect("write") {
        p.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    }
    buf
}

fn t(name: &str, dtype: Dtype, shape: &[u64]) -> TensorDesc {
    TensorDesc { name: name.into(), dtype, shape: shape.to_vec() }
}

fn write_seeds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");

    let dir = root.join("batch_header");
    put(&dir, "ring-slot", &loader_fuzz::ring::slot_batch(3));
    put(&dir, "image", &batch(4, vec![t("data", Dtype::U8, &[4, 3, 4, 4]), t("label", Dtype::I64, &[4])], 5));
    put(&dir, "floats", &batch(2, vec![t("x", Dtype::F32, &[2, 3]), t("y", Dtype::F16, &[2]), t("tokens", Dtype::U16, &[2, 8])], 0));
    put(&dir, "empty", &batch(0, vec![], 0));
    put(&dir, "layout", &[4, 3, 2, 3, 4, 3, 4, 8, 2, 1, 5, 9, 2, 6, 7, 0, 3]);

    let dir = root.join("ring_messages");
    let filled = |slot: u32, generation: u64, len: u64, seq: u64| {
        encode(&RingToTrainer {
            msg: Some(ring_to_trainer::Msg::Filled(pb::SlotFilled { slot, generation, len, seq, traceparent: String::new() })),
        })
    };
    let returned = |slot: u32, generation: u64| {
        encode(&RingToTrainer { msg: Some(ring_to_trainer::Msg::Returned(pb::SlotReturned { slot, generation })) })
    };
    let len = loader_fuzz::ring::slot_batch(0).len() as u64;
    let mut s = vec![3, 1, 0x10, 7];
    s.extend(filled(0, 1, len, 0));
    s.extend(filled(1, 1, len, 1));
    s.extend(returned(1, 1));
    s.extend(filled(0, 2, len, 0));
    put(&dir, "trainer-reports", &s);
    let mut s = vec![7, 3, 0, 0];
    s.extend(returned(0, 1));
    s.extend(filled(1, 1, 4096, 1));
    s.extend(encode(&RingToTrainer { msg: Some(ring_to_trainer::Msg::Hello(pb::RingHello { protocol_version: 1, worker_id: 4, address: "w".into() })) }));
    put(&dir, "trainer-lies", &s);
    let grant = |slot: u32, generation: u64| encode(&RingToWorker { msg: Some(ring_to_worker::Msg::Grant(pb::SlotGrant { slot, generation })) });
    let mut s = vec![2, 1, 3, 9];
    s.extend(encode(&RingToWorker {
        msg: Some(ring_to_worker::Msg::Attach(RingAttach { session_id: 1, job_id: 1, consumer: 0, slot_size: 4096, slot_count: 4, doorbell: true })),
    }));
    s.extend(grant(0, 1));
    s.extend(grant(1, 1));
    s.extend(encode(&RingToWorker { msg: Some(ring_to_worker::Msg::Reclaim(pb::SlotReclaim { count: 1 })) }));
    s.extend(grant(0, 2));
    s.extend(grant(5, 1));
    put(&dir, "worker-grants", &s);

    let dir = root.join("rpc_requests");
    let v = loader_proto::PROTOCOL_VERSION;
    let spec = pb::JobSpec {
        dataset: Some(pb::DatasetSpec {
            kind: Some(pb::dataset_spec::Kind::Synthetic(pb::SyntheticSpec {
                num_samples: 64,
                shape: vec![3],
                dtype: Dtype::U8 as i32,
                ..Default::default()
            })),
        }),
        batch_size: 8,
        epochs: 2,
        consumers: 2,
        ..Default::default()
    };
    let mut s = Vec::new();
    call(&mut s, Rpc::CreateOrAttachJob, &pb::CreateOrAttachJobRequest { protocol_version: v, spec: Some(spec.clone()) });
    call(&mut s, Rpc::RegisterWorker, &pb::RegisterWorkerRequest { protocol_version: v, address: "http://w:1".into(), node: "n".into(), max_outstanding: 4, memory_budget: 1 << 30, pid: 9 });
    call(&mut s, Rpc::OpenSession, &pb::OpenSessionRequest { protocol_version: v, job_id: 0, consumer: 1, node: "n".into(), ..Default::default() });
    call(&mut s, Rpc::WorkerHeartbeat, &pb::WorkerHeartbeatRequest { protocol_version: v, worker_id: 0, wait_ms: 10, busy: 0.5, ..Default::default() });
    call(&mut s, Rpc::Fetch, &pb::FetchRequest { job_id: 0, consumer: 1, session_id: 0, credits: 2, ..Default::default() });
    call(&mut s, Rpc::WorkerHeartbeat, &pb::WorkerHeartbeatRequest {
        protocol_version: v,
        worker_id: 0,
        delivered: vec![pb::Delivered { job_id: 0, consumer: 1, seqs: vec![0, 1] }],
        failed: vec![pb::Failed { job_id: 0, consumer: 1, start_seq: 2, end_seq: 3, error: "bad".into() }],
        windows: vec![pb::JobWindow { job_id: 0, batches: 4 }],
        ..Default::default()
    });
    call(&mut s, Rpc::SessionHeartbeat, &pb::SessionHeartbeatRequest { protocol_version: v, session_id: 0, consumed: 2, stall_ms: 30, ..Default::default() });
    call(&mut s, Rpc::Routes, &pb::RoutesRequest { session_id: 0, ..Default::default() });
    call(&mut s, Rpc::KedaGetMetrics, &loader_proto::keda::GetMetricsRequest { scaled_object_ref: None, metric_name: String::new() });
    call(&mut s, Rpc::ListSessions, &pb::ListSessionsRequest {});
    call(&mut s, Rpc::OpenSession, &pb::OpenSessionRequest { protocol_version: v, job_id: 0, consumer: 1, resume: true, start_seq: 3, ..Default::default() });
    call(&mut s, Rpc::CloseSession, &pb::CloseSessionRequest { protocol_version: v, session_id: 0, consumed: 3, ..Default::default() });
    call(&mut s, Rpc::DrainWorker, &pb::DrainWorkerRequest { worker_id: 0 });
    call(&mut s, Rpc::Deregister, &pb::DeregisterRequest { protocol_version: v, worker_id: 0 });
    put(&dir, "session", &s);
    let mut s = Vec::new();
    let mut metadata = std::collections::HashMap::new();
    metadata.insert("targetStall".to_owned(), "5%".to_owned());
    metadata.insert("metricName".to_owned(), "m".to_owned());
    let object = loader_proto::keda::ScaledObjectRef { name: "w".into(), namespace: "d".into(), scaler_metadata: metadata };
    call(&mut s, Rpc::KedaGetMetricSpec, &object);
    call(&mut s, Rpc::KedaIsActive, &object);
    call(&mut s, Rpc::KedaStreamIsActive, &object);
    call(&mut s, Rpc::KedaGetMetrics, &loader_proto::keda::GetMetricsRequest { scaled_object_ref: Some(object), metric_name: "m".into() });
    call(&mut s, Rpc::Autoscale, &pb::AutoscaleRequest { min: 1, max: 4, target_stall: 0.05, cooldown_ms: 100, off: false });
    call(&mut s, Rpc::ScaleWorkers, &pb::ScaleWorkersRequest { workers: 3 });
    call(&mut s, Rpc::ListWorkers, &pb::ListWorkersRequest {});
    call(&mut s, Rpc::ListJobs, &pb::ListJobsRequest {});
    put(&dir, "admin-keda", &s);
    // A blob uploaded in two chunks under a hash it does not have, then read.
    let mut s = Vec::new();
    let sha = "ab".repeat(32);
    call(&mut s, Rpc::PutBlob, &pb::PutBlobRequest { protocol_version: v, sha256: sha.clone(), size: 10, offset: 0, data: b"blob ".to_vec().into() });
    call(&mut s, Rpc::PutBlob, &pb::PutBlobRequest { protocol_version: v, sha256: sha.clone(), size: 10, offset: 5, data: b"bytes".to_vec().into() });
    call(&mut s, Rpc::GetBlob, &pb::GetBlobRequest { protocol_version: v, sha256: sha, offset: 2, max_bytes: 4 });
    put(&dir, "blobs", &s);
    // A job resumed on another world size, its plan replacing the first.
    let mut s = Vec::new();
    let named = pb::JobSpec { name: "elastic".into(), ..spec.clone() };
    call(&mut s, Rpc::CreateOrAttachJob, &pb::CreateOrAttachJobRequest { protocol_version: v, spec: Some(named.clone()) });
    let resumed = pb::JobSpec {
        consumers: 3,
        resume: Some(pb::EpochResume { epoch: 1, offset: 10, delivered: vec![12, 15] }),
        ..named
    };
    call(&mut s, Rpc::CreateOrAttachJob, &pb::CreateOrAttachJobRequest { protocol_version: v, spec: Some(resumed) });
    call(&mut s, Rpc::OpenSession, &pb::OpenSessionRequest { protocol_version: v, job_id: 0, consumer: 2, node: "n".into(), ..Default::default() });
    call(&mut s, Rpc::OpenSession, &pb::OpenSessionRequest { protocol_version: v, job_id: 0, consumer: 0, resume: true, start_seq: 1, ..Default::default() });
    put(&dir, "elastic", &s);
    let mut s = Vec::new();
    call(&mut s, Rpc::CreateOrAttachJob, &pb::CreateOrAttachJobRequest { protocol_version: v, spec: Some(pb::JobSpec { consumers: 1, ..spec }) });
    call(&mut s, Rpc::CreateOrAttachJob, &pb::CreateOrAttachJobRequest { protocol_version: v + 1, spec: None });
    call(&mut s, Rpc::RegisterWorker, &pb::RegisterWorkerRequest { protocol_version: v, address: "http://w:2".into(), max_outstanding: 1, ..Default::default() });
    call(&mut s, Rpc::WorkerHeartbeat, &pb::WorkerHeartbeatRequest { protocol_version: v, worker_id: 0, ..Default::default() });
    call(&mut s, Rpc::Fetch, &pb::FetchRequest { job_id: 0, consumer: 0, session_id: 0, credits: 1, ..Default::default() });
    put(&dir, "fetch", &s);
}

libfuzzer_sys::fuzz_target!(
    init: {
        write_seeds();
        std::process::exit(0);
    },
    |_data: &[u8]| {}
);
