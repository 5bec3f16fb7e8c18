//! The shared-memory ring against real worker processes and against a test
//! peer that lies: one memfd and nothing in /dev/shm, zero-copy views into
//! the ring, slots that come back when batches are dropped, and a lying
//! header that ends the iterator with an error naming the worker.
//!
//! The tests of this file run one at a time: they count the process's ring
//! descriptors, which another test's loader would add to.
#![cfg(feature = "embedded")]

mod common;

use std::fs::File;
use std::io::{IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use loader_client::{Dtype, Loader, RingSlots, Transport, spec};
use loader_proto::PROTOCOL_VERSION;
use loader_proto::batch::{BatchLayout, BatchMeta, TensorDesc};
use loader_ring::doorbell::DOORBELL_LEN;
use loader_proto::pb::{
    RingAttach, RingHello, RingToTrainer, RingToWorker, SlotFilled, SlotGrant, ring_to_trainer,
    ring_to_worker,
};
use loader_ring::frame::{decode, encode};
use loader_server::ServerConfig;
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};

use common::{Coordinator, bounded, dev_shm, ring_mappings, ring_memfds, worker_command};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn a_local_run_uses_one_memfd_views_into_it_and_leaves_nothing_in_dev_shm() {
    let _serial = serial();
    bounded(Duration::from_secs(90), || {
        let before = dev_shm();
        let job = spec::synthetic(2048, &[3, 16, 16], Dtype::U8)
            .batch_size(16)
            .shuffle(3)
            .build()
            .expect("spec");
        let mut loader = Loader::local_builder(job, 2)
            .worker_command(worker_command())
            .build()
            .expect("local");
        let socket = loader
            .ring_socket()
            .expect("a ring by default")
            .to_path_buf();
        assert!(listening(&socket), "the ring's socket is bound");
        assert!(
            socket.as_os_str().as_encoded_bytes().starts_with(b"\0"),
            "by default a name in the abstract namespace: no file to leave behind"
        );
        let total = loader.total_batches();
        let (mut seqs, mut shm, mut held) = (Vec::new(), 0u64, Vec::new());
        for batch in &mut loader {
            let batch = batch.expect("batch");
            seqs.push(batch.seq());
            let labels: Vec<i64> = batch
                .tensor("label")
                .expect("label")
                .to_vec()
                .expect("int64");
            assert_eq!(
                labels.iter().map(|&l| l as u64).collect::<Vec<_>>(),
                batch.indices()
            );
            if batch.transport() == Transport::SharedMemory {
                shm += 1;
                let at = batch.bytes().as_ptr() as usize;
                let maps = ring_mappings();
                assert!(
                    maps.iter()
                        .any(|r| r.contains(&at) && at + batch.bytes().len() <= r.end),
                    "a shared-memory batch at {at:#x} is not a view into the ring {maps:x?}"
                );
            }
            assert_eq!(
                ring_memfds(),
                1,
                "exactly one memfd for the ring, whatever the batch count"
            );
            assert!(dev_shm().is_subset(&before.union(&other_processes_shm()).cloned().collect()));
            // Hold a few for a while: views outlive their turn in the loop.
            if held.len() < 3 {
                held.push(batch);
            }
        }
        assert_eq!(seqs, (0..total).collect::<Vec<_>>());
        // Batches assigned before the session opened travel over gRPC; every
        // later one through the ring.
        assert!(
            shm * 2 >= total,
            "only {shm} of {total} batches came through the ring"
        );
        drop(loader);
        assert!(!listening(&socket), "the socket is gone with the loader");
        // The mapping outlives the loader while views are held.
        for b in &held {
            let labels: Vec<i64> = b.tensor("label").expect("label").to_vec().expect("int64");
            assert_eq!(labels.len(), b.len());
        }
        drop(held);
        assert_eq!(ring_memfds(), 0, "the memfd goes with the last view");
        assert!(ring_mappings().is_empty());
        let new: Vec<_> = dev_shm().difference(&before).cloned().collect();
        assert!(
            new.iter()
                .all(|n| !n.contains("loader") && !n.contains("ring")),
            "{new:?}"
        );
    });
}

/// Names another process may have created in /dev/shm meanwhile: tolerated
/// only when they are not ours.
fn other_processes_shm() -> std::collections::BTreeSet<String> {
    dev_shm()
        .into_iter()
        .filter(|n| !n.contains("loader") && !n.contains("ring"))
        .collect()
}

#[test]
fn a_slot_comes_back_when_its_last_batch_is_dropped() {
    let _serial = serial();
    bounded(Duration::from_secs(90), || {
        let job = spec::synthetic(400, &[64], Dtype::U8)
            .batch_size(8)
            .build()
            .expect("spec");
        let mut loader = Loader::local_builder(job, 1)
            .worker_command(worker_command())
            .prefetch(1)
            .ring(2, 64 << 10)
            .build()
            .expect("local");
        // The first batches may have been assigned before the session
        // offered its ring; after the first ring batch, all are.
        let mut held = Vec::new();
        for batch in &mut loader {
            let batch = batch.expect("batch");
            if batch.transport() == Transport::SharedMemory {
                held.push(batch);
                if held.len() == 2 {
                    break;
                }
            }
        }
        assert_eq!(held.len(), 2, "two batches through the ring");
        assert_eq!(
            loader.ring_slots(),
            Some(RingSlots {
                free: 0,
                granted: 0,
                held: 2
            })
        );
        let next_seq = held[1].seq() + 1;
        let (tx, rx) = mpsc::channel();
        let consumer = std::thread::spawn(move || {
            let got = loader.next().map(|b| b.map(|b| (b.seq(), b.transport())));
            let _ = tx.send(got);
            loader
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(500)).is_err(),
            "a batch arrived while both slots were held"
        );
        let clone = held[0].clone();
        drop(held.remove(0));
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a clone of the batch still holds its slot"
        );
        drop(clone);
        let got = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("progress after the drop");
        let (seq, transport) = got.expect("an item").expect("a batch");
        assert_eq!((seq, transport), (next_seq, Transport::SharedMemory));
        let mut loader = consumer.join().expect("consumer thread");
        drop(held);
        let rest: Vec<u64> = loader.by_ref().map(|b| b.expect("batch").seq()).collect();
        assert_eq!(rest, (next_seq + 1..50).collect::<Vec<_>>());
    });
}

const LIAR: &str = "http://liar.test:9";

/// Connects to a ring's socket: a path, or a name in the abstract namespace
/// (a leading NUL byte, as the loader announces it).
fn connect_ring(socket: &Path) -> std::io::Result<UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    match socket.as_os_str().as_encoded_bytes().strip_prefix(b"\0") {
        Some(name) => UnixStream::connect_addr(&std::os::unix::net::SocketAddr::from_abstract_name(name)?),
        None => UnixStream::connect(socket),
    }
}

/// Whether something listens on the ring's socket.
fn listening(socket: &Path) -> bool {
    connect_ring(socket).is_ok()
}

/// A worker played by the test: joins the ring at `socket`.
struct Peer {
    stream: UnixStream,
    buf: BytesMut,
}

impl Peer {
    fn connect(socket: &Path, protocol_version: u32) -> Self {
        let mut stream = connect_ring(socket).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let hello = RingHello {
            protocol_version,
            worker_id: 99,
            address: LIAR.into(),
        };
        stream
            .write_all(&encode(&RingToTrainer {
                msg: Some(ring_to_trainer::Msg::Hello(hello)),
            }))
            .expect("hello");
        Self {
            stream,
            buf: BytesMut::new(),
        }
    }

    /// Reads the attach message and the memfd riding on it (and the
    /// doorbell's eventfd after it, when the trainer offers one, which this
    /// peer never rings: the trainer must not depend on it); None on EOF.
    fn attach(&mut self) -> Option<(RingAttach, File)> {
        let mut fds = Vec::new();
        loop {
            if let Some(msg) = decode::<RingToWorker>(&mut self.buf).expect("frame") {
                let Some(ring_to_worker::Msg::Attach(a)) = msg.msg else {
                    panic!("expected attach, got {msg:?}")
                };
                let expected = if a.doorbell { 2 } else { 1 };
                assert_eq!(
                    fds.len(),
                    expected,
                    "the memfd (and eventfd) with the attach message"
                );
                return Some((a, File::from(fds.remove(0))));
            }
            let mut chunk = [0u8; 1024];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
            let mut iov = [IoSliceMut::new(&mut chunk)];
            let msg = recvmsg::<()>(
                self.stream.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .expect("recvmsg");
            for cmsg in msg.cmsgs().expect("cmsgs") {
                if let ControlMessageOwned::ScmRights(raw) = cmsg {
                    // SAFETY: the kernel just installed these descriptors in
                    // this process for this message; nothing else owns them.
                    fds.extend(
                        raw.into_iter()
                            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                    );
                }
            }
            let n = msg.bytes;
            if n == 0 {
                assert!(fds.is_empty(), "a memfd without an attach message");
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn grant(&mut self) -> SlotGrant {
        loop {
            if let Some(msg) = decode::<RingToWorker>(&mut self.buf).expect("frame") {
                match msg.msg {
                    Some(ring_to_worker::Msg::Grant(g)) => return g,
                    other => panic!("expected a grant, got {other:?}"),
                }
            }
            let mut chunk = [0u8; 1024];
            let n = self.stream.read(&mut chunk).expect("read");
            assert!(n > 0, "the trainer hung up before granting a slot");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn filled(&mut self, f: SlotFilled) {
        let msg = RingToTrainer {
            msg: Some(ring_to_trainer::Msg::Filled(f)),
        };
        self.stream.write_all(&encode(&msg)).expect("filled");
    }
}

/// A loader on an in-process coordinator with no workers: only the test's
/// peer will deliver.
fn lonely_loader(coordinator: &Coordinator) -> Loader {
    let job = spec::synthetic(64, &[16], Dtype::U8)
        .batch_size(4)
        .build()
        .expect("spec");
    Loader::builder(coordinator.url.as_str())
        .job(job)
        .prefetch(2)
        .ring(4, 64 << 10)
        .build()
        .expect("loader")
}

/// Writes a valid batch `seq` of the lonely loader's job (4 samples of 16
/// bytes) into `slot`; returns its length.
fn write_batch(slot: &mut [u8], job_id: u64, seq: u64) -> usize {
    let layout = BatchLayout::new(
        4,
        vec![TensorDesc {
            name: "data".into(),
            dtype: Dtype::U8,
            shape: vec![4, 16],
        }],
    )
    .expect("layout");
    let meta = BatchMeta {
        job_id,
        epoch: 0,
        consumer: 0,
        seq,
    };
    let indices: Vec<u64> = (4 * seq..4 * seq + 4).collect();
    layout.write(&meta, &indices, slot).expect("write");
    layout.total_len()
}

#[test]
fn a_worker_that_leaves_with_batches_outstanding_is_named_in_bounded_time() {
    let _serial = serial();
    bounded(Duration::from_secs(60), || {
        let ttl = Duration::from_millis(500);
        let config = ServerConfig {
            lease_ttl: ttl,
            heartbeat_interval: Duration::from_millis(150),
            ..ServerConfig::default()
        };
        let coordinator = Coordinator::start(config);
        let mut loader = lonely_loader(&coordinator);
        let socket = loader.ring_socket().expect("ring").to_path_buf();
        let job_id = loader.job().job_id;
        let mut peer = Peer::connect(&socket, PROTOCOL_VERSION);
        let (_, memfd) = peer.attach().expect("attached");
        let g = peer.grant();
        // SAFETY: the mapping is private to this test; the trainer only
        // reads the slot after it is reported filled.
        let mut ring = unsafe { memmap2::MmapOptions::new().map_mut(&memfd) }.expect("map");
        let start = g.slot as usize * (64 << 10);
        // Batch 1 arrives; batch 0 never will.
        let len = write_batch(&mut ring[start..start + (64 << 10)], job_id, 1);
        peer.filled(SlotFilled {
            slot: g.slot,
            generation: g.generation,
            len: len as u64,
            seq: 1,
            traceparent: String::new(),
        });
        // The report and the hang-up arrive in order on the one stream
        // socket: the trainer reads batch 1 before it sees the worker leave.
        drop(peer);
        let left = Instant::now();
        let e = loader
            .next()
            .expect("an item")
            .expect_err("the gap never fills");
        let waited = left.elapsed();
        let msg = e.to_string();
        let me = std::process::id();
        assert!(
            msg.starts_with(&format!(
                "worker {LIAR} (pid {me}) disconnected from the shared-memory ring with batches outstanding"
            )),
            "{msg}"
        );
        assert!(
            waited >= 3 * ttl && waited < Duration::from_secs(15),
            "ended {waited:?} after the worker left"
        );
        assert!(loader.next().is_none(), "the iterator ends");
        drop(ring);
    });
}

#[test]
fn a_worker_whose_header_points_past_its_slot_is_named_and_ends_the_iterator() {
    let _serial = serial();
    bounded(Duration::from_secs(60), || {
        let coordinator = Coordinator::start(ServerConfig::default());
        let mut loader = lonely_loader(&coordinator);
        let socket = loader.ring_socket().expect("ring").to_path_buf();
        let job_id = loader.job().job_id;
        let peer = std::thread::spawn(move || {
            let mut peer = Peer::connect(&socket, PROTOCOL_VERSION);
            let (attach, memfd) = peer.attach().expect("attached");
            assert_eq!((attach.job_id, attach.consumer), (job_id, 0));
            assert_eq!((attach.slot_count, attach.slot_size), (4, 64 << 10));
            let doorbell_page = if attach.doorbell { DOORBELL_LEN } else { 0 };
            assert_eq!(
                memfd.metadata().expect("stat").len(),
                4 * (64 << 10) + doorbell_page
            );
            let g = peer.grant();
            // SAFETY: the mapping is private to this test thread; the trainer
            // only reads the slot after it is reported filled.
            let mut ring = unsafe { memmap2::MmapOptions::new().map_mut(&memfd) }.expect("map");
            let start = g.slot as usize * (64 << 10);
            let slot = &mut ring[start..start + (64 << 10)];
            let len = write_batch(slot, job_id, 0);
            // The lie: the payload sits a whole slot further on.
            let table = 64 + 8 * 4;
            slot[table..table + 8].copy_from_slice(&(2u64 * (64 << 10)).to_le_bytes());
            peer.filled(SlotFilled {
                slot: g.slot,
                generation: g.generation,
                len: len as u64,
                seq: 0,
                traceparent: String::new(),
            });
            peer
        });
        let e = loader
            .next()
            .expect("an item")
            .expect_err("a lying header")
            .to_string();
        assert!(e.starts_with(&format!("worker {LIAR}: ")), "{e}");
        assert!(e.contains("lies outside"), "{e}");
        assert!(loader.next().is_none(), "the iterator ends");
        drop(peer.join().expect("peer"));
    });
}

#[test]
fn a_peer_of_another_protocol_version_never_sees_the_memfd() {
    let _serial = serial();
    bounded(Duration::from_secs(60), || {
        let coordinator = Coordinator::start(ServerConfig::default());
        let loader = lonely_loader(&coordinator);
        let socket = loader.ring_socket().expect("ring").to_path_buf();
        let started = Instant::now();
        let mut peer = Peer::connect(&socket, PROTOCOL_VERSION + 1);
        assert!(peer.attach().is_none(), "closed without attaching");
        assert!(started.elapsed() < Duration::from_secs(10));
        // An honest peer still gets in.
        let mut honest = Peer::connect(&socket, PROTOCOL_VERSION);
        let _attached = honest.attach().expect("attached");
        let g = honest.grant();
        assert!(g.slot < 4 && g.generation > 0);
        assert_eq!(
            ring_memfds(),
            2,
            "ours, and the one the honest peer received"
        );
    });
}
