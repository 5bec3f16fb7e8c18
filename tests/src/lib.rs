//! Helpers for end-to-end tests: start the real `loader-server` and
//! `loader-worker` binaries on `127.0.0.1:0`, read the address each one
//! announces, and kill everything when the test ends (even on panic).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a process may take to announce its address.
const STARTUP: Duration = Duration::from_secs(20);

/// Path of a binary of this workspace, built next to the test executable.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe.parent().and_then(|d| d.parent()).expect("target directory");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test --workspace`, which builds it",
        path.display()
    );
    path
}

/// A process that is killed and reaped when dropped.
#[derive(Debug)]
pub struct Proc {
    /// The child process.
    pub child: Child,
    /// What it announced on its `listening <addr>` line.
    pub addr: String,
}

impl Proc {
    /// Spawns `name` with `args` and waits for its `listening` line.
    pub fn spawn(name: &str, args: &[&str]) -> Proc {
        let mut child = Command::new(binary(name))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            // Keep draining so the child never blocks on a full pipe.
            for _ in lines {}
        });
        let line = match rx.recv_timeout(STARTUP) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{name} did not print its listening line within {STARTUP:?}");
            }
        };
        let addr = line.strip_prefix("listening ").unwrap_or_else(|| panic!("{name} printed {line:?}")).to_owned();
        Proc { child, addr }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGKILL and reaps the process.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A coordinator and its workers.
#[derive(Debug)]
pub struct Cluster {
    /// The `loader-worker` processes (declared first: dropped, so killed,
    /// before the coordinator, so they do not log its disappearance).
    pub workers: Vec<Proc>,
    /// The `loader-server` process.
    pub server: Proc,
}

impl Cluster {
    /// Starts a coordinator and `workers` workers, and waits until all
    /// workers have registered.
    pub fn start(workers: usize) -> Cluster {
        Cluster::start_with(workers, &[])
    }

    /// Like [`Cluster::start`], with extra `loader-server` flags.
    pub fn start_with(workers: usize, server_args: &[&str]) -> Cluster {
        let mut args = vec!["--listen", "127.0.0.1:0"];
        args.extend_from_slice(server_args);
        let server = Proc::spawn("loader-server", &args);
        let mut cluster = Cluster { workers: Vec::new(), server };
        for _ in 0..workers {
            cluster.add_worker();
        }
        cluster.wait_for_workers(workers);
        cluster
    }

    /// URL of the coordinator.
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// Starts one more worker.
    pub fn add_worker(&mut self) {
        let url = self.url();
        let worker = Proc::spawn("loader-worker", &["--coordinator", &url, "--listen", "127.0.0.1:0"]);
        self.workers.push(worker);
    }

    /// Waits (bounded) until the coordinator lists `n` workers.
    pub fn wait_for_workers(&self, n: usize) {
        let url = self.url();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let mut admin = loader_proto::pb::admin_service_client::AdminServiceClient::connect(url)
                .await
                .expect("connect to coordinator");
            for _ in 0..200 {
                let listed = admin
                    .list_workers(loader_proto::pb::ListWorkersRequest {})
                    .await
                    .expect("list workers")
                    .into_inner()
                    .workers
                    .len();
                if listed >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("{n} workers did not register within 10 s");
        });
    }
}
