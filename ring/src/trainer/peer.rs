//! Who may join the ring: the peer's credentials (SO_PEERCRED), checked
//! against a policy before the memfd is passed to it.

use std::collections::BTreeSet;
use std::os::fd::AsFd;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

use super::RingError;

/// Credentials of the process at the other end of a Unix socket, as the
/// kernel recorded them when it connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerCreds {
    /// Process id (for messages; the worker may have exited since).
    pub(crate) pid: i32,
    /// User id.
    pub(crate) uid: u32,
    /// Group id.
    pub(crate) gid: u32,
}

impl PeerCreds {
    /// Asks the kernel about the peer of `socket`.
    pub(crate) fn of(socket: &impl AsFd) -> Result<Self, RingError> {
        let c = getsockopt(socket, PeerCredentials)
            .map_err(|e| RingError::Refused(format!("cannot read the peer's credentials: {e}")))?;
        Ok(Self {
            pid: c.pid(),
            uid: c.uid(),
            gid: c.gid(),
        })
    }
}

/// Which users may attach to the ring: this process's own user, plus any
/// allowed explicitly (e.g. a sidecar worker running as another user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerPolicy {
    /// This process's user.
    pub(crate) own_uid: u32,
    /// Other users allowed.
    pub(crate) allowed_uids: BTreeSet<u32>,
}

impl PeerPolicy {
    /// Only this process's own user.
    pub(crate) fn own_user() -> Self {
        Self {
            own_uid: nix::unistd::getuid().as_raw(),
            allowed_uids: BTreeSet::new(),
        }
    }
}

/// Accepts a peer running as this process's user or an allowed one. Every
/// other peer is refused with a one-line reason; it never sees the memfd.
pub(crate) fn authorize(peer: PeerCreds, policy: &PeerPolicy) -> Result<(), RingError> {
    if peer.uid == policy.own_uid || policy.allowed_uids.contains(&peer.uid) {
        return Ok(());
    }
    Err(RingError::Refused(format!(
        "peer pid {} runs as uid {}, but only uid {}{} may attach (allow it with LoaderBuilder::allow_ring_peer_uid)",
        peer.pid,
        peer.uid,
        policy.own_uid,
        policy
            .allowed_uids
            .iter()
            .map(|u| format!(", {u}"))
            .collect::<String>(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32) -> PeerCreds {
        PeerCreds {
            pid: 4242,
            uid,
            gid: uid,
        }
    }

    #[test]
    fn same_user_is_accepted_others_are_refused() {
        let policy = PeerPolicy {
            own_uid: 1000,
            allowed_uids: BTreeSet::new(),
        };
        assert!(authorize(peer(1000), &policy).is_ok());
        let e = authorize(peer(1001), &policy).expect_err("other uid");
        assert_eq!(
            e.to_string(),
            "refusing a ring peer: peer pid 4242 runs as uid 1001, but only uid 1000 may attach \
             (allow it with LoaderBuilder::allow_ring_peer_uid)"
        );
        assert!(
            authorize(peer(0), &policy).is_err(),
            "not even root unless allowed"
        );
    }

    #[test]
    fn the_allow_list_is_honoured() {
        let policy = PeerPolicy {
            own_uid: 1000,
            allowed_uids: [0, 2000].into(),
        };
        for uid in [1000, 0, 2000] {
            assert!(authorize(peer(uid), &policy).is_ok(), "uid {uid}");
        }
        let e = authorize(peer(3000), &policy)
            .expect_err("not listed")
            .to_string();
        assert!(e.contains("only uid 1000, 0, 2000 may attach"), "{e}");
    }

    #[test]
    fn credentials_of_a_real_socket_are_our_own() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let c = PeerCreds::of(&a).expect("creds");
        assert_eq!(c.pid, std::process::id() as i32);
        assert_eq!(c.uid, nix::unistd::getuid().as_raw());
        assert!(authorize(c, &PeerPolicy::own_user()).is_ok());
    }
}
