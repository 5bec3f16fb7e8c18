//! [`LoaderOptions`]: how a loader delivers batches, as plain data. It is
//! what [`LoaderBuilder`](crate::LoaderBuilder)'s option setters write, what
//! the Python SDK passes whole (as JSON), and the one place the defaults
//! live. The job, the rank and where the coordinator runs are not options:
//! they say what to load, not how.
//!
//! On the wire (JSON, or anything serde reads) every field is optional,
//! unknown fields are errors, durations are seconds and the ring is
//! `[slots, slot_bytes]`:
//!
//! ```json
//! {"prefetch": 8, "in_order": true, "shared_memory": true, "ring": [16, 1048576],
//!  "ring_dir": "/shared", "allow_ring_peer_uids": [1000], "coordinator_timeout": 15.0,
//!  "metrics_listen": "127.0.0.1:9464", "device": "cuda:0", "device_prefetch": 2}
//! ```

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use loader_ring::trainer::{DEFAULT_SLOT_SIZE, RingConfig};
use serde::{Deserialize, Serialize};

use crate::error::LoaderError;
use crate::pin::{DEFAULT_DEVICE_PREFETCH, Device};

/// Credits per worker stream unless told otherwise.
pub const DEFAULT_PREFETCH: u32 = 8;

/// How long a running trainer waits for a coordinator that stopped
/// answering before it fails (`LoaderError::CoordinatorLost`): longer than a
/// coordinator restart takes, shorter than the shared-memory path's own
/// bound on a stuck stream, so the error is the same on every transport.
pub const DEFAULT_COORDINATOR_TIMEOUT: Duration = Duration::from_secs(15);

/// How a loader delivers batches; every field has a default
/// ([`LoaderOptions::default`]), and [`LoaderOptions::validate`] checks them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoaderOptions {
    /// Batches each worker may send ahead of consumption, at least: bounds
    /// the memory held per worker. Small batches get more (see
    /// [`LoaderBuilder::prefetch`](crate::LoaderBuilder::prefetch)).
    pub prefetch: u32,
    /// Yield by sequence number (true), or as batches arrive, which is
    /// faster when workers are uneven (still each batch once).
    pub in_order: bool,
    /// Let workers on this machine write batches straight into this
    /// process's memory (true), or take every batch over gRPC.
    pub shared_memory: bool,
    /// Geometry of the shared-memory ring; None sizes it from the batch.
    pub ring: Option<RingSize>,
    /// Directory for the ring's socket, for a worker that shares the
    /// directory but not the network namespace; None: an abstract socket.
    pub ring_dir: Option<PathBuf>,
    /// Users besides this process's own whose workers may attach to the
    /// ring: a sidecar running as another user needs this.
    pub allow_ring_peer_uids: BTreeSet<u32>,
    /// How long the coordinator may not answer before iteration fails, so
    /// a coordinator restart is survived but a lost one is not waited for.
    #[serde(with = "seconds")]
    pub coordinator_timeout: Duration,
    /// Serve this process's Prometheus metrics (`/metrics`: batches
    /// consumed, stall time) on this `IP:PORT`, port 0 for any free one
    /// ([`Loader::metrics_addr`](crate::Loader::metrics_addr) tells which);
    /// None: no endpoint. One endpoint per process, shared by its loaders.
    pub metrics_listen: Option<String>,
    /// Where batches land: `cpu` (host memory, the default), `cuda` /
    /// `cuda:N` (copied to that GPU by the pin-memory stage, straight from
    /// the ring; feature `cuda`; an error when no GPU is usable), `auto`
    /// (GPU 0 when usable, else the host, said in one log line) or `host`
    /// (the stage with host memory standing in for the device: tests).
    pub device: Device,
    /// Host-to-device copies queued ahead of the batch being yielded; the
    /// stage holds at most `device_prefetch + 2` device buffers, which
    /// bounds GPU memory.
    pub device_prefetch: u32,
}

/// Slots of the shared-memory ring and bytes per slot; `[slots, slot_bytes]`
/// on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(u32, u64)", into = "(u32, u64)")]
pub struct RingSize {
    /// Slots: batches in flight or held by the trainer at once.
    pub slots: u32,
    /// Bytes per slot: a multiple of 64 and of the page size; a larger
    /// batch streams over gRPC instead.
    pub slot_bytes: u64,
}

impl From<(u32, u64)> for RingSize {
    fn from((slots, slot_bytes): (u32, u64)) -> Self {
        Self { slots, slot_bytes }
    }
}

impl From<RingSize> for (u32, u64) {
    fn from(r: RingSize) -> Self {
        (r.slots, r.slot_bytes)
    }
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self {
            prefetch: DEFAULT_PREFETCH,
            in_order: true,
            shared_memory: true,
            ring: None,
            ring_dir: None,
            allow_ring_peer_uids: BTreeSet::new(),
            coordinator_timeout: DEFAULT_COORDINATOR_TIMEOUT,
            metrics_listen: None,
            device: Device::Cpu,
            device_prefetch: DEFAULT_DEVICE_PREFETCH,
        }
    }
}

impl LoaderOptions {
    /// Fails, in one line naming the option, on a value no loader can use.
    /// (The ring's geometry depends on the batch and is checked when the
    /// ring is sized.)
    pub fn validate(&self) -> Result<(), LoaderError> {
        if self.prefetch == 0 {
            return Err(LoaderError::InvalidArgument("prefetch must be > 0".into()));
        }
        if self.device_prefetch == 0 {
            return Err(LoaderError::InvalidArgument("device_prefetch must be > 0".into()));
        }
        self.metrics_addr()?;
        Ok(())
    }

    /// The ring these options ask for: slots sized from the batch unless
    /// `ring` gives a geometry.
    pub(crate) fn ring_config(&self) -> RingConfig {
        RingConfig {
            slot_count: self.ring.map(|r| r.slots),
            slot_size: self.ring.map_or(DEFAULT_SLOT_SIZE, |r| r.slot_bytes),
            dir: self.ring_dir.clone(),
            allowed_uids: self.allow_ring_peer_uids.clone(),
        }
    }

    /// The parsed [`metrics_listen`](Self::metrics_listen), if set.
    pub(crate) fn metrics_addr(&self) -> Result<Option<std::net::SocketAddr>, LoaderError> {
        self.metrics_listen
            .as_deref()
            .map(loader_process::telemetry::metrics::parse_listen)
            .transpose()
            .map_err(|e| LoaderError::InvalidArgument(format!("invalid loader option metrics_listen: {e}")))
    }

    /// Parses and checks options written as JSON (as [`to_json`](Self::to_json)
    /// writes them); a missing field keeps its default. Errors are one line
    /// naming the option (an unknown one with the list of known ones).
    pub fn from_json(json: &str) -> Result<Self, LoaderError> {
        // serde would take an array as the fields in order.
        if !json.trim_start().starts_with('{') {
            return Err(LoaderError::InvalidArgument(
                "invalid loader options: expected a JSON object".into(),
            ));
        }
        let mut de = serde_json::Deserializer::from_str(json);
        let options: Self = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let field = e.path().to_string();
            let message = without_position(&e.into_inner());
            LoaderError::InvalidArgument(match message.strip_prefix("unknown field ") {
                Some(known) => format!("unknown loader option {known}"),
                None if matches!(field.as_str(), "." | "?") => {
                    format!("invalid loader options: {message}")
                }
                None => format!("invalid loader option {field}: {message}"),
            })
        })?;
        de.end().map_err(|e| {
            LoaderError::InvalidArgument(format!("invalid loader options: {}", without_position(&e)))
        })?;
        options.validate()?;
        Ok(options)
    }

    /// The options as JSON, every field written; fails only on a `ring_dir`
    /// that is not UTF-8, which JSON cannot carry.
    pub fn to_json(&self) -> Result<String, LoaderError> {
        serde_json::to_string(self).map_err(|e| {
            LoaderError::InvalidArgument(format!("cannot write the loader options as JSON: {e}"))
        })
    }
}

/// serde_json's message without the position it ends with: in one short
/// object the option's name says more.
fn without_position(e: &serde_json::Error) -> String {
    let message = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    message.strip_suffix(&position).unwrap_or(&message).to_owned()
}

/// A [`Duration`] as seconds (a float) on the wire.
mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(|_| {
            serde::de::Error::custom(format!(
                "must be a number of seconds >= 0 and < 2^64, not {secs}"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(json: &str) -> String {
        LoaderOptions::from_json(json).expect_err(json).to_string()
    }

    #[test]
    fn defaults_are_the_documented_constants() {
        let d = LoaderOptions::default();
        assert_eq!(d.prefetch, DEFAULT_PREFETCH);
        assert_eq!(d.prefetch, 8);
        assert_eq!(d.coordinator_timeout, DEFAULT_COORDINATOR_TIMEOUT);
        assert_eq!(d.coordinator_timeout, Duration::from_secs(15));
        assert!(d.in_order && d.shared_memory);
        assert_eq!((d.ring, d.ring_dir.as_ref()), (None, None));
        assert!(d.allow_ring_peer_uids.is_empty());
        // A missing field keeps its default.
        assert_eq!(LoaderOptions::from_json("{}").expect("empty"), d);
        assert_eq!(
            d.to_json().expect("json"),
            r#"{"prefetch":8,"in_order":true,"shared_memory":true,"ring":null,"ring_dir":null,"allow_ring_peer_uids":[],"coordinator_timeout":15.0,"metrics_listen":null,"device":"cpu","device_prefetch":2}"#
        );
    }

    #[test]
    fn json_round_trips_every_field() {
        let options = LoaderOptions {
            prefetch: 3,
            in_order: false,
            shared_memory: false,
            ring: Some(RingSize { slots: 6, slot_bytes: 64 << 10 }),
            ring_dir: Some(PathBuf::from("/shared/ring")),
            allow_ring_peer_uids: [1000, 65534].into(),
            coordinator_timeout: Duration::from_millis(2500),
            metrics_listen: Some("127.0.0.1:0".into()),
            device: Device::Cuda(1),
            device_prefetch: 3,
        };
        let json = options.to_json().expect("json");
        assert!(json.contains(r#""ring":[6,65536]"#), "{json}");
        assert!(json.contains(r#""coordinator_timeout":2.5"#), "{json}");
        assert!(json.contains(r#""device":"cuda:1""#), "{json}");
        assert_eq!(LoaderOptions::from_json(&json).expect("parse"), options);
        let written = r#"{"ring": [6, 65536], "coordinator_timeout": 0.25, "allow_ring_peer_uids": [7]}"#;
        let parsed = LoaderOptions::from_json(written).expect("parse");
        assert_eq!(parsed.ring, Some(RingSize { slots: 6, slot_bytes: 65536 }));
        assert_eq!(parsed.coordinator_timeout, Duration::from_millis(250));
        assert_eq!(parsed.allow_ring_peer_uids, [7].into());
        assert_eq!(parsed.prefetch, DEFAULT_PREFETCH);
    }

    #[test]
    fn an_unknown_option_is_named_with_the_known_ones() {
        let e = error(r#"{"prefetch": 2, "prefetchh": 3}"#);
        assert!(e.starts_with("unknown loader option `prefetchh`, expected one of `prefetch`, "), "{e}");
        assert!(e.contains("`coordinator_timeout`") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn a_bad_value_is_one_line_naming_the_option() {
        for (json, starts) in [
            (r#"{"prefetch": 0}"#, "prefetch must be > 0"),
            (r#"{"prefetch": "x"}"#, "invalid loader option prefetch: invalid type"),
            (r#"{"coordinator_timeout": -1}"#, "invalid loader option coordinator_timeout: must be a number of seconds >= 0 and < 2^64, not -1"),
            (r#"{"coordinator_timeout": "NaN"}"#, "invalid loader option coordinator_timeout: invalid type"),
            (r#"{"coordinator_timeout": 1e300}"#, "invalid loader option coordinator_timeout: must be"),
            (r#"{"ring": [4]}"#, "invalid loader option ring: invalid length 1"),
            (r#"{"ring": [4, -1]}"#, "invalid loader option ring[1]: invalid value"),
            (r#"{"allow_ring_peer_uids": [-1]}"#, "invalid loader option allow_ring_peer_uids[0]"),
            (r#"{"metrics_listen": "localhost:9464"}"#, "invalid loader option metrics_listen: invalid metrics address \"localhost:9464\": expected IP:PORT"),
            (r#"{"metrics_listen": 9464}"#, "invalid loader option metrics_listen: invalid type"),
            (r#"{"device": "tpu"}"#, "invalid loader option device: invalid device \"tpu\": expected \"cpu\", \"cuda\", \"cuda:N\""),
            (r#"{"device": 0}"#, "invalid loader option device: invalid type"),
            (r#"{"device_prefetch": 0}"#, "device_prefetch must be > 0"),
            (r#"[8]"#, "invalid loader options: expected a JSON object"),
            (r#"{} {}"#, "invalid loader options: trailing characters"),
        ] {
            let e = error(json);
            assert!(e.starts_with(starts), "{json}: {e}");
            assert!(!e.contains('\n') && !e.contains(" at line "), "{json}: {e}");
        }
        let e = LoaderOptions { prefetch: 0, ..Default::default() }.validate().expect_err("0");
        assert!(matches!(e, LoaderError::InvalidArgument(_)), "{e:?}");
    }
}
