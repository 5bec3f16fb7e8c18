//! A network namespace joined to the host by a veth pair, for a "remote"
//! worker whose link the test can cut. Addresses are a private /30 that
//! exists only while the test runs; the namespace and the veth are deleted
//! when the guard drops, and a stale pair left by a killed run is deleted
//! before a new one is made. A file lock keeps two test runs on one host
//! (e.g. two checkouts sharing a machine) from using the /30 at once.

use std::fs::File;
use std::process::Command;

/// Namespace name; fixed, so a killed run's leftovers are found and removed.
const NAMESPACE: &str = "loader-e2e-remote";
/// Host end of the veth pair (interface names are at most 15 bytes).
const HOST_IF: &str = "le2e-host";
/// Namespace end of the veth pair.
const NS_IF: &str = "le2e-ns";
/// The host side's address: the coordinator listens here.
pub const HOST_ADDR: &str = "10.213.7.1";
/// The namespace side's address: the remote worker listens here.
pub const NS_ADDR: &str = "10.213.7.2";
/// The nftables table of [`RemoteNamespace::blackhole_port`].
const TABLE: &str = "loader_e2e";
/// Serializes the tests of every run on this host that use the /30.
const LOCK_FILE: &str = "/tmp/loader-e2e-netns.lock";

/// The namespace and its veth pair; deleted on drop.
#[derive(Debug)]
pub struct RemoteNamespace {
    /// Held for the guard's lifetime (released by close on drop).
    _lock: File,
}

impl RemoteNamespace {
    /// Whether namespaces can be made here; `Err` says why not (not root,
    /// or no `ip` with netns support; pass it to [`needs`](crate::needs)).
    pub fn available() -> Result<(), String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("not running as root (network namespaces need CAP_NET_ADMIN)".into());
        }
        match Command::new("ip").args(["netns", "list"]).output() {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(format!("`ip netns list` failed: {}", String::from_utf8_lossy(&out.stderr).trim())),
            Err(e) => Err(format!("no `ip` command (install iproute2): {e}")),
        }
    }

    /// Creates the namespace, the veth pair with `HOST_ADDR/30` on the host
    /// and `NS_ADDR/30` inside, and brings both ends (and the namespace's
    /// loopback) up.
    pub fn create() -> RemoteNamespace {
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_FILE)
            .unwrap_or_else(|e| panic!("open {LOCK_FILE}: {e}"));
        lock.lock().unwrap_or_else(|e| panic!("lock {LOCK_FILE}: {e}"));
        remove();
        let guard = RemoteNamespace { _lock: lock };
        ip(&["netns", "add", NAMESPACE]);
        ip(&["link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF]);
        ip(&["link", "set", NS_IF, "netns", NAMESPACE]);
        ip(&["addr", "add", &format!("{HOST_ADDR}/30"), "dev", HOST_IF]);
        ip(&["link", "set", HOST_IF, "up"]);
        ip(&["-n", NAMESPACE, "addr", "add", &format!("{NS_ADDR}/30"), "dev", NS_IF]);
        ip(&["-n", NAMESPACE, "link", "set", NS_IF, "up"]);
        ip(&["-n", NAMESPACE, "link", "set", "lo", "up"]);
        guard
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", NAMESPACE]).arg(program);
        command
    }

    /// Whether a port can be blackholed inside the namespace; `Err` says
    /// why not (no `nft`; Debian: nftables).
    pub fn nftables() -> Result<(), String> {
        match Command::new("nft").arg("--version").output() {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(format!("`nft --version` failed: {}", String::from_utf8_lossy(&out.stderr).trim())),
            Err(e) => Err(format!("no `nft` command (install nftables): {e}")),
        }
    }

    /// Blackholes TCP port `port` inside the namespace both ways (nftables:
    /// every packet to or from that port, in or out, is dropped and nothing
    /// is answered), while every other port passes: a grey partition of one
    /// service, the namespace's own (a worker's serving port) or one it
    /// reaches (the coordinator's).
    pub fn blackhole_port(&self, port: u16) {
        let port = port.to_string();
        let hook = |chain: &str| format!("{{ type filter hook {chain} priority 0; }}");
        nft(&["add", "table", "inet", TABLE]);
        for chain in ["input", "output"] {
            nft(&["add", "chain", "inet", TABLE, chain, &hook(chain)]);
            for side in ["dport", "sport"] {
                nft(&["add", "rule", "inet", TABLE, chain, "tcp", side, &port, "drop"]);
            }
        }
    }

    /// Lifts [`RemoteNamespace::blackhole_port`].
    pub fn heal(&self) {
        nft(&["delete", "table", "inet", TABLE]);
    }

    /// Cuts the link: the host end goes down, so nothing passes either way
    /// (no reset is sent; connections just stop, as in a real partition).
    pub fn cut(&self) {
        ip(&["link", "set", HOST_IF, "down"]);
    }
}

impl Drop for RemoteNamespace {
    fn drop(&mut self) {
        remove();
    }
}

/// Deletes the veth pair and the namespace if they exist (deleting either
/// end of a veth deletes both). Errors mean they were not there.
fn remove() {
    let _ = Command::new("ip").args(["link", "del", HOST_IF]).output();
    let _ = Command::new("ip").args(["netns", "del", NAMESPACE]).output();
}

/// Runs `nft args` inside the namespace, panicking with its stderr when it
/// fails.
fn nft(args: &[&str]) {
    let out = Command::new("ip")
        .args(["netns", "exec", NAMESPACE, "nft"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("nft {args:?}: {e}"));
    assert!(out.status.success(), "nft {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
}

/// Runs `ip args`, panicking with its stderr when it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
}
