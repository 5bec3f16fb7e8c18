//! The `loader-server` binary: the `listening` line, bad flags and addresses.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_loader-server");

fn run_to_end(args: &[&str]) -> std::process::Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn loader-server");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("loader-server {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn prints_listening_line_with_the_bound_port() {
    let mut child = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn loader-server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read");
    let _ = child.kill();
    let _ = child.wait();
    let addr = line.trim().strip_prefix("listening ").expect("listening line");
    let addr: std::net::SocketAddr = addr.parse().expect("socket address");
    assert_ne!(addr.port(), 0);
}

#[test]
fn bad_address_is_a_one_line_error() {
    let out = run_to_end(&["--listen", "not-an-address"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("invalid --listen address \"not-an-address\""), "{err}");
}

#[test]
fn bad_flag_exits_non_zero() {
    let out = run_to_end(&["--lease-ttl-ms", "soon"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--lease-ttl-ms"));
}
