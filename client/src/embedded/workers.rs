//! Embedded mode's worker processes: finding the executable, starting N of
//! them against the embedded coordinator, draining their stdout, noticing an
//! early exit, and stopping them (SIGTERM, then SIGKILL) when dropped.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::LoaderError;

/// Environment variable naming the worker executable.
pub const WORKER_BIN_ENV: &str = "LOADER_WORKER_BIN";
/// File name of the worker executable.
const WORKER_BIN: &str = "loader-worker";
/// Time between SIGTERM and SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// Where the worker command may come from, gathered by the caller so the
/// resolution itself reads no process state (and tests set none).
#[derive(Debug, Default, Clone)]
pub(crate) struct CommandSources {
    /// An explicit command (program and leading arguments).
    pub(crate) explicit: Option<Vec<OsString>>,
    /// The value of `LOADER_WORKER_BIN`.
    pub(crate) env: Option<OsString>,
    /// `std::env::current_exe()`.
    pub(crate) current_exe: Option<PathBuf>,
    /// The value of `PATH`.
    pub(crate) path: Option<OsString>,
}

impl CommandSources {
    /// The sources of this process.
    pub(crate) fn from_process(explicit: Option<Vec<OsString>>) -> Self {
        Self {
            explicit,
            env: std::env::var_os(WORKER_BIN_ENV).filter(|v| !v.is_empty()),
            current_exe: std::env::current_exe().ok(),
            path: std::env::var_os("PATH"),
        }
    }

    /// The worker command: the explicit one; else `LOADER_WORKER_BIN`; else
    /// `loader-worker` next to the current executable or in its parent
    /// directory (test binaries live in `target/<profile>/deps`); else
    /// `loader-worker` on `PATH`.
    pub(crate) fn resolve(self) -> Result<Vec<OsString>, LoaderError> {
        if let Some(cmd) = self.explicit.filter(|c| !c.is_empty()) {
            return Ok(cmd);
        }
        if let Some(bin) = self.env {
            return Ok(vec![bin]);
        }
        let beside_exe = self
            .current_exe
            .as_deref()
            .and_then(Path::parent)
            .into_iter()
            .flat_map(|dir| {
                let parent = dir.parent().map(Path::to_path_buf);
                std::iter::once(dir.to_path_buf()).chain(parent)
            });
        let on_path = self
            .path
            .iter()
            .flat_map(std::env::split_paths)
            .collect::<Vec<_>>();
        beside_exe
            .chain(on_path)
            .map(|dir| dir.join(WORKER_BIN))
            .find(|p| is_executable(p))
            .map(|p| vec![p.into_os_string()])
            .ok_or_else(|| {
                LoaderError::Embedded(format!(
                    "cannot find the {WORKER_BIN} executable for embedded mode: build it \
                     (`cargo build -p loader-worker`), set {WORKER_BIN_ENV}=/path/to/{WORKER_BIN}, \
                     put it on PATH, or pass a worker command"
                ))
            })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The worker processes of one embedded deployment.
#[derive(Debug)]
pub(crate) struct WorkerProcesses {
    /// The command, for error messages.
    command: Vec<OsString>,
    /// Started processes, in order.
    children: Vec<Child>,
}

impl WorkerProcesses {
    /// Starts `count` workers of `command` against `coordinator`, each
    /// listening on a port of its own on 127.0.0.1.
    pub(crate) fn spawn(
        command: Vec<OsString>,
        coordinator: &str,
        count: usize,
    ) -> Result<Self, LoaderError> {
        let mut procs = WorkerProcesses {
            command,
            children: Vec::with_capacity(count),
        };
        for i in 0..count {
            let Some((program, leading)) = procs.command.split_first() else {
                return Err(LoaderError::Embedded("the worker command is empty".into()));
            };
            let mut child = Command::new(program)
                .args(leading)
                .args(["--coordinator", coordinator, "--listen", "127.0.0.1:0"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| {
                    LoaderError::Embedded(format!(
                        "cannot start worker {} ({}): {e}",
                        i + 1,
                        display(program)
                    ))
                })?;
            if let Some(stdout) = child.stdout.take() {
                drain(i + 1, stdout);
            }
            // Pushed at once so a failure below still stops this one.
            procs.children.push(child);
        }
        Ok(procs)
    }

    /// The workers' process ids, in start order.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// An error naming the first worker that has exited.
    pub(crate) fn check(&mut self) -> Result<(), LoaderError> {
        let count = self.children.len();
        for (i, child) in self.children.iter_mut().enumerate() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(LoaderError::Embedded(format!(
                    "worker {} of {count} ({}) exited early with {status}",
                    i + 1,
                    self.command
                        .iter()
                        .map(|a| display(a))
                        .collect::<Vec<_>>()
                        .join(" ")
                )));
            }
        }
        Ok(())
    }
}

impl Drop for WorkerProcesses {
    fn drop(&mut self) {
        for child in &self.children {
            if let Ok(pid) = i32::try_from(child.id()) {
                // Already gone is fine: it is reaped below either way.
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + TERM_GRACE;
        for child in &mut self.children {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }
}

/// Reads a worker's stdout so it never blocks on a full pipe; its
/// `listening <addr>` line is logged.
fn drain(n: usize, stdout: std::process::ChildStdout) {
    let spawned = std::thread::Builder::new()
        .name(format!("loader-worker-{n}-stdout"))
        .spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(line) => tracing::debug!(worker = n, "{line}"),
                    Err(_) => break,
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(worker = n, error = %e, "cannot drain worker stdout");
    }
}

fn display(s: &OsStr) -> String {
    s.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_bin(dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(WORKER_BIN);
        std::fs::write(&p, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    }

    #[test]
    fn resolution_order() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let deps = tmp.path().join("debug/deps");
        std::fs::create_dir_all(&deps).expect("mkdir");
        let bin = fake_bin(&tmp.path().join("debug"));
        let exe = Some(deps.join("some_test-1234"));

        let explicit = CommandSources {
            explicit: Some(vec!["x".into(), "__worker".into()]),
            env: Some("y".into()),
            ..Default::default()
        };
        assert_eq!(
            explicit.resolve().expect("explicit"),
            vec![OsString::from("x"), "__worker".into()]
        );
        let env = CommandSources {
            env: Some("y".into()),
            current_exe: exe.clone(),
            ..Default::default()
        };
        assert_eq!(env.resolve().expect("env"), vec![OsString::from("y")]);
        let parent = CommandSources {
            current_exe: exe,
            ..Default::default()
        };
        assert_eq!(
            parent.resolve().expect("parent dir"),
            vec![bin.into_os_string()]
        );

        let other = tempfile::tempdir().expect("tempdir");
        let on_path = fake_bin(other.path());
        let path = CommandSources {
            current_exe: Some(tmp.path().join("nowhere/exe")),
            path: Some(other.path().as_os_str().to_owned()),
            ..Default::default()
        };
        assert_eq!(
            path.resolve().expect("PATH"),
            vec![on_path.into_os_string()]
        );
    }

    #[test]
    fn missing_worker_says_how_to_fix_it() {
        // Nested two deep, so neither directory searched beside the
        // executable is the shared temporary directory itself.
        let tmp = tempfile::tempdir().expect("tempdir");
        let bin_dir = tmp.path().join("target/debug");
        std::fs::create_dir_all(&bin_dir).expect("mkdir");
        let none = CommandSources {
            current_exe: Some(bin_dir.join("exe")),
            path: Some(bin_dir.as_os_str().to_owned()),
            ..Default::default()
        };
        let e = none.resolve().expect_err("nothing to find").to_string();
        assert!(
            e.contains(WORKER_BIN_ENV) && e.contains("cargo build -p loader-worker"),
            "{e}"
        );
    }

    #[test]
    fn early_exit_is_named() {
        let mut procs =
            WorkerProcesses::spawn(vec!["false".into()], "http://127.0.0.1:1", 1).expect("spawn");
        let started = Instant::now();
        loop {
            match procs.check() {
                Err(e) => {
                    let e = e.to_string();
                    assert!(e.starts_with("worker 1 of 1 (false) exited early"), "{e}");
                    break;
                }
                Ok(()) => {
                    assert!(
                        started.elapsed() < Duration::from_secs(5),
                        "false did not exit"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
}
