//! The worker side of the ring against a trainer played by the test: a Unix
//! listener and a memfd that follow the protocol (or break it on purpose).

use std::fs::File;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use loader_proto::PROTOCOL_VERSION;
use loader_proto::batch::BatchView;
use loader_proto::pb::{
    DatasetSpec, Dtype, Job, JobSpec, RingAttach, RingHello, RingToTrainer, RingToWorker, SlotFilled, SlotGrant, SlotReclaim,
    SyntheticSpec, Task, dataset_spec::Kind, ring_to_trainer, ring_to_worker,
};
use loader_ring::frame::{decode, encode};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use tokio::runtime::Runtime;

use loader_ring::worker::Rings;
use crate::dataset::synthetic::expected_data;
use crate::outbox::Outboxes;
use crate::producer::Producer;
use crate::producer::tests::settle;

/// Every wait in these tests is bounded by this.
const LIMIT: Duration = Duration::from_secs(20);
/// How long "nothing more arrives" is watched.
const QUIET: Duration = Duration::from_millis(300);
/// Samples of one synthetic sample's `data` row: a batch of 4 is 288 bytes.
const ROW: u64 = 16;
const WORKER_ID: u64 = 7;
const ADDRESS: &str = "http://worker.test:1";

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// A producer whose ring connections run on `rt`.
fn producer(rt: &Runtime, outboxes: &Arc<Outboxes>) -> Producer {
    // Logs show with --nocapture.
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let rings = Rings::new(outboxes.clone(), ADDRESS.into(), rt.handle().clone());
    rings.set_worker_id(WORKER_ID);
    Producer::spawn(Arc::clone(outboxes), rings, crate::window::Windows::new(8), 1 << 30, crate::dataset::Datasets::new(), None).expect("spawn")
}

/// Job `job_id`: one consumer, 40 synthetic samples of `ROW` bytes, batches
/// of 4, so seqs 0..10.
fn job(job_id: u64) -> Job {
    Job {
        job_id,
        spec: Some(JobSpec {
            dataset: Some(DatasetSpec {
                kind: Some(Kind::Synthetic(SyntheticSpec {
                    num_samples: 40,
                    shape: vec![ROW],
                    dtype: Dtype::U8 as i32,
                    cost_ns: 0,
                    wait_ns_by_epoch: Vec::new(),
                })),
            }),
            batch_size: 4,
            epochs: 1,
            consumers: 1,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn task(job_id: u64, seqs: std::ops::Range<u64>, socket: &str) -> Task {
    Task { job: Some(job(job_id)), consumer: 0, start_seq: seqs.start, end_seq: seqs.end, ring_socket: socket.into(), ..Default::default() }
}

fn memfd(name: &str, len: u64) -> File {
    let file = File::from(memfd_create(name, MFdFlags::MFD_CLOEXEC).expect("memfd"));
    file.set_len(len).expect("size");
    file
}

fn maps_name(name: &str) -> bool {
    std::fs::read_to_string("/proc/self/maps").expect("maps").contains(name)
}

/// Waits (bounded) for `cond`.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The trainer's listening socket.
struct Trainer {
    listener: UnixListener,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Trainer {
    fn listen() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ring.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        Self { listener, path, _dir: dir }
    }

    fn socket(&self) -> &str {
        self.path.to_str().expect("utf-8 path")
    }

    /// Accepts the worker's connection and reads its hello.
    fn accept(&self) -> (Peer, RingHello) {
        let deadline = Instant::now() + LIMIT;
        let stream = loop {
            match self.listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("no connection from the worker: {e}"),
            }
        };
        stream.set_nonblocking(false).expect("blocking");
        let mut peer = Peer { stream, buf: BytesMut::new() };
        let hello = match peer.recv(LIMIT) {
            Got::Msg(RingToTrainer { msg: Some(ring_to_trainer::Msg::Hello(h)) }) => h,
            other => panic!("expected a hello, got {other:?}"),
        };
        (peer, hello)
    }

    /// True when a second connection waits: the worker should share one.
    fn has_pending(&self) -> bool {
        self.listener.accept().is_ok()
    }
}

/// The trainer's end of one connection.
struct Peer {
    stream: UnixStream,
    buf: BytesMut,
}

#[derive(Debug)]
enum Got {
    Msg(RingToTrainer),
    Quiet,
    Eof,
}

impl Peer {
    /// Attaches without a doorbell: the trainer wakes on the socket.
    fn attach(&mut self, slot_size: u64, slot_count: u32, memfd: Option<&File>) {
        self.attach_with(slot_size, slot_count, memfd, None);
    }

    /// Attaches with a doorbell when `bell` (the descriptor sent as its
    /// eventfd) is given.
    fn attach_with(&mut self, slot_size: u64, slot_count: u32, memfd: Option<&File>, bell: Option<BorrowedFd<'_>>) {
        let doorbell = bell.is_some();
        let attach = RingAttach { session_id: 9, job_id: 1, consumer: 0, slot_size, slot_count, doorbell };
        let bytes = encode(&RingToWorker { msg: Some(ring_to_worker::Msg::Attach(attach)) });
        let fds: Vec<_> = memfd.iter().map(|f| f.as_raw_fd()).chain(bell.map(|b| b.as_raw_fd())).collect();
        let cmsgs: Vec<_> = if fds.is_empty() { vec![] } else { vec![ControlMessage::ScmRights(&fds)] };
        let sent = sendmsg::<()>(self.stream.as_raw_fd(), &[IoSlice::new(&bytes)], &cmsgs, MsgFlags::empty(), None)
            .expect("sendmsg");
        assert_eq!(sent, bytes.len());
    }

    fn grant(&mut self, slot: u32, generation: u64) {
        let msg = RingToWorker { msg: Some(ring_to_worker::Msg::Grant(SlotGrant { slot, generation })) };
        self.send_raw(&encode(&msg));
    }

    fn reclaim(&mut self, count: u32) {
        let msg = RingToWorker { msg: Some(ring_to_worker::Msg::Reclaim(SlotReclaim { count })) };
        self.send_raw(&encode(&msg));
    }

    /// The next message: a grant given back, as (slot, generation).
    fn returned(&mut self) -> (u32, u64) {
        match self.recv(LIMIT) {
            Got::Msg(RingToTrainer { msg: Some(ring_to_trainer::Msg::Returned(r)) }) => (r.slot, r.generation),
            other => panic!("expected a returned grant, got {other:?}"),
        }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// The next message, or what happened instead within `wait`.
    fn recv(&mut self, wait: Duration) -> Got {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(msg) = decode::<RingToTrainer>(&mut self.buf).expect("worker sent a bad frame") {
                return Got::Msg(msg);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Got::Quiet;
            }
            self.stream.set_read_timeout(Some(left)).expect("timeout");
            let mut chunk = [0u8; 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Got::Eof,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Got::Quiet,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Got::Eof,
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    fn filled(&mut self) -> SlotFilled {
        match self.recv(LIMIT) {
            Got::Msg(RingToTrainer { msg: Some(ring_to_trainer::Msg::Filled(f)) }) => f,
            other => panic!("expected a filled slot, got {other:?}"),
        }
    }

    fn expect_quiet(&mut self) {
        let got = self.recv(QUIET);
        assert!(matches!(got, Got::Quiet), "expected nothing, got {got:?}");
    }

    fn expect_eof(&mut self) {
        let got = self.recv(LIMIT);
        assert!(matches!(got, Got::Eof), "expected the worker to hang up, got {got:?}");
    }
}

/// Checks that slot `f.slot` of `ring` holds batch `f.seq` of job 1, intact.
fn check_slot(ring: &File, slot_size: u64, f: &SlotFilled) {
    let mut slot = vec![0u8; slot_size as usize];
    ring.read_exact_at(&mut slot, u64::from(f.slot) * slot_size).expect("read slot");
    let view = BatchView::parse(&slot).expect("a batch at the slot's front");
    let h = view.header();
    assert_eq!((h.meta.job_id, h.meta.consumer, h.meta.seq), (1, 0, f.seq));
    assert_eq!(h.total_len as u64, f.len);
    let plan = loader_job::spec::plan(job(1).spec.as_ref().expect("spec")).expect("plan");
    assert_eq!(h.indices, plan.batch_indices(0, f.seq));
    let data = view.payload_by_name("data").expect("data");
    for (k, &i) in h.indices.iter().enumerate() {
        assert_eq!(&data[k * ROW as usize..(k + 1) * ROW as usize], expected_data(i, ROW as usize).as_slice());
    }
}

/// Seqs reported delivered for job `job_id`, waiting (bounded) for `n`.
fn delivered(outboxes: &Outboxes, job_id: u64, n: usize) -> Vec<u64> {
    let mut seqs = Vec::new();
    eventually("delivery reports", || {
        for d in outboxes.take_delivered() {
            assert_eq!((d.job_id, d.consumer), (job_id, 0));
            seqs.extend(d.seqs);
        }
        seqs.len() >= n
    });
    seqs
}

/// Takes `n` batches of job `job_id` from the gRPC outbox.
fn from_outbox(rt: &Runtime, outboxes: &Arc<Outboxes>, job_id: u64, n: usize) -> Vec<bytes::Bytes> {
    let attachment = outboxes.attach((job_id, 0), 1, 100);
    rt.block_on(async {
        let mut got = Vec::new();
        for _ in 0..n {
            let batch = tokio::time::timeout(LIMIT, attachment.next()).await.expect("a gRPC batch in time");
            got.push(batch.expect("stream open").data);
        }
        got
    })
}

/// Reads one `Filled` per batch of `seqs` (which must come in that order),
/// checks each slot's bytes, and returns the `(slot, generation)`s they
/// went into, sorted.
fn fill_grants<const N: usize>(peer: &mut Peer, ring: &File, seqs: [u64; N]) -> [(u32, u64); N] {
    let mut slots = [(0, 0); N];
    for (want, got) in seqs.into_iter().zip(&mut slots) {
        let f = peer.filled();
        assert_eq!(f.seq, want);
        check_slot(ring, 4096, &f);
        *got = (f.slot, f.generation);
    }
    slots.sort_unstable();
    slots
}

#[test]
fn batches_go_only_into_granted_slots() {
    let rt = runtime();
    let outboxes = Outboxes::new();
    let p = producer(&rt, &outboxes);
    let trainer = Trainer::listen();
    let ring = memfd("loader-ring-grants", 4 * 4096);
    // Two tasks naming one socket share one connection.
    p.submit(task(1, 0..3, trainer.socket()));
    p.submit(task(1, 3..5, trainer.socket()));
    let (mut peer, hello) = trainer.accept();
    assert_eq!(hello, RingHello { protocol_version: PROTOCOL_VERSION, worker_id: WORKER_ID, address: ADDRESS.into() });
    peer.attach(4096, 4, Some(&ring));

    peer.grant(0, 0);
    peer.grant(1, 0);
    // Batches in order; which grant each one takes depends on when the
    // grants arrive (the latest present is taken first).
    assert_eq!(fill_grants(&mut peer, &ring, [0, 1]), [(0, 0), (1, 0)]);
    // Five batches queued, two grants: nothing else is written or reported.
    peer.expect_quiet();
    assert_eq!(delivered(&outboxes, 1, 2), vec![0, 1]);

    peer.grant(2, 0);
    peer.grant(0, 1);
    peer.grant(3, 0);
    assert_eq!(fill_grants(&mut peer, &ring, [2, 3, 4]), [(0, 1), (2, 0), (3, 0)]);
    assert_eq!(delivered(&outboxes, 1, 3), vec![2, 3, 4]);
    settle(&p);
    assert!(outboxes.is_empty(), "nothing went over gRPC");
    assert!(!trainer.has_pending(), "one connection per socket");
    p.stop();
}

#[test]
fn batches_larger_than_a_slot_go_over_grpc_whole() {
    let rt = runtime();
    let outboxes = Outboxes::new();
    let p = producer(&rt, &outboxes);
    let trainer = Trainer::listen();
    // Batches of 4 samples are 288 bytes; slots of 256 cannot hold them.
    let ring = memfd("loader-ring-small", 2 * 256);
    p.submit(task(1, 0..3, trainer.socket()));
    let (mut peer, _) = trainer.accept();
    peer.attach(256, 2, Some(&ring));
    peer.grant(0, 0);
    peer.grant(1, 0);
    for (seq, batch) in from_outbox(&rt, &outboxes, 1, 3).into_iter().enumerate() {
        let view = BatchView::parse(&batch).expect("parse");
        assert_eq!(view.header().meta.seq, seq as u64);
        assert_eq!(view.header().total_len, 288);
        assert_eq!(batch.len(), 288, "never truncated");
    }
    peer.expect_quiet();
    settle(&p);
    p.stop();
}

#[test]
fn a_trainer_that_leaves_takes_its_mapping_and_batches_with_it() {
    let rt = runtime();
    let outboxes = Outboxes::new();
    let p = producer(&rt, &outboxes);
    let trainer = Trainer::listen();
    let name = "loader-ring-leaves";
    let ring = memfd(name, 2 * 4096);
    p.submit(task(1, 0..5, trainer.socket()));
    let (mut peer, _) = trainer.accept();
    peer.attach(4096, 2, Some(&ring));
    peer.grant(0, 0);
    check_slot(&ring, 4096, &peer.filled());
    eventually("the worker's mapping", || maps_name(name));

    // The trainer is killed: its socket and memfd go away.
    drop(peer);
    drop(ring);
    eventually("the mapping to be dropped", || !maps_name(name));
    settle(&p);
    assert!(outboxes.is_empty(), "the rest of the trainer's task is dropped, not sent over gRPC");
    assert_eq!(delivered(&outboxes, 1, 1), vec![0]);

    // The worker goes on serving other jobs.
    p.submit(task(2, 0..2, ""));
    assert_eq!(from_outbox(&rt, &outboxes, 2, 2).len(), 2);
    p.stop();
}

#[test]
fn protocol_violations_close_the_connection() {
    let rt = runtime();
    let outboxes = Outboxes::new();
    let p = producer(&rt, &outboxes);
    let frame_too_large = u32::MAX.to_le_bytes().to_vec();
    let empty = encode(&RingToWorker { msg: None });
    let grant = |slot, generation| {
        encode(&RingToWorker { msg: Some(ring_to_worker::Msg::Grant(SlotGrant { slot, generation })) })
    };
    let attach_again = encode(&RingToWorker { msg: Some(ring_to_worker::Msg::Attach(RingAttach::default())) });
    let cases: [(&str, Vec<u8>); 5] = [
        ("frame too large", frame_too_large),
        ("empty message", empty),
        ("slot outside the ring", grant(2, 0)),
        ("slot granted twice", [grant(1, 3), grant(1, 4)].concat()),
        ("second attach", attach_again),
    ];
    for (what, bytes) in cases {
        let trainer = Trainer::listen();
        let ring = memfd("loader-ring-violations", 2 * 4096);
        p.submit(task(1, 0..2, trainer.socket()));
        let (mut peer, _) = trainer.accept();
        peer.attach(4096, 2, Some(&ring));
        peer.send_raw(&bytes);
        match peer.recv(LIMIT) {
            Got::Eof => {}
            // A grant before the bad one may be used first.
            Got::Msg(RingToTrainer { msg: Some(ring_to_trainer::Msg::Filled(_)) }) => peer.expect_eof(),
            other => panic!("{what}: expected the worker to hang up, got {other:?}"),
        }
        // The connection task ended cleanly (a panic would leave the
        // producer waiting on a connection that never ends).
        settle(&p);
    }
    p.submit(task(2, 0..1, ""));
    assert_eq!(from_outbox(&rt, &outboxes, 2, 1).len(), 1, "the worker still produces");
    p.stop();
}

#[test]
fn an_unusable_ring_falls_back_to_grpc() {
    let rt = runtime();
    let outboxes = Outboxes::new();
    let p = producer(&rt, &outboxes);
    let eventfd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK).expect("eventfd");
    let (pipe_read, _pipe_write) = nix::unistd::pipe().expect("pipe");
    let cases: [(&str, Option<File>, u64, Option<BorrowedFd<'_>>); 5] = [
        ("no memfd", None, 4096, None),
        ("memfd too small", Some(memfd("loader-ring-short", 4096)), 4096, None),
        ("slots not 64-byte multiples", Some(memfd("loader-ring-odd", 2 * 4096)), 1000, None),
        ("no room for the doorbell", Some(memfd("loader-ring-nobell", 2 * 4096)), 4096, Some(eventfd.as_fd())),
        ("a doorbell that is no eventfd", Some(memfd("loader-ring-pipe", 3 * 4096)), 4096, Some(pipe_read.as_fd())),
    ];
    for (job_id, (what, ring, slot_size, bell)) in (10..).zip(cases) {
        let trainer = Trainer::listen();
        p.submit(task(job_id, 0..2, trainer.socket()));
        let (mut peer, _) = trainer.accept();
        peer.attach_with(slot_size, 2, ring.as_ref(), bell);
        match peer.recv(LIMIT) {
            Got::Eof => {}
            other => panic!("{what}: expected the worker to hang up, got {other:?}"),
        }
        assert_eq!(from_outbox(&rt, &outboxes, job_id, 2).len(), 2, "{what}: batches over gRPC");
        settle(&p);
    }
    p.stop();
}

/// The doorbell page of a ring of `slots` slots of 4096 bytes: the count of
/// reports, and the count the trainer wants to be woken at.
fn doorbell_words(ring: &File, slots: u64) -> (u64, u64) {
    let mut words = [0u8; 72];
    ring.read_exact_at(&mut words, slots * 4096).expect("read doorbell");
    let word = |at: usize| u64::from_ne_bytes(words[at..at + 8].try_into().expect("8 bytes"));
    (word(0), word(64))
}

#[test]
fn the_doorbell_rings_once_at_the_count_the_trainer_asked_for() {
    let rt = runtime();
    let outboxes = Outboxes::new();
    let p = producer(&rt, &outboxes);
    let trainer = Trainer::listen();
    let ring = memfd("loader-ring-bell", 4 * 4096 + 4096);
    let eventfd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK).expect("eventfd");
    // The trainer sleeps until two reports are in.
    ring.write_all_at(&2u64.to_ne_bytes(), 4 * 4096 + 64).expect("arm");
    p.submit(task(1, 0..3, trainer.socket()));
    let (mut peer, _) = trainer.accept();
    peer.attach_with(4096, 4, Some(&ring), Some(eventfd.as_fd()));
    peer.grant(0, 0);
    let f = peer.filled();
    check_slot(&ring, 4096, &f);
    eventually("the first report counted", || doorbell_words(&ring, 4).0 == 1);
    assert!(eventfd.read().is_err(), "one report of two: no ring");
    peer.grant(1, 0);
    peer.grant(2, 0);
    for seq in [1, 2] {
        assert_eq!(peer.filled().seq, seq);
    }
    eventually("three reports counted", || doorbell_words(&ring, 4).0 == 3);
    assert_eq!(eventfd.read().expect("rung"), 1, "rung once, at the second report");
    assert_eq!(doorbell_words(&ring, 4).1, u64::MAX, "the ringer disarmed it");
    assert_eq!(delivered(&outboxes, 1, 3), vec![0, 1, 2]);
    p.stop();
}

#[test]
fn clear_and_stop_end_a_wait_for_grants() {
    let rt = runtime();
    let outboxes = Outboxes::new();
    let p = producer(&rt, &outboxes);
    let trainer = Trainer::listen();
    let ring = memfd("loader-ring-clear", 2 * 4096);
    p.submit(task(1, 0..3, trainer.socket()));
    let (mut peer, _) = trainer.accept();
    peer.attach(4096, 2, Some(&ring));
    peer.expect_quiet();
    assert!(!p.is_idle(), "waiting for a grant");
    p.clear();
    settle(&p);
    // A grant after the task was abandoned is kept for later tasks, unused.
    peer.grant(0, 0);
    peer.expect_quiet();

    p.submit(task(1, 3..6, trainer.socket()));
    let f = peer.filled();
    assert_eq!((f.slot, f.seq), (0, 3));
    p.stop();
    settle(&p);
    peer.grant(1, 0);
    peer.expect_quiet();
}

#[test]
fn a_reclaim_returns_grants_no_batch_took_up_to_the_count() {
    let rt = runtime();
    let outboxes = Outboxes::new();
    let p = producer(&rt, &outboxes);
    let trainer = Trainer::listen();
    let ring = memfd("loader-ring-reclaim", 4 * 4096);
    p.submit(task(1, 0..1, trainer.socket()));
    let (mut peer, _) = trainer.accept();
    peer.attach(4096, 4, Some(&ring));
    for slot in 0..4 {
        peer.grant(slot, 0);
    }
    let f = peer.filled();
    assert_eq!(f.seq, 0);
    // Idle now, holding the other three grants (the batch took the latest
    // that had arrived): the oldest go back first, the ones a batch would
    // take last.
    let unused: Vec<u32> = (0..4).filter(|&s| s != f.slot).collect();
    peer.reclaim(2);
    let mut back = [peer.returned(), peer.returned()];
    back.sort_unstable();
    assert_eq!(back, [(unused[0], 0), (unused[1], 0)]);
    peer.expect_quiet();
    peer.reclaim(5);
    assert_eq!(peer.returned(), (unused[2], 0));
    peer.expect_quiet();
    // A slot given back can be granted again and used.
    p.submit(task(1, 1..2, trainer.socket()));
    peer.grant(2, 1);
    let f = peer.filled();
    assert_eq!((f.slot, f.generation, f.seq), (2, 1, 1));
    check_slot(&ring, 4096, &f);
    p.stop();
}

/// A shared stream's batch for one subscriber (a trailing one served from
/// kept batches, or one nobody else takes the range with) waits for its
/// ring's slots like any batch: nobody else is held up, and gRPC would cost
/// both ends more CPU. (With copies, a subscriber whose ring is full gets
/// its copy over gRPC after a short wait, so that it holds up no other.)
#[test]
fn a_shared_batch_for_one_subscriber_waits_for_its_ring() {
    let rt = runtime();
    let outboxes = Outboxes::new();
    let p = producer(&rt, &outboxes);
    let trainer = Trainer::listen();
    let ring = memfd("loader-ring-one-subscriber", 4 * 4096);
    p.submit(Task { rank: Some(0), keep: true, ..task(1, 0..3, trainer.socket()) });
    let (mut peer, _) = trainer.accept();
    peer.attach(4096, 4, Some(&ring));
    peer.grant(0, 0);
    assert_eq!(fill_grants(&mut peer, &ring, [0]), [(0, 0)]);
    // Far longer than a copy waits for a slot: batch 1 waits for one.
    peer.expect_quiet();
    assert!(outboxes.is_empty(), "a batch went over gRPC while its ring was full");
    peer.grant(1, 0);
    peer.grant(2, 0);
    assert_eq!(fill_grants(&mut peer, &ring, [1, 2]), [(1, 0), (2, 0)]);
    assert_eq!(delivered(&outboxes, 1, 3), vec![0, 1, 2]);
    settle(&p);
    assert!(outboxes.is_empty(), "nothing went over gRPC");
    p.stop();
}
