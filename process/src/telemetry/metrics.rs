//! Prometheus metrics: the process's one recorder and its one scrape
//! endpoint, `GET /metrics` on the address given by `--metrics-listen`
//! (`loader-server`, `loader-worker`) or `LoaderOptions::metrics_listen`
//! (a trainer).
//!
//! The crates record through the `metrics` facade (counters, gauges and
//! histograms, their label sets built once per job or consumer, not per
//! batch). Until [`serve`] installs the recorder (`metrics-exporter-prometheus`)
//! those handles are no-ops, so metrics that are off cost a call that does
//! nothing. The endpoint is a small handler of our own on the process's
//! background runtime ([`crate::runtime::background`]): the exporter's listener binds inside and cannot tell which port
//! `:0` picked, and the address must be printed (`metrics <addr>`) for
//! scripts and tests to find it. One endpoint per process: a second
//! [`serve`] for the same address is answered with the first one's, for
//! another address it fails.

use std::io;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use axum::http::header::CONTENT_TYPE;

/// Upper bounds of every histogram's buckets, in seconds (every Loader
/// histogram is a duration): 100 µs to 10 s.
pub const BUCKETS_SECONDS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// How often histograms are compacted when nobody scrapes, so that an
/// unscraped process does not keep every sample.
const UPKEEP: Duration = Duration::from_secs(5);

/// Why metrics cannot be served. One line each.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address is not `IP:PORT`.
    #[error("invalid metrics address {given:?}: expected IP:PORT, e.g. 127.0.0.1:9464 (port 0 picks a free one)")]
    Address {
        /// What was given.
        given: String,
    },
    /// The address cannot be bound.
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding failed.
        source: io::Error,
    },
    /// This process serves metrics on another address already.
    #[error("metrics are served on {serving} already (asked for {asked}); a process has one metrics endpoint")]
    AlreadyServing {
        /// The address being served.
        serving: SocketAddr,
        /// The address asked for now.
        asked: SocketAddr,
    },
    /// Another metrics recorder was installed in this process (by the
    /// program that embeds Loader).
    #[error("cannot install the Prometheus recorder: {0}")]
    Install(String),
    /// The background runtime could not start.
    #[error("cannot start the metrics endpoint: {0}")]
    Start(io::Error),
}

/// The endpoint of this process, once served.
#[derive(Debug, Clone, Copy)]
struct Endpoint {
    /// The address asked for (port 0 stays 0), to answer a repeated call.
    asked: SocketAddr,
    /// The address bound.
    bound: SocketAddr,
}

/// This process's endpoint; the lock also keeps two first calls apart.
static ENDPOINT: Mutex<Option<Endpoint>> = Mutex::new(None);

/// Parses a metrics address as people write it: `IP:PORT`, port 0 for any
/// free port (`[::1]:9464` for IPv6).
pub fn parse_listen(given: &str) -> Result<SocketAddr, MetricsError> {
    given.trim().parse().map_err(|_| MetricsError::Address { given: given.to_owned() })
}

/// Where this process serves metrics, if it does.
pub fn serving() -> Option<SocketAddr> {
    ENDPOINT.lock().unwrap_or_else(PoisonError::into_inner).map(|e| e.bound)
}

/// Installs the Prometheus recorder and serves `GET /metrics` on `addr`
/// from the background runtime, for the rest of the process's life. Returns
/// the bound address. A second call for the same `addr` returns the first
/// one's address; for another address it fails.
pub fn serve(addr: SocketAddr) -> Result<SocketAddr, MetricsError> {
    let mut endpoint = ENDPOINT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(e) = *endpoint {
        return if e.asked == addr {
            Ok(e.bound)
        } else {
            Err(MetricsError::AlreadyServing { serving: e.bound, asked: addr })
        };
    }
    // Bound before the recorder is installed: a bad address leaves the
    // process as it was.
    let listener = std::net::TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(|source| MetricsError::Bind { addr, source })?;
    listener.set_nonblocking(true).map_err(|source| MetricsError::Bind { addr, source })?;
    let runtime = crate::runtime::background().map_err(MetricsError::Start)?;
    let recorder = PrometheusBuilder::new()
        .set_buckets(BUCKETS_SECONDS)
        .map_err(|e| MetricsError::Install(e.to_string()))?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| MetricsError::Install(e.to_string()))?;
    runtime.spawn(accept(listener, handle));
    *endpoint = Some(Endpoint { asked: addr, bound });
    tracing::info!(%bound, "serving metrics");
    Ok(bound)
}

/// Answers scrapes (axum: `GET /metrics`; 404 elsewhere, 405 for other
/// methods) and compacts histograms.
async fn accept(listener: std::net::TcpListener, handle: PrometheusHandle) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("metrics endpoint stopped: {e}");
            return;
        }
    };
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    let scrape = move || {
        let page = handle.render();
        async move { ([(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], page) }
    };
    let app = axum::Router::new().route("/metrics", axum::routing::get(scrape));
    if let Err(e) = axum::serve(listener, app).await {
        tracing::warn!("metrics endpoint stopped: {e}");
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    #[test]
    fn addresses_are_ip_and_port() {
        assert_eq!(parse_listen("127.0.0.1:0").expect("v4"), "127.0.0.1:0".parse().expect("addr"));
        assert_eq!(parse_listen(" [::1]:9464 ").expect("v6"), "[::1]:9464".parse().expect("addr"));
        for bad in ["", "9464", "localhost:9464", "127.0.0.1", "127.0.0.1:99999", "http://127.0.0.1:1"] {
            let e = parse_listen(bad).expect_err(bad).to_string();
            assert!(e.starts_with(&format!("invalid metrics address {bad:?}: expected IP:PORT")), "{bad}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    fn request(addr: SocketAddr, method: &str, path: &str) -> String {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        write!(stream, "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").expect("write");
        let mut out = String::new();
        stream.read_to_string(&mut out).expect("read");
        out
    }

    /// One test: the recorder and the endpoint are the process's.
    #[test]
    fn serves_what_is_recorded_once_per_process() {
        let asked = parse_listen("127.0.0.1:0").expect("addr");
        let bound = serve(asked).expect("serve");
        assert_ne!(bound.port(), 0);
        assert_eq!(serving(), Some(bound));
        assert_eq!(serve(asked).expect("same address again"), bound);
        let other = parse_listen("127.0.0.1:1").expect("addr");
        let e = serve(other).expect_err("another address").to_string();
        assert!(e.starts_with(&format!("metrics are served on {bound} already")), "{e}");

        metrics::counter!("loader_test_things_total", "job" => "7").increment(3);
        metrics::histogram!("loader_test_wait_seconds").record(0.003);
        let page = request(bound, "GET", "/metrics");
        assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
        assert!(page.contains("loader_test_things_total{job=\"7\"} 3\n"), "{page}");
        assert!(page.contains("loader_test_wait_seconds_bucket{le=\"0.005\"} 1\n"), "{page}");
        assert!(page.contains("content-type: text/plain; version=0.0.4"), "{page}");
        assert!(request(bound, "GET", "/").starts_with("HTTP/1.1 404 "));
        assert!(request(bound, "POST", "/metrics").starts_with("HTTP/1.1 405 "));
    }
}
