//! The real `loader-worker` binary: flags, startup failures, health, signals.
//! Every test bounds its own time and kills what it started.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_loader-worker");
/// Generous bound on any one process; overrunning it fails the test.
const LIMIT: Duration = Duration::from_secs(30);

/// Kills the child when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    fn start(args: &[&str]) -> Self {
        let child = Command::new(BIN)
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start loader-worker");
        Self(child)
    }

    /// Waits for exit, at most `LIMIT`; then the stdout and stderr text.
    fn finish(mut self) -> (ExitStatus, String, String) {
        let deadline = Instant::now() + LIMIT;
        let status = loop {
            if let Some(status) = self.0.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "loader-worker did not exit within {LIMIT:?}");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut s) = self.0.stdout.take() {
            s.read_to_string(&mut out).expect("read stdout");
        }
        if let Some(mut s) = self.0.stderr.take() {
            s.read_to_string(&mut err).expect("read stderr");
        }
        (status, out, err)
    }

    /// Reads the `listening <addr>` line.
    fn listening(&mut self) -> String {
        let stdout = self.0.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(LIMIT).expect("no `listening` line in time");
        line.trim_end()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned()
    }
}

fn assert_one_error_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got {stderr:?}");
    assert!(lines[0].starts_with("loader-worker: error: "), "{stderr:?}");
    lines[0]
}

#[test]
fn a_bad_flag_is_one_line_and_fails() {
    let (status, out, err) = Running::start(&["--coordinator", "http://127.0.0.1:1", "--listen", "127.0.0.1:0", "--bogus"]).finish();
    assert!(!status.success());
    assert_eq!(out, "");
    assert!(assert_one_error_line(&err).contains("--bogus"));
}

#[test]
fn a_missing_flag_is_one_line_and_names_it() {
    let (status, _, err) = Running::start(&["--coordinator", "http://127.0.0.1:1"]).finish();
    assert!(!status.success());
    assert!(assert_one_error_line(&err).contains("--listen"));
}

#[test]
fn a_cache_dir_that_is_not_there_or_without_a_cache_is_one_line() {
    let base = ["--coordinator", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"];
    let (status, out, err) = Running::start(&[&base[..], &["--cache", "1MB", "--cache-dir", "/nonexistent/dir"]].concat()).finish();
    assert!(!status.success());
    assert_eq!(out, "", "refused before it listens");
    let line = assert_one_error_line(&err);
    assert!(line.contains("--cache-dir") && line.contains("/nonexistent/dir: No such file or directory"), "{line}");
    let (status, _, err) = Running::start(&[&base[..], &["--cache-dir", "/tmp"]].concat()).finish();
    assert!(!status.success());
    assert!(assert_one_error_line(&err).contains("--cache <SIZE>"), "{err}");
    let (status, _, err) = Running::start(&[&base[..], &["--cache", "lots"]].concat()).finish();
    assert!(!status.success());
    assert!(assert_one_error_line(&err).contains("--cache"), "{err}");
    // A cache shared on the node is a file in a directory: one must be named.
    let (status, _, err) = Running::start(&[&base[..], &["--cache", "1MB", "--cache-shared"]].concat()).finish();
    assert!(!status.success());
    assert!(assert_one_error_line(&err).contains("--cache-dir <DIR>"), "{err}");
}

#[test]
fn an_unreachable_coordinator_fails_after_the_connect_timeout() {
    let coordinator = "http://127.0.0.1:1";
    let (status, out, err) =
        Running::start(&["--coordinator", coordinator, "--listen", "127.0.0.1:0", "--connect-timeout", "1"]).finish();
    assert!(!status.success());
    assert!(out.starts_with("listening 127.0.0.1:"), "{out:?}");
    let line = assert_one_error_line(&err);
    assert!(line.contains(&format!("cannot reach coordinator {coordinator} after 1s")), "{line}");
}

#[test]
fn a_malformed_coordinator_address_fails_at_once() {
    let (status, _, err) = Running::start(&["--coordinator", "not a url", "--listen", "127.0.0.1:0"]).finish();
    assert!(!status.success());
    assert!(assert_one_error_line(&err).contains("invalid coordinator address \"not a url\""));
}

#[test]
fn serves_health_while_registering_and_stops_on_sigterm() {
    // The coordinator never answers, so the worker stays in registration;
    // it already serves health checks, and SIGTERM ends it cleanly.
    let mut worker = Running::start(&[
        "--coordinator",
        "http://127.0.0.1:1",
        "--listen",
        "127.0.0.1:0",
        "--connect-timeout",
        "600",
    ]);
    let addr = worker.listening();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let status = runtime.block_on(async {
        tokio::time::timeout(LIMIT, async {
            let target = loader_process::grpc::endpoint(
                &format!("http://{addr}"),
                &loader_process::security::ClientSecurity::none(),
            )
            .expect("endpoint");
            let channel = loader_process::grpc::connect(&target, tokio::time::Instant::now() + LIMIT)
                .await
                .expect("connect");
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            let request = tonic_health::pb::HealthCheckRequest { service: "loader.v1.BatchService".into() };
            health.check(request).await.expect("check").into_inner().status
        })
        .await
        .expect("health check overran")
    });
    assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    // Close our connection: an idle client that never answers the server's
    // goodbye would hold the graceful shutdown for its whole grace period.
    drop(runtime);

    let pid = worker.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().expect("run kill");
    assert!(killed.success());
    let (status, _, err) = worker.finish();
    assert!(status.success(), "exit {status:?}, stderr {err:?}");
    assert_eq!(err, "");
}
