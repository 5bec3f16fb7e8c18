use super::*;
use loader_proto::pb::{DatasetSpec, Dtype, JobSpec, SyntheticSpec, dataset_spec::Kind};

fn spec(name: &str, n: u64, batch: u32, consumers: u32) -> JobSpec {
    JobSpec {
        name: name.into(),
        dataset: Some(DatasetSpec {
            kind: Some(Kind::Synthetic(SyntheticSpec { num_samples: n, shape: vec![4], dtype: Dtype::U8 as i32, cost_ns: 0, wait_ns_by_epoch: Vec::new() })),
        }),
        batch_size: batch,
        epochs: 1,
        consumers,
        ..Default::default()
    }
}

/// Creates a job and opens a session for each of its consumers, so that its
/// batches can be assigned.
fn create(c: &Coordinator, spec: JobSpec) -> pb::Job {
    let consumers = spec.consumers;
    let (job, _) = c.create_or_attach(spec).expect("job");
    for consumer in 0..consumers {
        c.open_session(job.job_id, consumer, None, "n".into(), String::new(), None).expect("session");
    }
    job
}

fn coordinator() -> Coordinator {
    Coordinator::new(ServerConfig { range_len: 2, ..ServerConfig::default() })
}

fn seqs(tasks: &[pb::Task], consumer: u32) -> Vec<u64> {
    tasks.iter().filter(|t| t.consumer == consumer).flat_map(|t| t.start_seq..t.end_seq).collect()
}

async fn tasks(c: &Coordinator, worker: u64, delivered: Vec<pb::Delivered>) -> Vec<pb::Task> {
    match c.worker_heartbeat(worker, WorkerReport { delivered, failed: Vec::new(), ..Default::default() }, Duration::ZERO).await {
        HeartbeatOutcome::Tasks { tasks, .. } => tasks,
        HeartbeatOutcome::Reregister => panic!("worker unknown"),
    }
}

/// A worker's announced window replaces `max_outstanding` for that job
/// only: small batches go out in ranges of a quarter of it, and what the
/// worker says is clamped to what the protocol allows.
#[tokio::test]
async fn announced_windows_size_the_ranges_of_their_job_only() {
    let c = coordinator();
    let small = create(&c, spec("small", 10_000, 1, 1));
    let other = create(&c, spec("other", 10_000, 1, 1));
    let w = c.register_worker("http://w".into(), "n".into(), 8, 0);
    let announce = |job_id, batches| WorkerReport {
        windows: vec![pb::JobWindow { job_id, batches }],
        ..Default::default()
    };
    let t = match c.worker_heartbeat(w, announce(small.job_id, 256), Duration::ZERO).await {
        HeartbeatOutcome::Tasks { tasks, .. } => tasks,
        HeartbeatOutcome::Reregister => panic!("worker unknown"),
    };
    let ranges = |job_id: u64| -> Vec<(u64, u64)> {
        t.iter()
            .filter(|t| t.job.as_ref().map(|j| j.job_id) == Some(job_id))
            .map(|t| (t.start_seq, t.end_seq))
            .collect()
    };
    assert_eq!(ranges(small.job_id), vec![(0, 64), (64, 128), (128, 192), (192, 256)]);
    assert_eq!(ranges(other.job_id), vec![(0, 2), (2, 4), (4, 6), (6, 8)], "not announced: max_outstanding");

    // Out of bounds either way: clamped.
    let w2 = c.register_worker("http://w2".into(), "n".into(), 8, 0);
    match c.worker_heartbeat(w2, announce(other.job_id, 1 << 30), Duration::ZERO).await {
        HeartbeatOutcome::Tasks { tasks, .. } => {
            let held: u64 = tasks
                .iter()
                .filter(|t| t.job.as_ref().map(|j| j.job_id) == Some(other.job_id))
                .map(|t| t.end_seq - t.start_seq)
                .sum();
            assert_eq!(held, u64::from(loader_job::window::MAX_WINDOW));
        }
        HeartbeatOutcome::Reregister => panic!("worker unknown"),
    }
    let w3 = c.register_worker("http://w3".into(), "n".into(), 8, 0);
    match c.worker_heartbeat(w3, announce(small.job_id, 0), Duration::ZERO).await {
        HeartbeatOutcome::Tasks { tasks, .. } => {
            let held: u64 = tasks
                .iter()
                .filter(|t| t.job.as_ref().map(|j| j.job_id) == Some(small.job_id))
                .map(|t| t.end_seq - t.start_seq)
                .sum();
            assert_eq!(held, 8, "never below max_outstanding");
        }
        HeartbeatOutcome::Reregister => panic!("worker unknown"),
    }
}

#[tokio::test]
async fn assignment_is_bounded_per_consumer_and_resumes_on_delivery() {
    let c = coordinator();
    let job = create(&c, spec("", 200, 10, 2));
    let w = c.register_worker("http://w".into(), "n".into(), 4, 0);
    let t = tasks(&c, w, Vec::new()).await;
    assert_eq!(seqs(&t, 0), vec![0, 1, 2, 3]);
    assert_eq!(seqs(&t, 1), vec![0, 1, 2, 3]);
    assert!(tasks(&c, w, Vec::new()).await.is_empty(), "no room left");
    let report = vec![pb::Delivered { job_id: job.job_id, consumer: 0, seqs: vec![0, 1, 0] }];
    let t = tasks(&c, w, report).await;
    assert_eq!(seqs(&t, 0), vec![4, 5]);
    assert!(seqs(&t, 1).is_empty());
    let jobs = c.list_jobs();
    assert_eq!(jobs[0].consumers[0].delivered, 2, "a duplicate report counts once");
    assert_eq!(c.list_workers()[0].outstanding, 8);
}

#[tokio::test]
async fn two_workers_split_the_sequence() {
    let c = coordinator();
    create(&c, spec("", 64, 8, 1));
    let a = c.register_worker("http://a".into(), "n".into(), 2, 0);
    let b = c.register_worker("http://b".into(), "n".into(), 2, 0);
    let ta = tasks(&c, a, Vec::new()).await;
    let tb = tasks(&c, b, Vec::new()).await;
    assert_eq!(seqs(&ta, 0), vec![0, 1]);
    assert_eq!(seqs(&tb, 0), vec![2, 3]);
}

#[tokio::test(start_paused = true)]
async fn idle_heartbeat_waits_for_work_and_wakes_on_new_job() {
    let c = coordinator();
    let w = c.register_worker("http://w".into(), "n".into(), 4, 0);
    let waiting = {
        let c = c.clone();
        tokio::spawn(async move { c.worker_heartbeat(w, WorkerReport { delivered: Vec::new(), failed: Vec::new(), ..Default::default() }, Duration::from_secs(1)).await })
    };
    tokio::time::advance(Duration::from_millis(100)).await;
    create(&c, spec("", 10, 5, 1));
    match waiting.await.expect("join") {
        HeartbeatOutcome::Tasks { tasks: t, .. } => assert_eq!(seqs(&t, 0), vec![0, 1]),
        HeartbeatOutcome::Reregister => panic!("worker unknown"),
    }
    // With nothing to do the call ends at its deadline, empty.
    let start = tokio::time::Instant::now();
    match c.worker_heartbeat(w, WorkerReport { delivered: Vec::new(), failed: Vec::new(), ..Default::default() }, Duration::from_millis(300)).await {
        HeartbeatOutcome::Tasks { tasks: t, .. } => assert!(t.is_empty()),
        HeartbeatOutcome::Reregister => panic!("worker unknown"),
    }
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}

#[tokio::test]
async fn unknown_worker_is_told_to_reregister() {
    let c = coordinator();
    assert!(matches!(
        c.worker_heartbeat(42, WorkerReport { delivered: Vec::new(), failed: Vec::new(), ..Default::default() }, Duration::ZERO).await,
        HeartbeatOutcome::Reregister
    ));
}

#[tokio::test]
async fn failed_task_fails_the_job_and_stops_assignment() {
    let c = coordinator();
    let (job, _) = c.create_or_attach(spec("", 10, 2, 1)).expect("job");
    let (session, _, _) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("session");
    let w = c.register_worker("http://w".into(), "n".into(), 2, 0);
    let t = tasks(&c, w, Vec::new()).await;
    assert_eq!(t.len(), 1);
    let failed = vec![pb::Failed { job_id: job.job_id, consumer: 0, start_seq: 0, end_seq: 2, error: "bad file /x".into() }];
    match c.worker_heartbeat(w, WorkerReport { delivered: Vec::new(), failed, ..Default::default() }, Duration::ZERO).await {
        HeartbeatOutcome::Tasks { tasks: t, .. } => assert!(t.is_empty()),
        HeartbeatOutcome::Reregister => panic!("worker unknown"),
    }
    assert_eq!(c.session_heartbeat(session, 0, 0).as_deref(), Some("bad file /x"));
    assert_eq!(c.routes(session).expect("routes").1, "bad file /x");
}

#[test]
fn named_jobs_attach_and_reject_other_specs() {
    let c = coordinator();
    let (a, attached) = c.create_or_attach(spec("train", 10, 2, 1)).expect("job");
    assert!(!attached);
    let (b, attached) = c.create_or_attach(spec("train", 10, 2, 1)).expect("attach");
    assert!(attached);
    assert_eq!(a.job_id, b.job_id);
    let err = c.create_or_attach(spec("train", 11, 2, 1)).expect_err("different spec");
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::AlreadyExists);
}

#[test]
fn a_resumed_plan_replaces_its_namesake_once_no_trainer_is_left() {
    let c = coordinator();
    let (old, _) = c.create_or_attach(spec("train", 100, 10, 4)).expect("job");
    let (old_session, _, _) = c.open_session(old.job_id, 0, None, "n".into(), String::new(), None).expect("session");
    let mut resumed = spec("train", 100, 10, 2);
    resumed.resume = Some(pb::EpochResume { epoch: 0, offset: 40, delivered: vec![41] });

    // The old run still has a trainer: refused, saying how to resume.
    let status = tonic::Status::from(c.create_or_attach(resumed.clone()).expect_err("old trainer left"));
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(status.message().contains("every new rank must resume from the same state"), "{}", status.message());

    // Once it has left, the first new rank replaces the job, the others attach.
    c.close_session(old_session, 3);
    let (new, attached) = c.create_or_attach(resumed.clone()).expect("replaces");
    assert!(!attached);
    assert_ne!(new.job_id, old.job_id);
    let (again, attached) = c.create_or_attach(resumed.clone()).expect("attaches");
    assert!(attached);
    assert_eq!(again.job_id, new.job_id);
    let err = c.open_session(old.job_id, 1, None, "n".into(), String::new(), None).expect_err("replaced");
    assert!(err.to_string().contains("replaced by a resumed plan"), "{err}");
    c.open_session(new.job_id, 1, None, "n".into(), String::new(), None).expect("session on the new plan");

    // A rank resumed from another state while the new plan runs: refused.
    let mut other = resumed.clone();
    if let Some(r) = other.resume.as_mut() {
        r.offset = 30;
    }
    let status = tonic::Status::from(c.create_or_attach(other).expect_err("another state"));
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    // Another dataset under the name is not a resume at all.
    let mut unrelated = spec("train", 99, 10, 2);
    unrelated.resume = resumed.resume.clone();
    let status = tonic::Status::from(c.create_or_attach(unrelated).expect_err("another job"));
    assert_eq!(status.code(), tonic::Code::AlreadyExists);
}

#[test]
fn bad_requests_map_to_fatal_codes() {
    let c = coordinator();
    let err = c.create_or_attach(spec("", 10, 0, 1)).expect_err("batch 0");
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("batch_size"));
    let (job, _) = c.create_or_attach(spec("", 10, 2, 2)).expect("job");
    let err = c.open_session(job.job_id, 2, None, "n".into(), String::new(), None).expect_err("consumer 2 of 2");
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::InvalidArgument);
    let err = c.open_session(99, 0, None, "n".into(), String::new(), None).expect_err("no job");
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::NotFound);
    let err = crate::error::check_version(99).expect_err("version");
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::FailedPrecondition);
}

#[test]
fn a_job_runs_only_on_blobs_the_coordinator_holds_and_keeps_no_trainer_path() {
    let c = coordinator();
    let bytes = b"pickled dataset".to_vec();
    let mut sha = loader_process::blobs::Sha256::default();
    sha.update(&bytes);
    let blob = pb::BlobRef { name: "pickle_file".into(), sha256: sha.finish(), size: bytes.len() as u64, source: "/home/me/ds.pkl".into() };
    let named = |name: &str| JobSpec { blobs: vec![blob.clone()], ..spec(name, 10, 2, 1) };
    let status = tonic::Status::from(c.create_or_attach(named("a")).expect_err("not uploaded"));
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(status.message().starts_with("the job needs blob `pickle_file`"), "{}", status.message());

    let chunk = crate::blobs::Chunk { sha256: blob.sha256.clone(), size: blob.size, offset: 0, data: bytes.into() };
    assert!(c.put_blob(chunk).expect("uploaded").held);
    let (job, _) = c.create_or_attach(named("a")).expect("held now");
    let held = job.spec.as_ref().expect("spec").blobs[0].clone();
    assert_eq!(held, pb::BlobRef { source: String::new(), ..blob.clone() }, "the trainer's path stays with it");
    // A rank on another host, whose file is elsewhere, attaches.
    let elsewhere = JobSpec { blobs: vec![pb::BlobRef { source: "/data/ds.pkl".into(), ..blob.clone() }], ..spec("a", 10, 2, 1) };
    assert!(c.create_or_attach(elsewhere).expect("attached").1);
}

#[tokio::test]
async fn tasks_of_a_colocated_ring_session_carry_its_socket() {
    let c = coordinator();
    let (job, _) = c.create_or_attach(spec("", 100, 10, 2)).expect("job");
    c.open_session(job.job_id, 0, None, "host-a".into(), "/run/loader/a.sock".into(), None).expect("session 0");
    c.open_session(job.job_id, 1, None, "host-b".into(), "/run/loader/b.sock".into(), None).expect("session 1");
    let local = c.register_worker("http://a".into(), "host-a".into(), 2, 0);
    let t = tasks(&c, local, Vec::new()).await;
    for task in &t {
        let expect = if task.consumer == 0 { "/run/loader/a.sock" } else { "" };
        assert_eq!(task.ring_socket, expect, "consumer {}", task.consumer);
    }
    assert_eq!(t.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn expired_worker_batches_go_to_another_worker_first() {
    let c = coordinator();
    let (job, _) = c.create_or_attach(spec("", 640, 64, 1)).expect("job");
    let (session, _, _) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("session");
    let a = c.register_worker("http://a".into(), "n".into(), 4, 0);
    assert_eq!(seqs(&tasks(&c, a, Vec::new()).await, 0), vec![0, 1, 2, 3]);
    // a delivers 0 and 1; the trainer acknowledges 0 only.
    let report = vec![pb::Delivered { job_id: job.job_id, consumer: 0, seqs: vec![0, 1] }];
    tasks(&c, a, report).await;
    c.session_heartbeat(session, 1, 0);

    let b = c.register_worker("http://b".into(), "n".into(), 8, 0);
    let ttl = c.config.lease_ttl;
    // Within the TTL nothing expires: b heartbeats, a stays silent.
    tokio::time::advance(ttl / 2).await;
    tasks(&c, b, Vec::new()).await;
    assert_eq!(c.expire(tokio::time::Instant::now()), (0, 0));
    tokio::time::advance(ttl / 2 + Duration::from_millis(1)).await;
    c.session_heartbeat(session, 1, 0);
    match c.worker_heartbeat(b, WorkerReport { delivered: Vec::new(), failed: Vec::new(), ..Default::default() }, Duration::ZERO).await {
        HeartbeatOutcome::Tasks { .. } => {}
        HeartbeatOutcome::Reregister => panic!("b is alive"),
    }
    assert_eq!(c.expire(tokio::time::Instant::now()), (1, 0), "a expired, the session renewed");
    // a's unacknowledged (1) and undelivered (2, 3) batches come back, lowest first.
    let b_tasks = tasks(&c, b, vec![]).await;
    let again: Vec<u64> = seqs(&b_tasks, 0);
    assert_eq!(again[..3], [1, 2, 3]);
    // a is told to register again.
    assert!(matches!(
        c.worker_heartbeat(a, WorkerReport { delivered: Vec::new(), failed: Vec::new(), ..Default::default() }, Duration::ZERO).await,
        HeartbeatOutcome::Reregister
    ));
}

#[tokio::test(start_paused = true)]
async fn silent_session_expires_and_its_ring_is_no_longer_routed() {
    let c = coordinator();
    let (job, _) = c.create_or_attach(spec("", 640, 64, 1)).expect("job");
    let (session, _, _) = c.open_session(job.job_id, 0, None, "n".into(), "/tmp/ring.sock".into(), None).expect("session");
    let w = c.register_worker("http://w".into(), "n".into(), 1, 0);
    assert_eq!(tasks(&c, w, Vec::new()).await[0].ring_socket, "/tmp/ring.sock");
    tokio::time::advance(c.config.lease_ttl + Duration::from_millis(1)).await;
    // The worker renews; the session does not.
    let report = vec![pb::Delivered { job_id: job.job_id, consumer: 0, seqs: vec![0] }];
    match c.worker_heartbeat(w, WorkerReport { delivered: report, failed: Vec::new(), ..Default::default() }, Duration::ZERO).await {
        HeartbeatOutcome::Tasks { tasks: t, .. } => assert_eq!(t[0].ring_socket, "/tmp/ring.sock", "not expired before the reaper runs"),
        HeartbeatOutcome::Reregister => panic!("worker alive"),
    }
    assert_eq!(c.list_sessions().len(), 1);
    assert!(c.list_sessions()[0].ring);
    assert_eq!(c.expire(tokio::time::Instant::now()), (0, 1));
    assert!(c.list_sessions().is_empty(), "an expired session is no longer listed");
    assert_eq!(c.session_heartbeat(session, 0, 0), None, "the trainer is told to reopen");
    let report = vec![pb::Delivered { job_id: job.job_id, consumer: 0, seqs: vec![1] }];
    match c.worker_heartbeat(w, WorkerReport { delivered: report, failed: Vec::new(), ..Default::default() }, Duration::ZERO).await {
        HeartbeatOutcome::Tasks { tasks: t, .. } => assert!(t.is_empty(), "nothing is produced for a dead trainer"),
        HeartbeatOutcome::Reregister => panic!("worker alive"),
    }
    // A new trainer for the consumer gets batches again, over gRPC.
    c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("new session");
    match c.worker_heartbeat(w, WorkerReport { delivered: Vec::new(), failed: Vec::new(), ..Default::default() }, Duration::ZERO).await {
        HeartbeatOutcome::Tasks { tasks: t, .. } => assert_eq!(t[0].ring_socket, ""),
        HeartbeatOutcome::Reregister => panic!("worker alive"),
    }
}

#[tokio::test]
async fn a_restart_on_the_same_state_dir_resumes_at_the_watermark() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ServerConfig { range_len: 2, state_dir: Some(dir.path().to_owned()), ..ServerConfig::default() };
    let (job_id, old_worker) = {
        let c = Coordinator::open(config.clone()).expect("open");
        let (job, _) = c.create_or_attach(spec("train", 640, 64, 1)).expect("job");
        let (session, _, _) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("session");
        let w = c.register_worker("http://w".into(), "n".into(), 4, 0);
        tasks(&c, w, Vec::new()).await;
        c.session_heartbeat(session, 3, 0);
        (job.job_id, w)
    };
    let c = Coordinator::open(config).expect("reopen");
    // The named job is still there, with the same id.
    let (job, attached) = c.create_or_attach(spec("train", 640, 64, 1)).expect("attach");
    assert!(attached);
    assert_eq!(job.job_id, job_id);
    // A worker of the previous run must register again.
    assert!(matches!(
        c.worker_heartbeat(old_worker, WorkerReport { delivered: Vec::new(), failed: Vec::new(), ..Default::default() }, Duration::ZERO).await,
        HeartbeatOutcome::Reregister
    ));
    let w = c.register_worker("http://w2".into(), "n".into(), 2, 0);
    assert_ne!(w, old_worker);
    assert!(tasks(&c, w, Vec::new()).await.is_empty(), "no trainer yet");
    c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("trainer reopens");
    assert_eq!(seqs(&tasks(&c, w, Vec::new()).await, 0), vec![3, 4], "delivery resumes at the watermark");
    assert_eq!(c.list_jobs()[0].consumers[0].consumed, 3);
}

#[tokio::test]
async fn a_draining_worker_gets_no_tasks_and_its_leftovers_are_requeued_on_deregister() {
    let c = coordinator();
    let job = create(&c, spec("", 640, 64, 1));
    let w = c.register_worker("http://w".into(), "n".into(), 4, 0);
    assert_eq!(seqs(&tasks(&c, w, Vec::new()).await, 0), vec![0, 1, 2, 3]);
    c.drain_worker(w).expect("drain");
    let report = vec![pb::Delivered { job_id: job.job_id, consumer: 0, seqs: vec![0, 1] }];
    match c.worker_heartbeat(w, WorkerReport { delivered: report, failed: Vec::new(), ..Default::default() }, Duration::from_secs(1)).await {
        HeartbeatOutcome::Tasks { tasks, drain, .. } => {
            assert!(tasks.is_empty());
            assert!(drain);
        }
        HeartbeatOutcome::Reregister => panic!("worker known"),
    }
    assert!(c.list_workers()[0].draining);
    c.deregister(w).expect("deregister");
    assert!(c.list_workers().is_empty());
    let other = c.register_worker("http://o".into(), "n".into(), 8, 0);
    let again = seqs(&tasks(&c, other, Vec::new()).await, 0);
    assert_eq!(again[..4], [0, 1, 2, 3], "unacknowledged and undelivered batches come back first");
    let err = c.drain_worker(w).expect_err("gone");
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn a_resumed_session_restarts_its_consumer_at_the_saved_batch() {
    let c = coordinator();
    let (job, _) = c.create_or_attach(spec("", 640, 64, 1)).expect("job");
    c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("first trainer");
    let w = c.register_worker("http://w".into(), "n".into(), 4, 0);
    assert_eq!(seqs(&tasks(&c, w, Vec::new()).await, 0), vec![0, 1, 2, 3]);
    c.open_session(job.job_id, 0, None, "n".into(), String::new(), Some(7)).expect("resumed trainer");
    let report = vec![pb::Delivered { job_id: job.job_id, consumer: 0, seqs: vec![0, 1, 2, 3] }];
    assert_eq!(seqs(&tasks(&c, w, report).await, 0), vec![7, 8, 9]);
    assert_eq!(c.list_jobs()[0].consumers[0].consumed, 7);
    let err = c.open_session(job.job_id, 0, None, "n".into(), String::new(), Some(11)).expect_err("past the end");
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::InvalidArgument);
}

#[tokio::test(start_paused = true)]
async fn a_full_worker_still_takes_batches_given_back_by_a_dead_one() {
    let c = coordinator();
    let job = create(&c, spec("", 6400, 64, 1));
    let dead = c.register_worker("http://dead".into(), "n".into(), 2, 0);
    let full = c.register_worker("http://full".into(), "n".into(), 2, 0);
    assert_eq!(seqs(&tasks(&c, dead, Vec::new()).await, 0), vec![0, 1]);
    assert_eq!(seqs(&tasks(&c, full, Vec::new()).await, 0), vec![2, 3]);
    // `full` cannot hand its batches over: the trainer waits for 0 and 1.
    tokio::time::advance(c.config.lease_ttl + Duration::from_millis(1)).await;
    for s in c.list_sessions() {
        c.session_heartbeat(s.session_id, 0, 0);
    }
    let HeartbeatOutcome::Tasks { tasks: none, .. } =
        c.worker_heartbeat(full, WorkerReport { delivered: Vec::new(), failed: Vec::new(), ..Default::default() }, Duration::ZERO).await
    else {
        panic!("full is alive")
    };
    assert!(none.is_empty(), "at its limit");
    assert_eq!(c.expire(tokio::time::Instant::now()), (1, 0));
    assert_eq!(seqs(&tasks(&c, full, Vec::new()).await, 0), vec![0, 1], "given-back batches exceed the limit");
    assert!(tasks(&c, full, Vec::new()).await.is_empty(), "but new ones do not");
    let _ = job;
}

/// A worker's heartbeat answer: its new tasks and the consumers it must drop.
async fn orders(c: &Coordinator, worker: u64) -> (Vec<pb::Task>, Vec<ConsumerKey>) {
    match c.worker_heartbeat(worker, WorkerReport { delivered: Vec::new(), failed: Vec::new(), ..Default::default() }, Duration::ZERO).await {
        HeartbeatOutcome::Tasks { tasks, ended, .. } => (tasks, ended),
        HeartbeatOutcome::Reregister => panic!("worker unknown"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_consumer_whose_last_session_expires_is_taken_back_and_its_workers_told() {
    let c = coordinator();
    let ttl = c.config.lease_ttl;
    let (job, _) = c.create_or_attach(spec("", 640, 64, 1)).expect("job");
    let key = (job.job_id, 0);
    let (first, _, _) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("first session");
    let w = c.register_worker("http://w".into(), "n".into(), 4, 0);
    assert_eq!(seqs(&orders(&c, w).await.0, 0), vec![0, 1, 2, 3]);
    // w hands 0 to the trainer, which dies before acknowledging it; w
    // takes 4 in its place.
    let t = tasks(&c, w, vec![pb::Delivered { job_id: job.job_id, consumer: 0, seqs: vec![0] }]).await;
    assert_eq!(seqs(&t, 0), vec![4]);

    // A second session of the consumer keeps it alive past the first one's lease.
    tokio::time::advance(ttl / 2).await;
    let (second, _, _) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("second session");
    tokio::time::advance(ttl / 2 + Duration::from_millis(1)).await;
    assert_eq!(orders(&c, w).await, (vec![], vec![]), "at its limit");
    assert_eq!(c.expire(tokio::time::Instant::now()), (0, 1));
    assert_eq!(c.session_heartbeat(first, 0, 0), None, "the first session is gone");
    assert_eq!(orders(&c, w).await, (vec![], vec![]), "the consumer still has a session");
    assert_eq!(c.list_workers()[0].outstanding, 4);

    // Its last session expires: what w held (1..5) and what it delivered
    // unacknowledged (0) go back to the queue; w is told once.
    tokio::time::advance(ttl / 2).await;
    orders(&c, w).await;
    assert_eq!(c.expire(tokio::time::Instant::now()), (0, 1));
    assert_eq!(c.session_heartbeat(second, 0, 0), None);
    assert_eq!(c.list_workers()[0].outstanding, 0);
    assert_eq!(c.list_jobs()[0].consumers[0].assigned, 0, "every batch handed out is back in the queue");
    assert_eq!(orders(&c, w).await, (vec![], vec![key]));
    assert_eq!(orders(&c, w).await, (vec![], vec![]), "told once");
    let later = c.register_worker("http://later".into(), "n".into(), 4, 0);
    assert_eq!(orders(&c, later).await, (vec![], vec![]), "nothing for a consumer without a session");

    // A trainer that comes later gets those batches first (beyond the
    // limit, like a dead worker's), each exactly once.
    c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("later session");
    assert_eq!(seqs(&orders(&c, later).await.0, 0), vec![0, 1, 2, 3, 4]);
    assert_eq!(seqs(&orders(&c, w).await.0, 0), vec![5, 6, 7, 8]);
}

#[tokio::test(start_paused = true)]
async fn a_long_poll_wakes_when_its_workers_consumer_ends() {
    let c = coordinator();
    let ttl = c.config.lease_ttl;
    let job = create(&c, spec("", 640, 64, 1));
    let w = c.register_worker("http://w".into(), "n".into(), 2, 0);
    assert_eq!(seqs(&orders(&c, w).await.0, 0), vec![0, 1]);
    tokio::time::advance(ttl / 2).await;
    // At its limit: the call waits (and renews the lease as it arrives).
    let waiting = {
        let c = c.clone();
        tokio::spawn(async move { c.worker_heartbeat(w, WorkerReport { delivered: Vec::new(), failed: Vec::new(), ..Default::default() }, ttl).await })
    };
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    tokio::time::advance(ttl / 2 + Duration::from_millis(1)).await;
    let asked = tokio::time::Instant::now();
    assert_eq!(c.expire(asked), (0, 1), "the session expired, the worker did not");
    match waiting.await.expect("join") {
        HeartbeatOutcome::Tasks { tasks, drain, ended } => {
            assert!(tasks.is_empty());
            assert!(!drain);
            assert_eq!(ended, vec![(job.job_id, 0)]);
        }
        HeartbeatOutcome::Reregister => panic!("worker known"),
    }
    assert_eq!(asked.elapsed(), Duration::ZERO, "answered at once, not at the end of its wait");
}

#[tokio::test(start_paused = true)]
async fn a_draining_worker_hears_that_its_consumer_ended_and_deregisters_with_nothing_to_give_back() {
    let c = coordinator();
    let ttl = c.config.lease_ttl;
    let job = create(&c, spec("", 640, 64, 1));
    let w = c.register_worker("http://w".into(), "n".into(), 2, 0);
    assert_eq!(seqs(&orders(&c, w).await.0, 0), vec![0, 1]);
    c.drain_worker(w).expect("drain");
    tokio::time::advance(ttl + Duration::from_millis(1)).await;
    let answer = |outcome| match outcome {
        HeartbeatOutcome::Tasks { tasks, drain, ended } => (tasks, drain, ended),
        HeartbeatOutcome::Reregister => panic!("worker known"),
    };
    let renew = c.worker_heartbeat(w, WorkerReport { delivered: Vec::new(), failed: Vec::new(), ..Default::default() }, Duration::ZERO).await;
    assert_eq!(answer(renew), (vec![], true, vec![]));
    assert_eq!(c.expire(tokio::time::Instant::now()), (0, 1));
    let told = c.worker_heartbeat(w, WorkerReport { delivered: Vec::new(), failed: Vec::new(), ..Default::default() }, Duration::ZERO).await;
    assert_eq!(answer(told), (vec![], true, vec![(job.job_id, 0)]));
    assert_eq!(c.list_jobs()[0].consumers[0].assigned, 0, "taken back when the consumer ended");
    c.deregister(w).expect("deregister");
    assert_eq!(c.list_jobs()[0].consumers[0].assigned, 0, "and not twice");
}

#[tokio::test(start_paused = true)]
async fn a_finished_consumers_leftovers_go_when_its_session_ends_and_nothing_is_requeued() {
    let c = coordinator();
    let (job, _) = c.create_or_attach(spec("", 256, 64, 1)).expect("job");
    let (session, _, _) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("session");
    let slow = c.register_worker("http://slow".into(), "n".into(), 2, 0);
    let fast = c.register_worker("http://fast".into(), "n".into(), 2, 0);
    assert_eq!(seqs(&orders(&c, slow).await.0, 0), vec![0, 1]);
    assert_eq!(seqs(&orders(&c, fast).await.0, 0), vec![2, 3]);
    tasks(&c, fast, vec![pb::Delivered { job_id: job.job_id, consumer: 0, seqs: vec![2, 3] }]).await;
    // The trainer has all 4 batches (0 and 1 as copies from elsewhere, e.g.
    // after a requeue) and says so in its final heartbeat: slow's are
    // leftovers. While the session is open, late delivery reports still
    // count, so nothing is taken from the workers yet.
    assert_eq!(c.session_heartbeat(session, 4, 0).as_deref(), Some(""));
    assert_eq!(orders(&c, slow).await, (vec![], vec![]));
    // The trainer leaves (its lease lapses): both are told (slow drops its
    // leftovers; fast, which holds nothing, closes the job's dataset), and
    // nothing goes back to the queue, since every batch was acknowledged.
    tokio::time::advance(c.config.lease_ttl + Duration::from_millis(1)).await;
    orders(&c, fast).await;
    assert_eq!(orders(&c, slow).await, (vec![], vec![]));
    assert_eq!(c.expire(tokio::time::Instant::now()), (0, 1));
    assert_eq!(orders(&c, slow).await, (vec![], vec![(job.job_id, 0)]));
    assert_eq!(orders(&c, fast).await, (vec![], vec![(job.job_id, 0)]), "fast served it too");
    assert!(c.list_workers().iter().all(|w| w.outstanding == 0));
    let progress = &c.list_jobs()[0].consumers[0];
    assert_eq!((progress.assigned, progress.consumed), (4, 4), "nothing requeued");
}

/// A job whose workers keep dying before any of its batches is delivered is
/// failed after `POISON_DEATHS` of them; a job that delivered once is never
/// failed by deaths, so workers killed while it runs fail nothing.
#[tokio::test(start_paused = true)]
async fn a_job_that_kills_its_workers_before_delivering_is_failed() {
    let c = coordinator();
    let (job, _) = c.create_or_attach(spec("", 6400, 1, 1)).expect("job");
    let (session, _, _) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("session");
    let ttl = c.config.lease_ttl;
    let job_id = job.job_id;
    let die = |delivered: bool| {
        let c = c.clone();
        async move {
            let w = c.register_worker("http://w".into(), "n".into(), 4, 0);
            let t = tasks(&c, w, Vec::new()).await;
            if delivered {
                let report = vec![pb::Delivered { job_id, consumer: 0, seqs: vec![t[0].start_seq] }];
                tasks(&c, w, report).await;
            }
            tokio::time::advance(ttl + Duration::from_millis(1)).await;
            c.session_heartbeat(session, 0, 0);
            assert_eq!(c.expire(tokio::time::Instant::now()), (1, 0));
        }
    };
    die(false).await;
    die(false).await;
    assert_eq!(c.session_heartbeat(session, 0, 0).as_deref(), Some(""), "two deaths: not yet");
    die(false).await;
    let error = c.session_heartbeat(session, 0, 0).expect("session");
    assert!(error.starts_with("3 workers died while producing batches of job"), "{error}");

    // Another job delivers once; then no number of deaths fails it.
    let (job, _) = c.create_or_attach(spec("other", 6400, 1, 1)).expect("job");
    let (session, _, _) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("session");
    let job_id = job.job_id;
    let die = |delivered: bool| {
        let c = c.clone();
        async move {
            let w = c.register_worker("http://w".into(), "n".into(), 4, 0);
            let t = tasks(&c, w, Vec::new()).await;
            if delivered {
                let report = vec![pb::Delivered { job_id, consumer: 0, seqs: vec![t[0].start_seq] }];
                tasks(&c, w, report).await;
            }
            tokio::time::advance(ttl + Duration::from_millis(1)).await;
            c.session_heartbeat(session, 0, 0);
            // The first job's session, silent now, expires too.
            assert_eq!(c.expire(tokio::time::Instant::now()).0, 1);
        }
    };
    die(true).await;
    for _ in 0..5 {
        die(false).await;
    }
    assert_eq!(c.session_heartbeat(session, 0, 0).as_deref(), Some(""), "it delivered once");
}

/// Workers that announce a memory budget no batch of a job fits get the job
/// refused at submission, naming the field.
#[test]
fn a_job_no_worker_can_hold_is_refused_at_submission() {
    let c = coordinator();
    c.register_worker("http://w".into(), "n".into(), 8, 1 << 30);
    let mut huge = spec("", 16, 4, 1);
    if let Some(Kind::Synthetic(s)) = huge.dataset.as_mut().and_then(|d| d.kind.as_mut()) {
        s.shape = vec![100_000, 100_000];
    }
    let err = c.create_or_attach(huge).expect_err("refused");
    assert!(err.to_string().contains("batch_size: a batch of 4 samples takes 40.0 GB"), "{err}");
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::InvalidArgument);
    assert!(c.create_or_attach(spec("", 16, 4, 1)).is_ok());
}

/// Closing a session forgets it at once, records its watermark, and ends
/// its consumer when it was the last session: workers holding batches for
/// it are told, and batches they had delivered unacknowledged count as
/// re-sent once they are delivered again.
#[tokio::test]
async fn a_closed_session_is_gone_at_once_and_its_consumer_ends() {
    let c = coordinator();
    let (job, _) = c.create_or_attach(spec("", 100, 10, 1)).expect("job");
    let (session, _, _) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("session");
    let w = c.register_worker("http://w".into(), "n".into(), 4, 0);
    tasks(&c, w, Vec::new()).await;
    let report = vec![pb::Delivered { job_id: job.job_id, consumer: 0, seqs: vec![0, 1, 2] }];
    tasks(&c, w, report).await;
    c.close_session(session, 1);
    assert!(c.list_sessions().is_empty(), "gone at once");
    let progress = &c.list_jobs()[0].consumers[0];
    assert_eq!((progress.consumed, progress.delivered, progress.resent), (1, 3, 0), "1 and 2 are not sent again yet");
    match c.worker_heartbeat(w, WorkerReport::default(), Duration::ZERO).await {
        HeartbeatOutcome::Tasks { ended, .. } => assert_eq!(ended, vec![(job.job_id, 0)]),
        HeartbeatOutcome::Reregister => panic!("worker unknown"),
    }
    c.close_session(session, 1);
    // A trainer comes back for the consumer: 1 and 2 go out first, and
    // count as re-sent once delivered again.
    let (back, _, _) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("session");
    assert_eq!(seqs(&tasks(&c, w, Vec::new()).await, 0)[..2], [1, 2]);
    tasks(&c, w, vec![pb::Delivered { job_id: job.job_id, consumer: 0, seqs: vec![1, 2] }]).await;
    let progress = &c.list_jobs()[0].consumers[0];
    assert_eq!((progress.delivered, progress.resent), (5, 2), "1 and 2 sent twice");
    c.close_session(back, 3);
}

/// A re-send still held when the trainer's watermark passed it and its
/// consumer ended adds nothing: the first copy was counted when it was
/// reported, and this one may never have been made (the scale harness
/// caught the coordinator counting it delivered but not re-sent).
#[tokio::test]
async fn a_re_send_held_past_the_watermark_is_not_counted_again() {
    let c = coordinator();
    let (job, _) = c.create_or_attach(spec("", 100, 10, 1)).expect("job");
    let (session, _, _) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("session");
    let first = c.register_worker("http://a".into(), "n".into(), 4, 0);
    assert_eq!(seqs(&tasks(&c, first, Vec::new()).await, 0), vec![0, 1, 2, 3]);
    tasks(&c, first, vec![pb::Delivered { job_id: job.job_id, consumer: 0, seqs: vec![0, 1] }]).await;
    // It leaves before the trainer acknowledged 0 and 1: they go out again.
    c.deregister(first).expect("deregister");
    let second = c.register_worker("http://b".into(), "n".into(), 4, 0);
    assert_eq!(seqs(&tasks(&c, second, Vec::new()).await, 0)[..2], [0, 1]);
    // The trainer consumed the first copies, and ends before the second
    // worker reports the re-sends.
    c.close_session(session, 2);
    let progress = &c.list_jobs()[0].consumers[0];
    assert_eq!((progress.consumed, progress.delivered, progress.resent), (2, 2, 0), "0 and 1 delivered once each");
}

/// Sample cache use: workers report their totals since they started;
/// the job's sums add what moved since each one's previous report, keep
/// the use of a worker that left, and say the cache is off once a worker
/// found it off.
#[tokio::test]
async fn a_jobs_cache_use_sums_its_workers_reports() {
    let c = coordinator();
    let job = create(&c, spec("cached", 100, 10, 1));
    let report = |job_id: u64, hits: u64, misses: u64, off: &str| WorkerReport {
        cache_use: vec![pb::JobCacheUse {
            job_id,
            r#use: Some(pb::CacheUse { hits, misses, stored_bytes: misses * 100, refused: 0, off: off.into() }),
        }],
        ..Default::default()
    };
    let used = |c: &Coordinator| c.list_jobs()[0].cache.clone();
    assert_eq!(used(&c), None, "no worker used a cache");
    let a = c.register_worker("http://a".into(), "n".into(), 4, 0);
    let b = c.register_worker("http://b".into(), "n".into(), 4, 0);
    c.worker_heartbeat(a, report(job.job_id, 0, 10, ""), Duration::ZERO).await;
    c.worker_heartbeat(a, report(job.job_id, 30, 10, ""), Duration::ZERO).await;
    c.worker_heartbeat(b, report(job.job_id, 5, 5, ""), Duration::ZERO).await;
    let sum = used(&c).expect("used");
    assert_eq!((sum.hits, sum.misses, sum.stored_bytes, sum.off.as_str()), (35, 15, 1500, ""), "totals, not deltas: 10 misses counted once");
    c.deregister(a).expect("deregister");
    // A count that went down (a worker that lies) moves nothing.
    c.worker_heartbeat(b, report(job.job_id, 1, 5, "does-not-pay"), Duration::ZERO).await;
    let sum = used(&c).expect("used");
    assert_eq!((sum.hits, sum.misses, sum.off.as_str()), (35, 15, "does-not-pay"), "the worker that left still counts");
    // A report for a job the coordinator does not know changes nothing.
    c.worker_heartbeat(b, report(job.job_id + 99, 1000, 0, ""), Duration::ZERO).await;
    assert_eq!(used(&c).map(|s| s.hits), Some(35));
}

/// Reads from object stores: each worker's latest totals, as it reported
/// them, in ListWorkers; a heartbeat without them keeps the last, a worker
/// that never read from a store shows none, and an overlong latency list
/// is cut.
#[tokio::test]
async fn workers_list_their_latest_reads_from_stores() {
    let c = coordinator();
    let a = c.register_worker("http://a".into(), "n".into(), 4, 0);
    let b = c.register_worker("http://b".into(), "n".into(), 4, 0);
    let report = |requests: u64, latency_buckets: Vec<u64>| WorkerReport {
        storage_use: Some(pb::StorageUse { requests, retries: requests / 2, bytes: requests * 1000, chunk_reads: 10, chunk_fetches: 2, latency_buckets, ..Default::default() }),
        ..Default::default()
    };
    let storage = |c: &Coordinator, id: u64| c.list_workers().into_iter().find(|w| w.worker_id == id).and_then(|w| w.storage);
    assert_eq!(storage(&c, a), None);
    c.worker_heartbeat(a, report(5, vec![0, 2, 3]), Duration::ZERO).await;
    c.worker_heartbeat(a, report(7, vec![0, 3, 4]), Duration::ZERO).await;
    let used = storage(&c, a).expect("a read from a store");
    assert_eq!((used.requests, used.retries, used.bytes, used.chunk_fetches, used.latency_buckets), (7, 3, 7000, 2, vec![0, 3, 4]), "totals, as reported last");
    c.worker_heartbeat(a, WorkerReport::default(), Duration::ZERO).await;
    assert_eq!(storage(&c, a).map(|u| u.requests), Some(7), "a report without them keeps them");
    c.worker_heartbeat(b, WorkerReport::default(), Duration::ZERO).await;
    assert_eq!(storage(&c, b), None, "b read nothing from a store");
    c.worker_heartbeat(b, report(1, vec![1; 10_000]), Duration::ZERO).await;
    assert_eq!(storage(&c, b).map(|u| u.latency_buckets.len()), Some(64));
}

/// ListWorkers shows what operators turn into rates: delivered samples
/// (a short last batch counts short) and the busy fraction of the latest
/// heartbeat, clamped to 0..=1; a report that is not a number is ignored.
#[tokio::test]
async fn workers_list_delivered_samples_and_busy() {
    let c = coordinator();
    let job = create(&c, spec("ops", 10, 4, 1));
    let w = c.register_worker("http://w".into(), "n".into(), 8, 0);
    assert_eq!(seqs(&tasks(&c, w, Vec::new()).await, 0), vec![0, 1, 2]);
    let report = |delivered: Vec<u64>, busy: f64| WorkerReport {
        delivered: vec![pb::Delivered { job_id: job.job_id, consumer: 0, seqs: delivered }],
        busy,
        ..Default::default()
    };
    let listed = |c: &Coordinator| {
        let workers = c.list_workers();
        assert_eq!(workers.len(), 1);
        (workers[0].delivered, workers[0].delivered_samples, workers[0].busy)
    };
    c.worker_heartbeat(w, report(vec![0, 1, 2], 0.25), Duration::ZERO).await;
    assert_eq!(listed(&c), (3, 10, 0.25));
    // Batches it no longer holds count once.
    c.worker_heartbeat(w, report(vec![2], f64::NAN), Duration::ZERO).await;
    assert_eq!(listed(&c), (3, 10, 0.25));
    c.worker_heartbeat(w, report(Vec::new(), 7.0), Duration::ZERO).await;
    assert_eq!(listed(&c), (3, 10, 1.0));
}

/// A coordinator with a job of 10 batches for one consumer, its session,
/// and worker `a` (window 4), for the tests of unreachable and late workers.
fn one_consumer_one_worker() -> (Coordinator, pb::Job, u64, u64) {
    let c = coordinator();
    let (job, _) = c.create_or_attach(spec("", 640, 64, 1)).expect("job");
    let (session, _, _) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("session");
    let a = c.register_worker("http://a".into(), "n".into(), 4, 0);
    (c, job, session, a)
}

/// A report that consumer 0 of `job_id` got `seqs`.
fn delivered(job_id: u64, seqs: &[u64]) -> Vec<pb::Delivered> {
    vec![pb::Delivered { job_id, consumer: 0, seqs: seqs.to_vec() }]
}

/// A trainer that cannot reach a worker (its heartbeat lists it) gets the
/// batches that worker held from another one; the worker, still alive for
/// everybody else, gets none of that consumer's batches while listed, is
/// told to drop what it held, and a late report of those batches counts
/// for nothing. Once the trainer no longer lists it, it gets batches again.
#[tokio::test]
async fn an_unreachable_workers_batches_move_to_another_worker_until_the_trainer_reaches_it() {
    let (c, job, session, a) = one_consumer_one_worker();
    assert_eq!(seqs(&tasks(&c, a, Vec::new()).await, 0), vec![0, 1, 2, 3]);
    // a delivered 0 (not acknowledged); 1-3 are still with it.
    tasks(&c, a, delivered(job.job_id, &[0])).await;

    c.unreachable(session, &[a]);
    let dropped = match c.worker_heartbeat(a, WorkerReport::default(), Duration::ZERO).await {
        HeartbeatOutcome::Tasks { tasks, ended, .. } => {
            assert!(tasks.is_empty(), "no batches of the consumer for a worker its trainer cannot reach");
            ended
        }
        HeartbeatOutcome::Reregister => panic!("a is still registered"),
    };
    assert_eq!(dropped, vec![(job.job_id, 0)], "a is told to drop what it held");
    let b = c.register_worker("http://b".into(), "n".into(), 4, 0);
    let to_b = seqs(&tasks(&c, b, Vec::new()).await, 0);
    assert!(to_b.starts_with(&[0, 1, 2, 3]), "b makes a's batches first, 0 again too: {to_b:?}");

    // A late report from a delivers nothing: b holds those batches now.
    tasks(&c, a, delivered(job.job_id, &[1, 2])).await;
    let delivered = |id: u64| c.list_workers().into_iter().find(|w| w.worker_id == id).map(|w| w.delivered);
    assert_eq!(delivered(a), Some(1), "only the report before the cut counted");

    // Listed again (every heartbeat repeats the list): nothing changes.
    c.unreachable(session, &[a]);
    assert!(tasks(&c, a, Vec::new()).await.is_empty());
    // Reached again: a takes the next batches.
    c.unreachable(session, &[]);
    let to_a = seqs(&tasks(&c, a, Vec::new()).await, 0);
    assert!(!to_a.is_empty() && to_a.iter().all(|s| !to_b.contains(s)), "a takes new batches: {to_a:?}");
}

/// A trainer waiting on a late batch gets a backup: another worker copies
/// that batch and the next few the slow one holds; each batch counts once,
/// whichever copy is reported first (the other holder's report of it is
/// ignored), and the outcome is counted. One backup at a time.
#[tokio::test]
async fn a_late_batch_gets_a_backup_task_and_each_batch_counts_once() {
    let (c, job, session, a) = one_consumer_one_worker();
    let b = c.register_worker("http://b".into(), "n".into(), 4, 0);
    assert_eq!(seqs(&tasks(&c, a, Vec::new()).await, 0), vec![0, 1, 2, 3]);
    assert_eq!(seqs(&tasks(&c, b, Vec::new()).await, 0), vec![4, 5, 6, 7]);
    let delivered = |seqs: &[u64]| delivered(job.job_id, seqs);

    c.late(session, 0);
    assert!(tasks(&c, b, Vec::new()).await.is_empty(), "a has delivered nothing yet: starting up, no backup");
    tasks(&c, a, delivered(&[0])).await;
    c.late(session, 1);
    c.late(session, 1); // one backup at a time
    let to_b = tasks(&c, b, Vec::new()).await;
    assert_eq!(seqs(&to_b, 0)[..3], [1, 2, 3], "b copies a's late batches first");
    assert!(tasks(&c, a, Vec::new()).await.iter().all(|t| t.start_seq >= 8), "a gets nothing of its own backup");

    tasks(&c, b, delivered(&[1])).await; // the copy wins 1
    tasks(&c, a, delivered(&[1, 2])).await; // a's 1 counts for nothing; its 2 beats b's
    tasks(&c, b, delivered(&[2, 3, 8])).await; // b's 2 counts for nothing; 3 and 8 are b's
    let progress = c.list_jobs().remove(0).consumers.remove(0);
    // a had taken 8 when it reported 0: the backup copied 1, 2, 3 and 8.
    assert_eq!((progress.backup_launched, progress.backup_won, progress.backup_wasted), (4, 3, 1));
    assert_eq!((progress.delivered, progress.resent), (5, 0), "each batch counted once");

    // The backup is over: the next late batch may have one.
    c.late(session, 4);
    let again = seqs(&tasks(&c, a, Vec::new()).await, 0);
    assert!(again.starts_with(&[4, 5, 6, 7]), "a copies b's late batches: {again:?}");
}

/// A worker whose delivery report has not come yet is past start-up once
/// the trainer consumed a batch it holds: its late batches get backups.
#[tokio::test]
async fn a_worker_the_trainer_consumed_from_is_past_start_up_before_it_reports() {
    let (c, _job, session, a) = one_consumer_one_worker();
    let b = c.register_worker("http://b".into(), "n".into(), 4, 0);
    assert_eq!(seqs(&tasks(&c, a, Vec::new()).await, 0), vec![0, 1, 2, 3]);
    tasks(&c, b, Vec::new()).await;
    c.late(session, 1);
    assert!(tasks(&c, b, Vec::new()).await.is_empty(), "nothing known delivered: starting up");
    c.session_heartbeat(session, 1, 0); // the trainer consumed 0, which a holds
    c.late(session, 1);
    assert_eq!(seqs(&tasks(&c, b, Vec::new()).await, 0)[..3], [1, 2, 3], "b copies a's late batches");
}

/// Backups that keep losing (every worker slow alike: each original
/// arrives before its copy) stop: past a grace, no new backup while wasted
/// batches outnumber won ones two to one.
#[tokio::test]
async fn backups_stop_while_they_mostly_lose() {
    let c = coordinator();
    let (job, _) = c.create_or_attach(spec("", 64_000, 64, 1)).expect("job");
    let (session, _, _) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("session");
    let a = c.register_worker("http://a".into(), "n".into(), 4, 0);
    let b = c.register_worker("http://b".into(), "n".into(), 4, 0);
    let delivered = |seqs: &[u64]| delivered(job.job_id, seqs);
    let mut a_held = seqs(&tasks(&c, a, Vec::new()).await, 0);
    let mut b_held = seqs(&tasks(&c, b, Vec::new()).await, 0);
    // a delivered once: it is past start-up, its late batches get backups.
    let first = a_held.remove(0);
    a_held.extend(seqs(&tasks(&c, a, delivered(&[first])).await, 0));
    let mut rounds = 0;
    loop {
        c.late(session, a_held[0]);
        let given = seqs(&tasks(&c, b, Vec::new()).await, 0);
        let (copies, own): (Vec<u64>, Vec<u64>) = given.into_iter().partition(|s| a_held.contains(s));
        b_held.extend(own);
        if copies.is_empty() {
            break;
        }
        // a's originals are reported first: every copy loses.
        let sent = std::mem::take(&mut a_held);
        a_held = seqs(&tasks(&c, a, delivered(&sent)).await, 0);
        let mut from_b = copies;
        from_b.append(&mut b_held);
        b_held = seqs(&tasks(&c, b, delivered(&from_b)).await, 0);
        rounds += 1;
        assert!(rounds < 50, "backups never stopped");
    }
    let progress = c.list_jobs().remove(0).consumers.remove(0);
    assert_eq!(progress.backup_won, 0);
    assert!(progress.backup_wasted > 16, "the grace came first: {} wasted", progress.backup_wasted);
    assert!(progress.backup_wasted <= 16 + 4, "stopped once past it: {} wasted", progress.backup_wasted);
}

/// A late batch its worker reported delivered, on a stream the trainer does
/// not receive (a silent path), is copied too, as a re-send.
#[tokio::test]
async fn a_late_batch_sent_into_a_silent_stream_is_copied_as_a_resend() {
    let (c, job, session, a) = one_consumer_one_worker();
    assert_eq!(seqs(&tasks(&c, a, Vec::new()).await, 0), vec![0, 1, 2, 3]);
    let delivered = |seqs: &[u64]| delivered(job.job_id, seqs);
    tasks(&c, a, delivered(&[0, 1])).await; // sent, never received
    let b = c.register_worker("http://b".into(), "n".into(), 4, 0);
    c.late(session, 0);
    assert_eq!(seqs(&tasks(&c, b, Vec::new()).await, 0)[..4], [0, 1, 2, 3]);
    tasks(&c, b, delivered(&[0, 1, 2, 3])).await;
    tasks(&c, a, delivered(&[2, 3])).await; // too late: counts for nothing
    let progress = c.list_jobs().remove(0).consumers.remove(0);
    // a had taken 4 and 5 too when it reported: the backup copies all six.
    assert_eq!((progress.backup_launched, progress.backup_won, progress.backup_wasted), (6, 4, 0));
    assert_eq!((progress.delivered, progress.resent), (6, 2), "4 distinct batches, 0 and 1 sent twice");
}

/// A backup whose copy nobody took yet ends with its slow worker (cut off,
/// or its lease expired): the batches that worker had sent into a stream
/// that never arrived go back to the queue, not lost with the backup.
#[tokio::test]
async fn a_backups_resends_go_back_when_its_worker_goes_before_a_copy_is_taken() {
    let (c, job, session, a) = one_consumer_one_worker();
    assert_eq!(seqs(&tasks(&c, a, Vec::new()).await, 0), vec![0, 1, 2, 3]);
    let delivered = |seqs: &[u64]| delivered(job.job_id, seqs);
    tasks(&c, a, delivered(&[0, 1, 2, 3])).await; // all sent, none received
    let b = c.register_worker("http://b".into(), "n".into(), 4, 0);
    c.late(session, 0); // a backs up 0..3 as re-sends; b has not taken it
    c.unreachable(session, &[a]);
    let to_b = seqs(&tasks(&c, b, Vec::new()).await, 0);
    assert!(to_b.starts_with(&[0, 1, 2, 3]), "the re-sends come back to b: {to_b:?}");
}

/// A shared stream of `n` batches of one sample, its subscribers opened.
fn shared(c: &Coordinator, name: &str, n: u64, max_lag: u32, subscribers: usize) -> (pb::Job, Vec<(u64, u32)>) {
    let mut s = spec(name, n, 1, 1);
    s.shared = Some(pb::SharedStream { max_lag });
    let (job, _) = c.create_or_attach(s).expect("job");
    let subs = (0..subscribers)
        .map(|_| {
            let (session, _, stream) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("session");
            (session, stream)
        })
        .collect();
    (job, subs)
}

/// The seqs `tasks` deliver to `consumer`, as their consumer or a copy.
fn received(tasks: &[pb::Task], consumer: u32) -> Vec<u64> {
    let mut seqs: Vec<u64> = tasks
        .iter()
        .filter(|t| t.consumer == consumer || t.copies.iter().any(|c| c.consumer == consumer))
        .flat_map(|t| t.start_seq..t.end_seq)
        .collect();
    seqs.sort_unstable();
    seqs
}

fn progress(c: &Coordinator, job_id: u64) -> Vec<pb::ConsumerProgress> {
    c.list_jobs().into_iter().find(|j| j.job.as_ref().map(|j| j.job_id) == Some(job_id)).expect("job").consumers
}

#[tokio::test]
async fn subscribers_of_a_shared_stream_take_each_range_together() {
    let c = coordinator();
    let (job, subs) = shared(&c, "sweep", 16, 0, 3);
    let streams: Vec<u32> = subs.iter().map(|s| s.1).collect();
    assert_eq!(streams, vec![1, 2, 3], "each trainer gets a subscriber of its own, past the ranks");
    let w = c.register_worker("http://w".into(), "n".into(), 4, 0);
    let t = tasks(&c, w, Vec::new()).await;
    // Ranges of 2, each for one subscriber with the other two as copies
    // (up to twice the window of 4: what a subscriber's ring holds);
    // nothing for one alone.
    for &s in &streams {
        assert_eq!(received(&t, s), (0..8).collect::<Vec<u64>>(), "subscriber {s}: {t:?}");
    }
    for task in &t {
        assert_eq!((task.rank, task.copies.len()), (Some(0), 2), "{task:?}");
    }
    // Each reports its own deliveries.
    let report: Vec<pb::Delivered> =
        streams.iter().map(|&s| pb::Delivered { job_id: job.job_id, consumer: s, seqs: vec![0, 1, 2, 3] }).collect();
    let t = tasks(&c, w, report).await;
    assert_eq!(received(&t, 3), vec![8, 9, 10, 11]);
    let p = progress(&c, job.job_id);
    assert_eq!(p.len(), 4, "the rank and three subscribers");
    assert_eq!(p[0].subscribes_to, None);
    for s in &p[1..] {
        assert_eq!((s.subscribes_to, s.delivered, s.assigned, s.assigned_alone), (Some(0), 4, 12, 0), "{s:?}");
    }
}

#[tokio::test]
async fn a_subscriber_past_the_lag_or_late_gets_its_batches_alone() {
    let c = coordinator();
    let (job, subs) = shared(&c, "lag", 40, 4, 2);
    let w = c.register_worker("http://w".into(), "n".into(), 4, 0);
    let first = tasks(&c, w, Vec::new()).await;
    assert!(!first.is_empty() && first.iter().all(|t| t.copies.len() == 1), "in step: all shared: {first:?}");
    let had = received(&first, 1);
    assert_eq!(had, received(&first, 2));
    // The first subscriber consumes what it had; the second none: it
    // trails by more than 4 and is left out.
    let report = vec![pb::Delivered { job_id: job.job_id, consumer: 1, seqs: had.clone() }];
    c.session_heartbeat(subs[0].0, had.len() as u64, 0);
    let t = tasks(&c, w, report).await;
    assert!(!t.is_empty() && t.iter().all(|t| t.copies.is_empty()), "{t:?}");
    assert!(received(&t, 1).iter().all(|s| *s >= had.len() as u64), "{t:?}");
    // A third one subscribes late: its first batches are made for it
    // alone, from its start.
    let (_, late, stream) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("late");
    assert_eq!((late.job_id, stream), (job.job_id, 3));
    let t = tasks(&c, w, Vec::new()).await;
    let first_of_late = t.iter().find(|t| t.consumer == 3 && t.start_seq == 0).expect("its first batches");
    assert!(first_of_late.copies.is_empty(), "{first_of_late:?}");
    let p = progress(&c, job.job_id);
    // Nobody needed the late one's first batches later when they were
    // made (it was not there, and the others were two): nothing kept
    // them. The first one's ranges past the lag were kept for the second,
    // which still has them to hand out: not made for it alone.
    assert!(p[3].assigned_alone > 0, "{p:?}");
    assert_eq!(p[1].assigned_alone, 0, "{p:?}");
}

/// A subscriber far behind the others gets no copies (they would fill its
/// ring ahead of what it reads next); its ranges go to the worker that
/// made them for the others and keeps them, and to any worker once that
/// one is gone or the record is stale.
#[tokio::test(start_paused = true)]
async fn a_trailing_subscriber_is_sent_to_the_worker_that_kept_its_batches() {
    let c = coordinator();
    let (job, subs) = shared(&c, "kept", 64, 0, 1);
    let a = subs[0].1;
    let w1 = c.register_worker("http://w1".into(), "n".into(), 4, 0);
    let made = received(&tasks(&c, w1, Vec::new()).await, a);
    assert_eq!(made, (0..8).collect::<Vec<u64>>());
    c.session_heartbeat(subs[0].0, 8, 0);
    let report = vec![pb::Delivered { job_id: job.job_id, consumer: a, seqs: made }];
    assert_eq!(received(&tasks(&c, w1, report).await, a), (8..16).collect::<Vec<u64>>());
    // B subscribes from the start, 8 batches behind A's watermark.
    let (_, _, b) = c.open_session(job.job_id, 0, None, "n".into(), String::new(), None).expect("late");
    let w2 = c.register_worker("http://w2".into(), "n".into(), 4, 0);
    let t = tasks(&c, w2, Vec::new()).await;
    assert_eq!(received(&t, a), (16..24).collect::<Vec<u64>>(), "{t:?}");
    assert!(received(&t, b).is_empty(), "B's first batches are w1's to send, and A's new ones too far ahead: {t:?}");
    let t = tasks(&c, w1, Vec::new()).await;
    assert_eq!(received(&t, b), (0..8).collect::<Vec<u64>>(), "{t:?}");
    assert!(t.iter().all(|t| t.consumer == b && t.copies.is_empty() && t.end_seq <= 16), "{t:?}");
    // B's next ones are w1's too (8..16), and w2's after them (16..24)...
    let report = vec![pb::Delivered { job_id: job.job_id, consumer: b, seqs: (0..8).collect() }];
    c.session_heartbeat(subs[0].0, 16, 0);
    assert!(received(&tasks(&c, w2, Vec::new()).await, b).is_empty());
    assert_eq!(received(&tasks(&c, w1, report).await, b), (8..16).collect::<Vec<u64>>());
    // ...unless w2 is gone, or what it made is stale.
    tokio::time::advance(crate::kept_ranges::KEPT_FOR + Duration::from_secs(1)).await;
    let report = vec![pb::Delivered { job_id: job.job_id, consumer: b, seqs: (8..16).collect() }];
    assert_eq!(received(&tasks(&c, w1, report).await, b), (16..24).collect::<Vec<u64>>(), "stale: anyone makes it");
    c.deregister(w1).expect("w1 leaves");
    // What w1 delivered to B unacknowledged, and held, is w2's to make.
    let t = tasks(&c, w2, Vec::new()).await;
    assert_eq!(received(&t, b).first(), Some(&0), "{t:?}");
}

#[tokio::test]
async fn a_subscriber_that_leaves_is_not_waited_for_and_can_come_back_to_its_place() {
    let c = coordinator();
    let (job, subs) = shared(&c, "leave", 4, 0, 2);
    let w = c.register_worker("http://w".into(), "n".into(), 4, 0);
    tasks(&c, w, Vec::new()).await;
    c.close_session(subs[1].0, 0);
    let p = progress(&c, job.job_id);
    assert!(p[2].left && !p[1].left);
    // The one still there finishes the job.
    let report = vec![pb::Delivered { job_id: job.job_id, consumer: 1, seqs: vec![0, 1, 2, 3] }];
    tasks(&c, w, report).await;
    c.session_heartbeat(subs[0].0, 4, 0);
    assert!(c.lock().jobs.get(job.job_id).expect("job").finished());
    // Reopening names the subscriber it had, for the same rank only.
    let (_, _, stream) = c.open_session(job.job_id, 0, Some(2), "n".into(), String::new(), Some(1)).expect("back");
    assert_eq!(stream, 2);
    assert!(!progress(&c, job.job_id)[2].left);
    assert!(!c.lock().jobs.get(job.job_id).expect("job").finished(), "it is waited for again");
    let err = c.open_session(job.job_id, 0, Some(0), "n".into(), String::new(), None).expect_err("a rank");
    assert!(matches!(err, CoordinatorError::BadSubscriber { subscriber: 0, .. }), "{err}");
    // A coordinator that forgot it (a restart) makes it where it was.
    let (_, _, stream) = c.open_session(job.job_id, 0, Some(9), "n".into(), String::new(), Some(2)).expect("gap");
    assert_eq!(stream, 9);
    assert!(progress(&c, job.job_id)[4..9].iter().all(|s| s.left));
}
