//! The worker's half of the shared-memory ring: batches collated straight
//! into the slots of a co-located trainer's ring.
//!
//! A task whose consumer's trainer runs on this node names the trainer's
//! Unix socket (`Task.ring_socket`). [`Rings`] keeps one connection per
//! socket, shared by every task naming it; the first batch that needs a
//! socket starts its connection. For each batch the producer asks
//! [`Rings::acquire`] where it goes:
//! - into a granted slot ([`Route::Slot`]), the default once attached;
//! - over gRPC ([`Route::Grpc`]) when the ring cannot take it: the trainer
//!   could not be joined (refused, bad attach: retried after a pause), the
//!   batch is larger than a slot, or the ring belongs to another consumer;
//! - nowhere ([`Route::Drop`]) when the trainer went away after the task
//!   arrived: its batches have no taker.
//!
//! # Layout
//! - `handshake`: connect, hello, and the attach message with its memfd.
//! - `conn`: the connection task: grants in, filled/returned reports out.
//! - `bell`: after each filled report, the doorbell that wakes the trainer
//!   only once the reports it waits for are in.
//! - `socket`: the connection's socket, watched by the runtime for reads
//!   only (registering it is the module's one `unsafe` line).
//! - `slots`: the mapping, the book of slots, and leases: the other `unsafe`.
//!
//! The worker lends it a [`DeliveryLog`]: where a batch the trainer took is
//! recorded for the coordinator (the worker's outboxes keep one log for
//! both transports).

mod bell;
mod conn;
pub(crate) mod fuzz;
mod handshake;
mod slots;
mod socket;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use loader_process::telemetry::blocked::{BLOCKED_TICK, BlockedClock};
use loader_proto::pb::{RingAttach, RingHello};
use loader_proto::{ConsumerKey, PROTOCOL_VERSION};
use tokio::runtime::Handle;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::frame::FrameError;

pub use slots::SlotLease;
use slots::{GrantError, MapError, Outgoing, Slots};

/// How long after a failed join batches go over gRPC before the socket is
/// tried again.
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// Why a ring connection could not be made or had to end. One line each.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RingError {
    /// The socket could not be reached.
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    /// Reading or writing the socket failed.
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
    /// A frame could not be read (too large, not a message).
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The trainer hung up before attaching.
    #[error("the trainer closed the socket before attaching")]
    ClosedBeforeAttach,
    /// The trainer did not attach in time.
    #[error("no attach message within {0:?}")]
    HandshakeTimeout(Duration),
    /// The attach message carried no memfd.
    #[error("the attach message carried no memfd")]
    NoMemfd,
    /// The ring described cannot be mapped.
    #[error(transparent)]
    Map(#[from] MapError),
    /// A grant broke the protocol.
    #[error("protocol error: {0}")]
    Grant(#[from] GrantError),
    /// Any other message out of place.
    #[error("protocol error: {0}")]
    Protocol(String),
}

/// Where the worker records that a trainer took a batch (it wrote the
/// slot and reported it filled): the coordinator learns of deliveries from
/// this log, whichever transport carried them.
pub trait DeliveryLog: Send + Sync + std::fmt::Debug {
    /// Batch `seq` of consumer `key` was delivered.
    fn delivered(&self, key: ConsumerKey, seq: u64);
}

/// Where one batch goes.
#[derive(Debug)]
pub enum Route {
    /// Into this slot of the ring.
    Slot(SlotLease),
    /// Over the gRPC outbox.
    Grpc,
    /// Nowhere: the trainer left after the task arrived.
    Drop,
    /// Nowhere: the producer abandoned the task (or the worker stopped).
    Abandoned,
}

/// Every ring connection of this worker.
#[derive(Debug)]
pub struct Rings {
    /// Connections by socket path, under one lock: the producer and the
    /// connection tasks each hold it for a few book-keeping steps.
    state: Mutex<State>,
    /// Wakes the producer when a connection attached, failed or closed, a
    /// grant arrived, or its task was abandoned.
    changed: Condvar,
    /// Where connection tasks run: the producer is a plain thread.
    runtime: Handle,
    /// Where deliveries are recorded for the coordinator.
    deliveries: Arc<dyn DeliveryLog>,
    /// This worker's gRPC URL, for the trainer's messages.
    address: String,
    /// This worker's id at the coordinator (changes when it registers again).
    worker_id: AtomicU64,
    /// Cancelled when the worker stops: every connection ends.
    stop: CancellationToken,
}

#[derive(Debug, Default)]
struct State {
    conns: HashMap<PathBuf, Entry>,
    /// When each socket's last attached connection ended: tasks that arrived
    /// before then belong to the trainer that left.
    last_closed: HashMap<PathBuf, Instant>,
    /// Last connection id handed out.
    next_id: u64,
    /// The worker is stopping: no new connection.
    stopped: bool,
}

#[derive(Debug)]
enum Entry {
    /// Joining; the producer waits.
    Connecting,
    /// Joined: slots can be leased.
    Attached(Conn),
    /// Could not join at this time; gRPC until [`RETRY_AFTER`] passed.
    Failed(Instant),
}

/// An attached ring.
#[derive(Debug)]
struct Conn {
    /// Tells this connection from a later one on the same socket.
    id: u64,
    /// The only consumer whose batches this ring takes.
    key: ConsumerKey,
    /// Who holds which slot.
    slots: Slots,
    /// Where leases report their end, to the connection task.
    outgoing: UnboundedSender<Outgoing>,
    /// A batch larger than a slot was seen (warn once).
    warned_size: bool,
    /// A task of another consumer named this ring (warn once).
    warned_key: bool,
}

/// What `acquire` does next, decided under the lock.
enum Next {
    Connect,
    /// Wait: the ring is joining.
    Wait,
    /// Wait: every slot is filled or held, the trainer is not reading.
    Full,
    Done(Route),
}

impl Rings {
    /// No connection yet; connection tasks will run on `runtime`.
    pub fn new(deliveries: Arc<dyn DeliveryLog>, address: String, runtime: Handle) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            runtime,
            deliveries,
            address,
            worker_id: AtomicU64::new(0),
            stop: CancellationToken::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain book-keeping; stays consistent across a panic elsewhere.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sets the id the next hellos carry.
    pub fn set_worker_id(&self, id: u64) {
        self.worker_id.store(id, Ordering::Relaxed);
    }

    /// Decides where a batch of `len` bytes of `key`, from a task submitted
    /// at `submitted` that names the socket `path`, goes. Blocks the calling
    /// (producer) thread while the ring is joining or has no free grant;
    /// returns as soon as `abandoned()` holds after [`interrupt`](Self::interrupt).
    /// The wait for a free grant is added to `blocked` as it goes.
    pub fn acquire(
        self: &Arc<Self>,
        path: &Path,
        key: ConsumerKey,
        submitted: Instant,
        len: usize,
        abandoned: &dyn Fn() -> bool,
        blocked: &metrics::Gauge,
    ) -> Route {
        self.acquire_until(path, key, submitted, len, abandoned, blocked, None)
    }

    /// As [`acquire`](Self::acquire), but waits (for the ring to join or
    /// for a free grant) only until `deadline`, then answers
    /// [`Route::Grpc`]: for a batch that goes to several trainers, none of
    /// which may hold up the others for long.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire_until(
        self: &Arc<Self>,
        path: &Path,
        key: ConsumerKey,
        submitted: Instant,
        len: usize,
        abandoned: &dyn Fn() -> bool,
        blocked: &metrics::Gauge,
        deadline: Option<Instant>,
    ) -> Route {
        let mut blocked = BlockedClock::new(blocked);
        let mut st = self.lock();
        loop {
            let next = Self::next(&mut st, path, key, submitted, len, abandoned);
            blocked.tick(matches!(next, Next::Full));
            match next {
                Next::Done(route) => return route,
                Next::Wait | Next::Full => {}
                Next::Connect => {
                    st.conns.insert(path.to_owned(), Entry::Connecting);
                    let hello = RingHello {
                        protocol_version: PROTOCOL_VERSION,
                        worker_id: self.worker_id.load(Ordering::Relaxed),
                        address: self.address.clone(),
                    };
                    self.runtime.spawn(conn::run(Arc::clone(self), path.to_owned(), hello));
                }
            }
            let left = match deadline {
                Some(at) => match at.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Route::Grpc,
                },
                None => None,
            };
            st = match (left, blocked.running()) {
                (Some(left), running) => {
                    let tick = if running { left.min(BLOCKED_TICK) } else { left };
                    self.changed.wait_timeout(st, tick).unwrap_or_else(|poisoned| poisoned.into_inner()).0
                }
                // Wakes to count the blocked time as it goes.
                (None, true) => {
                    self.changed.wait_timeout(st, BLOCKED_TICK).unwrap_or_else(|poisoned| poisoned.into_inner()).0
                }
                (None, false) => self.changed.wait(st).unwrap_or_else(|poisoned| poisoned.into_inner()),
            };
        }
    }

    fn next(
        st: &mut State,
        path: &Path,
        key: ConsumerKey,
        submitted: Instant,
        len: usize,
        abandoned: &dyn Fn() -> bool,
    ) -> Next {
        if st.stopped || abandoned() {
            return Next::Done(Route::Abandoned);
        }
        if st.last_closed.get(path).is_some_and(|&at| at >= submitted) {
            return Next::Done(Route::Drop);
        }
        let socket = path.display();
        match st.conns.get_mut(path) {
            None => Next::Connect,
            Some(Entry::Failed(at)) if at.elapsed() >= RETRY_AFTER => Next::Connect,
            Some(Entry::Failed(_)) => Next::Done(Route::Grpc),
            Some(Entry::Connecting) => Next::Wait,
            Some(Entry::Attached(conn)) => {
                if conn.key != key {
                    if !std::mem::replace(&mut conn.warned_key, true) {
                        tracing::warn!(
                            %socket,
                            "the ring belongs to job {} consumer {}, a task of job {} consumer {} names it; \
                             delivering that task over gRPC",
                            conn.key.0, conn.key.1, key.0, key.1
                        );
                    }
                    return Next::Done(Route::Grpc);
                }
                if len as u64 > conn.slots.slot_size() {
                    if !std::mem::replace(&mut conn.warned_size, true) {
                        tracing::warn!(
                            %socket,
                            "a batch of {len} bytes does not fit the ring's slots of {} bytes; delivering such \
                             batches over gRPC (give the trainer larger slots)",
                            conn.slots.slot_size()
                        );
                    }
                    return Next::Done(Route::Grpc);
                }
                match conn.slots.take(&conn.outgoing) {
                    Some(lease) => Next::Done(Route::Slot(lease)),
                    None => Next::Full,
                }
            }
        }
    }

    /// Wakes every waiting `acquire`, so that it sees its task abandoned.
    pub fn interrupt(&self) {
        // Taken so a waiter between its check and its wait is not missed.
        let _st = self.lock();
        self.changed.notify_all();
    }

    /// Ends every connection and refuses new ones: the worker is stopping.
    pub fn close(&self) {
        let mut st = self.lock();
        st.stopped = true;
        self.stop.cancel();
        self.changed.notify_all();
    }

    fn attached(
        &self,
        path: &Path,
        attach: &RingAttach,
        slots: Slots,
        outgoing: UnboundedSender<Outgoing>,
    ) -> Option<u64> {
        let mut st = self.lock();
        if st.stopped {
            return None;
        }
        st.next_id += 1;
        let id = st.next_id;
        let conn = Conn {
            id,
            key: (attach.job_id, attach.consumer),
            slots,
            outgoing,
            warned_size: false,
            warned_key: false,
        };
        st.conns.insert(path.to_owned(), Entry::Attached(conn));
        self.changed.notify_all();
        Some(id)
    }

    fn failed(&self, path: &Path) {
        let mut st = self.lock();
        st.conns.insert(path.to_owned(), Entry::Failed(Instant::now()));
        self.changed.notify_all();
    }

    /// Removes connection `id`, dropping its book (and so, with the last
    /// lease, the mapping).
    fn closed(&self, path: &Path, id: u64) {
        let mut st = self.lock();
        if matches!(st.conns.get(path), Some(Entry::Attached(c)) if c.id == id) {
            st.conns.remove(path);
        }
        st.last_closed.insert(path.to_owned(), Instant::now());
        self.changed.notify_all();
    }

    fn with_conn<T>(&self, id: u64, f: impl FnOnce(&mut Conn) -> T) -> Option<T> {
        let mut st = self.lock();
        let conn = st.conns.values_mut().find_map(|e| match e {
            Entry::Attached(c) if c.id == id => Some(c),
            _ => None,
        })?;
        Some(f(conn))
    }

    fn grant(&self, id: u64, slot: u32, generation: u64) -> Result<(), GrantError> {
        self.with_conn(id, |c| c.slots.grant(slot, generation)).unwrap_or(Ok(()))?;
        self.changed.notify_all();
        Ok(())
    }

    fn settle(&self, id: u64, slot: u32, generation: u64) {
        self.with_conn(id, |c| c.slots.settle(slot, generation));
    }

    fn take_unused_upto(&self, id: u64, count: usize) -> Vec<(u32, u64)> {
        self.with_conn(id, |c| c.slots.take_unused_upto(count)).unwrap_or_default()
    }

    fn take_unused(&self, id: u64) -> Vec<(u32, u64)> {
        self.with_conn(id, |c| c.slots.take_unused()).unwrap_or_default()
    }
}
