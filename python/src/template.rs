//! [`WorkerTemplate`]: the trainer's handle on its worker template, the
//! process `loader._template` forks from the trainer at the first
//! `Loader.local` and keeps for the trainer's lifetime. The template has
//! already imported whatever the trainer had (torch, torchvision, the
//! dataset's module), runs one thread, and forks a worker in a few
//! milliseconds where a fresh interpreter takes seconds to import torch.
//! Embedded mode starts its workers through it ([`TemplateLauncher`], a
//! `loader_client::embedded::WorkerLauncher`), and supervises them as it
//! does any others.
//!
//! The conversation, JSON lines over a Unix socket pair (the Python half is
//! `loader/_template.py`):
//!
//! | from | line | meaning |
//! | --- | --- | --- |
//! | trainer | `{"spawn": {"argv": [..], "env_remove": [..], "env": {..}, "threads": N}}` | fork a worker running `loader-worker argv` with `env` set |
//! | trainer | the same with `"cache": {"entries": N}`, the cache's descriptor riding on the line (SCM_RIGHTS) | the worker inherits the loader's sample cache (`LOADER_SAMPLE_CACHE` names it) |
//! | template | `{"spawned": PID}` or `{"error": "why"}` | the answer to a spawn, the next line that is not an exit |
//! | trainer | `{"signal": [PID, SIGNO]}` | signal a worker the template has not yet reaped (no answer) |
//! | template | `{"exited": PID, "status": "exit status: 0"}` | a worker exited; the template reaped it |
//!
//! The template is the workers' parent, so only it can reap them; it tells
//! the trainer, and signals on the trainer's behalf only workers it has not
//! reaped, so a pid reused by another process is never signalled. When the
//! trainer goes away (the socket closes), the template stops its workers and
//! exits.

use std::collections::HashMap;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use loader_client::LoaderError;
use loader_client::embedded::{WorkerLauncher, WorkerProcess};
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use nix::unistd::Pid;
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use serde_json::{Value, json};

use crate::sample_cache::PySampleCache;

/// How long the template gets to answer a spawn: a fork takes milliseconds;
/// a template that does not answer in this time is stuck.
const SPAWN_ANSWER: Duration = Duration::from_secs(10);

/// The trainer's connection to its worker template (`loader._template`).
#[pyclass(module = "loader._native", frozen)]
#[derive(Debug)]
pub(crate) struct WorkerTemplate {
    /// The template process.
    pid: u32,
    /// Shared with every loader that starts workers through it, and with
    /// their workers, which read their exits from it.
    conn: Arc<Mutex<Conn>>,
}

#[pymethods]
impl WorkerTemplate {
    /// Takes over `fd`, the trainer's end of the socket pair to the
    /// template process `pid` (the caller gives up the fd).
    #[new]
    fn new(fd: RawFd, pid: u32) -> PyResult<Self> {
        if fd < 0 {
            return Err(PyOSError::new_err("the worker template's socket is not open"));
        }
        // SAFETY: the caller (`loader._template`) detached this descriptor
        // from its socket object and hands it over: nothing else closes it.
        let stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(Self {
            pid,
            conn: Arc::new(Mutex::new(Conn { stream, buf: Vec::new(), exited: HashMap::new(), closed: false })),
        })
    }

    /// The template process's id.
    #[getter]
    fn pid(&self) -> u32 {
        self.pid
    }

    /// False once the template has gone away (its socket closed): the next
    /// loader starts another.
    fn alive(&self) -> bool {
        let mut conn = lock(&self.conn);
        conn.pump(None);
        !conn.closed
    }
}

impl WorkerTemplate {
    /// The launcher for `LoaderBuilder::worker_launcher`: workers forked
    /// by this template under the thread policy `threads`
    /// (`loader._worker.apply_thread_policy`).
    /// `cache`: the loader's sample cache, which every worker inherits.
    pub(crate) fn launcher(&self, threads: u32, cache: Option<Py<PySampleCache>>) -> Arc<dyn WorkerLauncher> {
        Arc::new(TemplateLauncher { pid: self.pid, threads, cache, conn: Arc::clone(&self.conn) })
    }
}

/// Starts one loader's workers by asking the template to fork them.
#[derive(Debug)]
struct TemplateLauncher {
    /// The template process.
    pid: u32,
    /// The workers' thread policy.
    threads: u32,
    /// The loader's sample cache, handed to each worker.
    cache: Option<Py<PySampleCache>>,
    /// One conversation at a time: a spawn's answer is the next line that
    /// is not an exit. Shared with the workers, which read their exits
    /// from it.
    conn: Arc<Mutex<Conn>>,
}

/// The conversation, whoever panicked while holding it (it holds no
/// invariant a panic could break half-way: bytes read and notes kept).
fn lock(conn: &Mutex<Conn>) -> MutexGuard<'_, Conn> {
    conn.lock().unwrap_or_else(|p| p.into_inner())
}

/// The socket to the template and what it has said.
#[derive(Debug)]
struct Conn {
    stream: UnixStream,
    /// Bytes read after the last complete line.
    buf: Vec<u8>,
    /// Workers the template reaped, and how they exited, until asked.
    exited: HashMap<u32, String>,
    /// The template closed the socket (it exited).
    closed: bool,
}

impl Conn {
    /// Reads what the template has sent, waiting until `until` for a line
    /// that is not an exit note (returned), or not at all (None).
    fn pump(&mut self, until: Option<Instant>) -> Option<Value> {
        loop {
            if let Some(answer) = self.next_answer() {
                return Some(answer);
            }
            if self.closed {
                return None;
            }
            let wait = match until {
                None => None,
                Some(t) => match t.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return None,
                },
            };
            let blocking = wait.is_some();
            if self.stream.set_nonblocking(!blocking).is_err() || (blocking && self.stream.set_read_timeout(wait).is_err()) {
                self.closed = true;
                return None;
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => self.closed = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if !blocking {
                        return None;
                    }
                }
                Err(_) => self.closed = true,
            }
        }
    }

    /// The next complete line that is not an exit note; exit notes on the
    /// way are recorded.
    fn next_answer(&mut self) -> Option<Value> {
        while let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=end).collect();
            let Ok(value) = serde_json::from_slice::<Value>(&line) else {
                continue;
            };
            if let Some(pid) = value.get("exited").and_then(Value::as_u64) {
                let status = value.get("status").and_then(Value::as_str).unwrap_or("an unknown status");
                if let Ok(pid) = u32::try_from(pid) {
                    self.exited.insert(pid, status.to_owned());
                }
                continue;
            }
            return Some(value);
        }
        None
    }

    fn send(&mut self, value: &Value) -> std::io::Result<()> {
        self.send_with(value, None)
    }

    /// Sends `value` as one line, with descriptor `fd` riding on its first
    /// byte when given (the template takes the descriptors in the order
    /// their lines come).
    fn send_with(&mut self, value: &Value, fd: Option<RawFd>) -> std::io::Result<()> {
        let mut line = value.to_string().into_bytes();
        line.push(b'\n');
        self.stream.set_nonblocking(false)?;
        let mut sent = 0;
        if let Some(fd) = fd {
            let fds = [fd];
            let iov = [IoSlice::new(&line)];
            let control = [ControlMessage::ScmRights(&fds)];
            sent = loop {
                match sendmsg::<()>(self.stream.as_raw_fd(), &iov, &control, MsgFlags::MSG_NOSIGNAL, None) {
                    Ok(n) => break n,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(e.into()),
                }
            };
        }
        self.stream.write_all(&line[sent..])
    }
}

impl WorkerLauncher for TemplateLauncher {
    fn launch(&self, worker: usize, args: &[String], env_remove: &[&str]) -> Result<Box<dyn WorkerProcess>, LoaderError> {
        let failed = |why: String| {
            LoaderError::Embedded(format!("cannot start worker {worker} from the worker template (pid {}): {why}", self.pid))
        };
        let mut argv = vec!["loader-worker".to_owned()];
        argv.extend_from_slice(args);
        let mut conn = lock(&self.conn);
        // Exit notes already there are recorded before the answer is read.
        conn.pump(None);
        if conn.closed {
            return Err(failed("it has exited".into()));
        }
        let index = loader_client::embedded::worker_index(worker);
        let mut env = json!({ loader_client::embedded::WORKER_ID_VARIABLE: index.to_string() });
        for (name, value) in loader_client::embedded::worker_defaults() {
            env[name] = json!(value);
        }
        let mut spawn = json!({"argv": argv, "env_remove": env_remove, "env": env, "threads": self.threads});
        let cache = self.cache.as_ref().map(|c| c.get());
        if let Some(cache) = cache {
            spawn["cache"] = json!({"entries": cache.entries()});
        }
        conn.send_with(&json!({ "spawn": spawn }), cache.map(PySampleCache::raw_fd))
            .map_err(|e| failed(e.to_string()))?;
        let answer = conn.pump(Some(Instant::now() + SPAWN_ANSWER));
        drop(conn);
        let answer = answer.ok_or_else(|| failed(format!("no answer within {}s", SPAWN_ANSWER.as_secs())))?;
        match answer.get("spawned").and_then(Value::as_u64).and_then(|p| u32::try_from(p).ok()) {
            Some(pid) => Ok(Box::new(TemplateWorker { pid, conn: Arc::clone(&self.conn), exited: None })),
            None => Err(failed(answer.get("error").and_then(Value::as_str).unwrap_or("it gave no pid").to_owned())),
        }
    }

    fn describe(&self) -> String {
        format!("a fork of the worker template, pid {}", self.pid)
    }
}

/// A worker the template forked.
#[derive(Debug)]
struct TemplateWorker {
    pid: u32,
    /// The conversation with its template (its parent).
    conn: Arc<Mutex<Conn>>,
    /// How it exited, once the template said so.
    exited: Option<String>,
}


impl WorkerProcess for TemplateWorker {
    fn id(&self) -> u32 {
        self.pid
    }

    fn try_wait(&mut self) -> Option<String> {
        if self.exited.is_none() {
            let mut conn = lock(&self.conn);
            conn.pump(None);
            let note = conn.exited.remove(&self.pid);
            let orphaned = conn.closed;
            drop(conn);
            self.exited = note.or_else(|| {
                // The template is gone, so nobody will say: the pid itself
                // tells whether the worker still runs (it is nobody's child
                // now, so it cannot linger as a zombie of ours).
                (orphaned && !running(self.pid)).then(|| "an unknown status (its template exited)".to_owned())
            });
        }
        self.exited.clone()
    }

    fn signal(&mut self, signal: Signal) {
        if self.try_wait().is_some() {
            return;
        }
        let mut conn = lock(&self.conn);
        if conn.closed {
            drop(conn);
            if let Ok(pid) = i32::try_from(self.pid) {
                let _ = kill(Pid::from_raw(pid), signal);
            }
            return;
        }
        let _ = conn.send(&json!({"signal": [self.pid, signal as i32]}));
    }

    fn kill_and_reap(&mut self) {
        self.signal(Signal::SIGKILL);
        // The template reaps it; wait (briefly: SIGKILL is immediate) for
        // its note so the pid is known to be gone.
        let deadline = Instant::now() + SPAWN_ANSWER;
        while self.try_wait().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Process `pid` exists (signal 0 reaches it).
fn running(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(|pid| kill(Pid::from_raw(pid), None).is_ok())
}
