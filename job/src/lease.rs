//! Leases: how long a worker or trainer session lives without renewing,
//! how often it renews, and how often the coordinator looks for expired
//! ones. One rule for the coordinator, which grants leases and tells each
//! holder its heartbeat interval, and for the processes that hold them,
//! which need a default until the coordinator has said.

use std::time::Duration;

/// Lease length of workers and sessions unless told otherwise: long enough
/// that a loaded machine's scheduling hiccup does not expire a live
/// process, short enough that a dead one's batches come back in seconds.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);

/// Heartbeats per lease: a worker or trainer renews this many times per
/// TTL, so that one or two lost or late heartbeats never expire it.
pub const HEARTBEATS_PER_LEASE: u32 = 3;

/// Looks for expired leases per TTL: a dead process's lease is found at most
/// a quarter TTL after it ran out.
pub const REAPS_PER_LEASE: u32 = 4;

/// The shortest reaping interval, for the very short leases of tests: below
/// it the reaper would only burn CPU.
const MIN_REAP_INTERVAL: Duration = Duration::from_millis(10);

/// How often a process holding a lease of `ttl` heartbeats.
pub fn heartbeat_interval(ttl: Duration) -> Duration {
    ttl / HEARTBEATS_PER_LEASE
}

/// How often the coordinator expires leases of `ttl`.
pub fn reap_interval(ttl: Duration) -> Duration {
    (ttl / REAPS_PER_LEASE).max(MIN_REAP_INTERVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_renewed_several_times_and_reaped_soon_after_it_ends() {
        assert_eq!(heartbeat_interval(DEFAULT_LEASE_TTL), Duration::from_nanos(1_666_666_666));
        assert_eq!(reap_interval(DEFAULT_LEASE_TTL), Duration::from_millis(1250));
        assert_eq!(reap_interval(Duration::from_millis(20)), MIN_REAP_INTERVAL);
    }
}
