//! Coordinator settings, filled by the CLI or directly by tests and the
//! embedded mode (never read from the process environment here).

use std::path::PathBuf;
use std::time::Duration;

pub use loader_job::lease::{DEFAULT_LEASE_TTL, HEARTBEATS_PER_LEASE, heartbeat_interval};

/// How the coordinator hands out work and how long leases last.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Lease length of workers and sessions: a process that does not renew
    /// within it is considered gone.
    pub lease_ttl: Duration,
    /// How often workers and trainers are asked to heartbeat
    /// ([`heartbeat_interval`] of the TTL).
    pub heartbeat_interval: Duration,
    /// Batches per task. Small ranges keep one slow worker from holding up
    /// the in-order stream for long.
    pub range_len: u64,
    /// Directory of the journal (jobs and watermarks); None keeps everything
    /// in memory, so a restart starts over.
    pub state_dir: Option<PathBuf>,
    /// Worker processes the coordinator starts and stops itself (`loaderctl
    /// scale`); None: workers come and go on their own.
    pub worker_pool: Option<WorkerPoolConfig>,
    /// TLS, the roles' tokens and session keys (docs/security.md); none by
    /// default.
    pub security: loader_process::security::ServerSecurity,
    /// Bytes the blobs of jobs (pickled datasets) may take in memory,
    /// uploads in progress included; a larger blob is refused.
    pub blob_budget: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            lease_ttl: DEFAULT_LEASE_TTL,
            heartbeat_interval: heartbeat_interval(DEFAULT_LEASE_TTL),
            range_len: 2,
            state_dir: None,
            worker_pool: None,
            security: loader_process::security::ServerSecurity::none(),
            blob_budget: crate::blobs::DEFAULT_BUDGET,
        }
    }
}

/// How to start a worker of the pool.
#[derive(Debug, Clone)]
pub struct LocalPoolConfig {
    /// The `loader-worker` executable.
    pub command: PathBuf,
    /// Workers to start with the coordinator.
    pub initial: u32,
}

/// Where a coordinator's worker pool runs its workers.
#[derive(Debug, Clone)]
pub enum WorkerPoolConfig {
    /// `loader-worker` processes on the coordinator's host.
    Local(LocalPoolConfig),
    /// The replicas of a Kubernetes Deployment (feature `kubernetes`).
    #[cfg(feature = "kubernetes")]
    Kubernetes(KubernetesPoolConfig),
}

/// The worker Deployment a `kubernetes` pool scales.
#[cfg(feature = "kubernetes")]
#[derive(Debug, Clone)]
pub struct KubernetesPoolConfig {
    /// The Deployment's name.
    pub deployment: String,
    /// Its namespace (None: the client configuration's default).
    pub namespace: Option<String>,
}
