//! Reading a process's Prometheus `/metrics`: one plain HTTP GET, parsed as
//! the text format.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use prometheus_parse::{Scrape, Value};

use crate::Proc;

/// How long a process may take to print its `metrics` line.
const ANNOUNCE: Duration = Duration::from_secs(10);

/// The address `proc` (started with `--metrics-listen`) serves `/metrics` on.
pub fn metrics_addr(proc: &Proc) -> SocketAddr {
    proc.announced("metrics ", ANNOUNCE).parse().expect("a socket address")
}

/// One `GET /metrics`, parsed.
pub fn scrape(addr: SocketAddr) -> Scrape {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect to /metrics");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("read timeout");
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n").expect("send the request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read the response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
    Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("Prometheus text format")
}

/// Sum of the counter or gauge `name` over the series whose labels include
/// every pair of `labels`.
pub fn sum(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|&(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            ref other => panic!("{name} is not a counter or gauge: {other:?}"),
        })
        .sum()
}
