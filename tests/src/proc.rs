//! One child process of a test: started in a process group of its own and
//! tracked by the test's [`Scope`], its stdout collected line by line,
//! killed (with its whole group) and reaped when dropped.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;

use crate::scope::Scope;

/// How long a process may take to announce its address.
const STARTUP: Duration = Duration::from_secs(20);

/// How long, once a process has exited, its output readers may take to
/// reach end-of-file (longer only when a child of it still holds the pipe).
const DRAIN: Duration = Duration::from_secs(2);

/// Path of a binary of this workspace, built next to the test executable.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe.parent().and_then(|d| d.parent()).expect("target directory");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build --workspace --bins` (`cargo test --workspace` does)",
        path.display()
    );
    path
}

/// A child process that is killed, with its process group, when dropped.
#[derive(Debug)]
pub struct Proc {
    /// What the test calls it, for messages.
    name: String,
    child: Child,
    /// What it announced on its `listening <addr>` line, if it was asked to.
    addr: Option<String>,
    /// Every line it printed on stdout so far.
    stdout: Arc<Mutex<Vec<String>>>,
    /// Every line it printed on stderr so far, when started with
    /// [`Proc::spawn_capturing_stderr`] (else stderr is inherited).
    stderr: Arc<Mutex<Vec<String>>>,
    /// Set once it has been reaped.
    status: Option<ExitStatus>,
    /// One message per output reader when it reaches end-of-file, so that
    /// [`Proc::wait_exit`] returns only once every line is collected.
    drained: mpsc::Receiver<()>,
    /// How many readers were started (1 or 2).
    readers: usize,
}

impl Proc {
    /// Starts the workspace binary `name` with `args` and waits for its
    /// `listening <addr>` line.
    pub fn listening(scope: &Scope, name: &str, args: &[impl AsRef<OsStr>]) -> Proc {
        let mut command = Command::new(binary(name));
        command.args(args);
        Proc::spawn(scope, name, command, true)
    }

    /// Starts `command` (in a process group of its own, stdout collected,
    /// stderr inherited); with `listening`, waits for its `listening <addr>`
    /// line.
    pub fn spawn(scope: &Scope, name: &str, command: Command, listening: bool) -> Proc {
        Proc::start(scope, name, command, listening, false)
    }

    /// [`Proc::spawn`], with stderr also collected line by line (and still
    /// echoed to the test's stderr), for tests that check what a process
    /// logged.
    pub fn spawn_capturing_stderr(scope: &Scope, name: &str, command: Command, listening: bool) -> Proc {
        Proc::start(scope, name, command, listening, true)
    }

    fn start(scope: &Scope, name: &str, mut command: Command, listening: bool, capture: bool) -> Proc {
        let stderr_mode = if capture { Stdio::piped() } else { Stdio::inherit() };
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(stderr_mode).process_group(0);
        let mut child = command.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        scope.track(name, child.id());
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (drained_tx, drained) = mpsc::channel();
        let mut readers = 1;
        if let Some(err) = child.stderr.take() {
            let lines = stderr.clone();
            let done = drained_tx.clone();
            readers += 1;
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    eprintln!("{line}");
                    lines.lock().unwrap_or_else(PoisonError::into_inner).push(line);
                }
                let _ = done.send(());
            });
        }
        let out = child.stdout.take().expect("stdout");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let (first_tx, first_rx) = mpsc::channel();
        let lines = stdout.clone();
        std::thread::spawn(move || {
            // Keeps draining until the child closes stdout, so it never
            // blocks on a full pipe.
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let _ = first_tx.send(line.clone());
                lines.lock().unwrap_or_else(PoisonError::into_inner).push(line);
            }
            let _ = drained_tx.send(());
        });
        let mut proc =
            Proc { name: name.to_owned(), child, addr: None, stdout, stderr, status: None, drained, readers };
        if listening {
            let line = first_rx
                .recv_timeout(STARTUP)
                .unwrap_or_else(|_| panic!("{name} did not print its listening line within {STARTUP:?}"));
            let addr = line.strip_prefix("listening ").unwrap_or_else(|| panic!("{name} printed {line:?}"));
            proc.addr = Some(addr.to_owned());
        }
        proc
    }

    /// The address from its `listening` line.
    pub fn addr(&self) -> &str {
        self.addr.as_deref().unwrap_or_else(|| panic!("{} announced no address", self.name))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every line printed on stdout so far.
    pub fn stdout(&self) -> Vec<String> {
        self.stdout.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// What follows `prefix` on the first stdout line that starts with it
    /// (e.g. `metrics ` for the metrics address); panics if no such line
    /// comes within `limit`.
    pub fn announced(&self, prefix: &str, limit: Duration) -> String {
        crate::wait::wait_for(&format!("{} printing a {prefix:?} line", self.name), limit, || {
            let rest = self.stdout().iter().find_map(|l| l.strip_prefix(prefix).map(str::to_owned));
            rest.ok_or_else(|| "no such line yet".to_owned())
        })
    }

    /// Every line printed on stderr so far (empty unless started with
    /// [`Proc::spawn_capturing_stderr`]).
    pub fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// SIGKILLs this process (not its group: the test decides what dies)
    /// and reaps it.
    pub fn kill(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
    }

    /// Waits up to `limit` for the process to exit by itself; its status,
    /// or None if it is still running. Once it has exited, also waits (up
    /// to [`DRAIN`]) until everything it printed is collected: the exit can
    /// be seen before the reader threads have read the pipes' last lines.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        if self.status.is_none() {
            let child = &mut self.child;
            let exited = crate::wait::poll(limit, || match child.try_wait() {
                Ok(Some(status)) => Ok(status),
                _ => Err("running".to_owned()),
            });
            self.status = Some(exited.ok()?);
            self.drain();
        }
        self.status
    }

    /// Waits, up to [`DRAIN`] in all, for the output readers to reach
    /// end-of-file.
    fn drain(&mut self) {
        let deadline = Instant::now() + DRAIN;
        while self.readers > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.drained.recv_timeout(left).is_err() {
                return;
            }
            self.readers -= 1;
        }
    }

    /// Whether the process maps a memfd called `name` (as
    /// `/memfd:<name>` in `/proc/<pid>/maps`); false once it has exited.
    pub fn maps_memfd(&self, name: &str) -> bool {
        let needle = format!("/memfd:{name}");
        std::fs::read_to_string(format!("/proc/{}/maps", self.pid()))
            .is_ok_and(|maps| maps.lines().any(|l| l.ends_with(&needle) || l.contains(&format!("{needle} "))))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // The group first: a loaderctl child's workers die with it.
        let pgid = self.child.id() as i32;
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        self.kill();
        // SIGKILL is delivered, not done: a loaded machine may take a few
        // milliseconds to end the group's other members, which the scope's
        // sweep would then report as left alive.
        let _ = crate::wait::poll(Duration::from_secs(1), || {
            let alive = crate::scope::live_members(pgid);
            if alive.is_empty() { Ok(()) } else { Err(format!("{alive:?}")) }
        });
    }
}

/// Starts `loaderctl args` (e.g. `consume --coordinator URL ... --json`);
/// it announces no address.
pub fn loaderctl(scope: &Scope, args: &[impl AsRef<OsStr>]) -> Proc {
    let mut command = Command::new(binary("loaderctl"));
    command.args(args);
    Proc::spawn(scope, "loaderctl", command, false)
}
