//! The trainer's side of the shared-memory transport: a ring of fixed-size
//! slots in one memfd that co-located workers collate batches straight into.
//!
//! The trainer owns the ring. It listens on a Unix socket (a name in the
//! abstract namespace by default, or a path in a private directory under
//! `ring_dir`; announced as `ring_socket` in OpenSession), checks
//! each peer's credentials, answers its hello with the attach message and the
//! memfd (SCM_RIGHTS), and grants it slots. A filled slot becomes a
//! batch (the SDK's type, made by the parse it passes to
//! [`Inbox::read_all`]) whose bytes are a view of the slot
//! (`Bytes::from_owner`), delivered to the consumer like a gRPC frame; the
//! slot is granted again when the last view of the batch is dropped.
//!
//! # Layout
//! - `memory`: the sealed memfd, its read-only mapping, and `SlotView`:
//!   the only `unsafe`.
//! - `book`: slot states (free, granted, held), grants as credits, and the
//!   checks of every worker report.
//! - `peer`: SO_PEERCRED and the policy of who may attach.
//! - `conn`: one worker's connection until it attaches: credentials, hello,
//!   the attach message with the memfd.
//! - `conn_id`: [`ConnId`], the number that names a connection to the
//!   book, the inbox and the wait set.
//! - `inbox`: the attached workers' sockets, read by the consumer thread
//!   itself: reports in, checked, turned into batches.
//! - `pace`: how many reports a waiting consumer sleeps through before the
//!   workers ring its doorbell.
//! - `grant`: grants out, written straight to a worker's socket by the
//!   thread that frees or credits a slot.
//!
//! What the consumer does when the in-order stream is stuck on a gap while
//! ring slots are in use is the SDK's policy (its `gap` module), over
//! [`SlotRing::holds`] and [`SlotRing::last_disconnect`].

mod book;
mod conn;
mod conn_id;
pub(crate) mod fuzz;
mod grant;
mod inbox;
mod memory;
mod pace;
mod peer;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::net::UnixListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::frame::{FrameError, MAX_SLOTS, RingGeometry};

use self::book::Book;
pub use self::book::{Census, SlotCredit};
pub use self::conn::ConnContext;
pub use self::conn_id::ConnId;
pub use self::inbox::{BadReport, Filled, Inbox, Worker};
use self::memory::RingMemory;
use self::memory::SlotView;
pub use self::pace::{Pace, Plan};
use self::peer::PeerPolicy;

/// Bytes per slot unless told otherwise: a 64 x 3x224x224 uint8 batch fits.
pub const DEFAULT_SLOT_SIZE: u64 = 16 << 20;
/// Fewest slots of a ring sized by default.
const MIN_DEFAULT_SLOTS: u32 = 4;

/// Why the ring could not be set up, or a connection had to end.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The settings describe an impossible ring.
    #[error("invalid shared-memory ring: {0}")]
    Config(String),
    /// The memfd could not be created, sealed or mapped.
    #[error("cannot create the shared-memory ring: {0}")]
    Memory(String),
    /// The socket could not be set up.
    #[error("cannot listen for workers on {}: {cause}", path.display())]
    Listen {
        /// Socket path.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// A peer may not attach.
    #[error("refusing a ring peer: {0}")]
    Refused(String),
    /// Reading or writing the socket failed.
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
    /// A frame could not be read.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The peer said something out of place before attaching.
    #[error("protocol error: {0}")]
    Protocol(String),
}

/// Ring settings that cannot work, in one line naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GeometryError(pub String);

/// A fresh name in the abstract socket namespace, as tokio takes it (a
/// leading NUL byte): unique among this host's live rings, since a name
/// lives only as long as the socket bound to it.
fn abstract_name() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    PathBuf::from(format!("\0loader-ring-{}-{n}-{nanos:08x}", std::process::id()))
}

/// Settings of the ring: the SDK builds them from its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingConfig {
    /// Slots; default `2 x prefetch`, at least 4.
    pub slot_count: Option<u32>,
    /// Bytes per slot: a multiple of 64 and of the page size.
    pub slot_size: u64,
    /// Where the private socket directory is created (default: the system
    /// temporary directory). A sidecar worker needs a directory it shares.
    pub dir: Option<PathBuf>,
    /// Users other than this process's own that may attach.
    pub allowed_uids: BTreeSet<u32>,
}

impl Default for RingConfig {
    fn default() -> Self {
        Self {
            slot_count: None,
            slot_size: DEFAULT_SLOT_SIZE,
            dir: None,
            allowed_uids: BTreeSet::new(),
        }
    }
}

impl RingConfig {
    /// These settings for batches of about `batch_bytes`: slots the size of
    /// the batch (rounded up to the page) unless the slot size was set.
    /// Small batches then take small slots, and a ring of many of them
    /// costs little memory.
    pub fn sized_for(&self, batch_bytes: Option<u64>) -> Self {
        let mut out = self.clone();
        if let Some(bytes) = batch_bytes
            && self.slot_size == DEFAULT_SLOT_SIZE
        {
            let page = page_size();
            // Never larger than the default: a batch that big streams over
            // gRPC, as it did before sizing.
            out.slot_size = bytes.max(1).div_ceil(page).saturating_mul(page).min(DEFAULT_SLOT_SIZE);
        }
        out
    }

    /// The ring's geometry for `prefetch` grants per worker, or a one-line
    /// reason why these settings cannot work.
    pub fn geometry(&self, prefetch: u32) -> Result<RingGeometry, GeometryError> {
        let bad = |m: String| Err(GeometryError(m));
        let page = page_size();
        let size = self.slot_size;
        if size == 0
            || !size.is_multiple_of(loader_proto::batch::ALIGN as u64)
            || !size.is_multiple_of(page)
        {
            return bad(format!(
                "ring slot size {size} must be a positive multiple of 64 and of the page size ({page} bytes)"
            ));
        }
        let count = self
            .slot_count
            .unwrap_or_else(|| prefetch.saturating_mul(2).max(MIN_DEFAULT_SLOTS));
        if count == 0 || count > MAX_SLOTS {
            return bad(format!(
                "ring slot count {count} must be between 1 and {MAX_SLOTS}"
            ));
        }
        let geometry = RingGeometry {
            slot_size: size,
            slot_count: count,
        };
        match geometry
            .total_len()
            .and_then(|l| usize::try_from(l).ok())
            .filter(|&l| l <= isize::MAX as usize)
        {
            Some(_) => Ok(geometry),
            None => bad(format!(
                "a ring of {count} slots of {size} bytes does not fit this address space"
            )),
        }
    }
}

fn page_size() -> u64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE) {
        Ok(Some(p)) if p > 0 => p as u64,
        _ => 4096,
    }
}

/// A worker whose ring connection closed: if the stream stalls afterwards,
/// its batches are the likely gap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnect {
    /// The worker's gRPC address, from its hello.
    pub address: String,
    /// Its process id, from SO_PEERCRED.
    pub pid: i32,
    /// When the socket closed.
    pub at: Instant,
}

/// The ring's memory and book, shared by the connections, the views and the
/// consumer; outlives the loader while batches are held.
#[derive(Debug)]
pub struct SlotRing {
    /// The mapping the views read.
    memory: Arc<RingMemory>,
    /// Who holds which slot.
    book: Arc<Book>,
    /// The latest worker that left the ring while the loader ran.
    disconnected: Mutex<Option<Disconnect>>,
}

impl SlotRing {
    /// Slot counts by state.
    pub fn census(&self) -> Census {
        self.book.census()
    }

    /// Workers that cannot deliver until the user gives a slot back.
    pub fn starved(&self) -> usize {
        self.book.starved()
    }

    /// True when `bytes` are a view into this ring.
    pub fn holds(&self, bytes: &Bytes) -> bool {
        self.memory
            .address_range()
            .contains(&(bytes.as_ptr() as usize))
    }

    /// Address range of the whole mapping (slots and doorbell), for the
    /// pin stage to register with a GPU driver; `self` keeps it mapped.
    pub fn address_range(&self) -> std::ops::Range<usize> {
        self.memory.address_range()
    }

    /// The latest worker that left the ring.
    pub fn last_disconnect(&self) -> Option<Disconnect> {
        self.disconnected.lock().ok().and_then(|d| d.clone())
    }

    fn record_disconnect(&self, d: Disconnect) {
        if let Ok(mut slot) = self.disconnected.lock() {
            *slot = Some(d);
        }
    }
}

/// The ring and its socket, owned by the loader.
#[derive(Debug)]
pub struct Ring {
    /// Shared with views and connections.
    shared: Arc<SlotRing>,
    /// The socket workers connect to.
    path: PathBuf,
    /// Taken when the accept loop starts.
    listener: Option<UnixListener>,
    /// The private directory holding the socket, when the ring has one
    /// (`ring_dir`); removed on drop.
    _dir: Option<tempfile::TempDir>,
    /// Who may attach.
    policy: PeerPolicy,
    /// Attached workers' sockets, once serving; closed when the ring drops.
    inbox: Option<Arc<Inbox>>,
}

impl Ring {
    /// Creates the memfd for `geometry` and binds the socket. Call on a
    /// tokio runtime. Connections wait in the backlog until [`Ring::serve`].
    pub fn bind(
        config: &RingConfig,
        geometry: RingGeometry,
        prefetch: u32,
    ) -> Result<Self, RingError> {
        let memory = RingMemory::create(geometry)?;
        let (dir, path) = match &config.dir {
            // A directory shared with a sidecar (an emptyDir): a private
            // directory in it, removed on drop.
            Some(parent) => {
                use std::os::unix::fs::PermissionsExt as _;
                // 0700: created so, not left to the umask.
                let dir = tempfile::Builder::new()
                    .prefix("loader-ring-")
                    .permissions(std::fs::Permissions::from_mode(0o700))
                    .tempdir_in(parent)
                    .map_err(|cause| RingError::Listen {
                        path: parent.clone(),
                        cause,
                    })?;
                let path = dir.path().join("ring.sock");
                (Some(dir), path)
            }
            // By default a name in Linux's abstract socket namespace: no
            // file, so nothing is left behind however this process ends
            // (SIGKILL included). Containers of one pod share the network
            // namespace, so a sidecar worker still reaches it; who may
            // attach is decided by the peer's credentials, as for a path.
            None => (None, abstract_name()),
        };
        if path.to_str().is_none() {
            return Err(RingError::Config(format!(
                "socket path {} is not UTF-8",
                path.display()
            )));
        }
        let listener = UnixListener::bind(&path).map_err(|cause| RingError::Listen {
            path: path.clone(),
            cause,
        })?;
        if dir.is_some() {
            // The socket is 0600 in its 0700 directory whatever the umask,
            // so only this user can even connect (the peer-credential
            // check comes after that).
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(|cause| RingError::Listen { path: path.clone(), cause })?;
        }
        let shared = Arc::new(SlotRing {
            memory,
            book: Book::new(geometry, prefetch),
            disconnected: Mutex::new(None),
        });
        let policy = PeerPolicy {
            allowed_uids: config.allowed_uids.clone(),
            ..PeerPolicy::own_user()
        };
        Ok(Self {
            shared,
            path,
            listener: Some(listener),
            _dir: dir,
            policy,
            inbox: None,
        })
    }

    /// The socket path, as OpenSession carries it.
    pub fn socket(&self) -> &Path {
        &self.path
    }

    /// The memory and book, for the consumer.
    pub fn shared(&self) -> Arc<SlotRing> {
        Arc::clone(&self.shared)
    }

    /// Accepts workers until `stop`, each on a task of its own until it
    /// attaches; then its socket goes to `ctx.inbox`, which the consumer
    /// reads.
    pub fn serve(&mut self, ctx: ConnContext, stop: CancellationToken) {
        let Some(listener) = self.listener.take() else {
            return;
        };
        self.inbox = Some(Arc::clone(&ctx.inbox));
        let ctx = Arc::new(ctx.with(Arc::clone(&self.shared), self.policy.clone()));
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = stop.cancelled() => return,
                    a = listener.accept() => a,
                };
                match accepted {
                    Ok((stream, _)) => {
                        tokio::spawn(conn::serve(Arc::clone(&ctx), stream));
                    }
                    Err(e) => {
                        // Out of descriptors and the like: pause, then go on.
                        tracing::warn!("accepting a ring connection failed: {e}");
                        tokio::time::sleep(loader_process::retry::ACCEPT_ERROR_PAUSE).await;
                    }
                }
            }
        });
    }
}

impl Drop for Ring {
    /// Workers see their sockets close as soon as the loader stops, even
    /// while an attach is still in flight or batches outlive the loader.
    fn drop(&mut self) {
        if let Some(inbox) = &self.inbox {
            inbox.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_socket_in_a_shared_directory_is_private_to_this_user() {
        use std::os::unix::fs::PermissionsExt as _;
        let shared = tempfile::tempdir().expect("shared dir");
        let config = RingConfig { dir: Some(shared.path().to_owned()), slot_size: 64 << 10, ..Default::default() };
        let ring = Ring::bind(&config, config.geometry(2).expect("geometry"), 2).expect("bind");
        let socket = ring.socket().to_owned();
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(socket.parent().expect("its directory")), 0o700);
        assert_eq!(mode(&socket), 0o600);
        drop(ring);
        assert!(!socket.exists(), "removed with the ring");
    }

    #[test]
    fn geometry_defaults_and_limits() {
        let c = RingConfig::default();
        assert_eq!(
            c.geometry(8).expect("default"),
            RingGeometry {
                slot_size: 16 << 20,
                slot_count: 16
            }
        );
        assert_eq!(c.geometry(1).expect("min").slot_count, 4);
        let c = RingConfig {
            slot_count: Some(2),
            slot_size: 64 << 10,
            ..Default::default()
        };
        assert_eq!(
            c.geometry(1).expect("explicit"),
            RingGeometry {
                slot_size: 64 << 10,
                slot_count: 2
            }
        );
        for (count, size) in [
            (Some(0), 1 << 20),
            (Some(MAX_SLOTS + 1), 1 << 20),
            (None, 0),
            (None, 1000),
            (None, 64),
        ] {
            let c = RingConfig {
                slot_count: count,
                slot_size: size,
                ..Default::default()
            };
            let e = c.geometry(8).expect_err("invalid");
            assert!(e.0.starts_with("ring slot"), "{e}");
        }
        let c = RingConfig {
            slot_count: Some(MAX_SLOTS),
            slot_size: u64::MAX - 4095,
            ..Default::default()
        };
        assert!(c.geometry(8).is_err(), "overflow");
    }
}
