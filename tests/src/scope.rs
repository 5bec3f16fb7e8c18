//! What one test started, and the rule that it leaves nothing behind.
//!
//! [`run`] executes a test body on a thread of its own under a time limit.
//! Every process the body starts goes into the body's [`Scope`] as a process
//! group of its own. When the body ends (returns, panics or runs out of
//! time), every group is killed and reaped, and the test fails if any member
//! of any group was still alive: a worker that outlived its coordinator, or
//! the workers a `loaderctl` child started, count as much as the child itself.
//!
//! The test executable makes itself a child subreaper, so the grandchildren
//! of a killed child (e.g. the worker processes of `loaderctl run`) become
//! its own children and are reaped here rather than left to whatever pid 1
//! the container has.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Mutex, Once, PoisonError, mpsc};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// How long SIGKILLed processes get to disappear before they count as left behind.
const DEATH_GRACE: Duration = Duration::from_secs(5);
/// How long a body that ran out of time gets to unwind once its processes are killed.
const UNWIND_GRACE: Duration = Duration::from_secs(30);

/// One test at a time per test executable: the tests measure lease
/// deadlines in real time on a 2-core machine, so a neighbour spinning both
/// cores must not eat their slack.
static SERIAL: Mutex<()> = Mutex::new(());

/// The process groups one test started (one per spawned child).
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Name and group id (= the leader's pid) of every spawned child.
    groups: Arc<Mutex<Vec<(String, i32)>>>,
}

impl Scope {
    fn new() -> Scope {
        static SUBREAPER: Once = Once::new();
        SUBREAPER.call_once(|| {
            // Without it orphans go to pid 1, which may never reap them;
            // the leftover check below still works, it just cannot reap.
            if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
                eprintln!("loader-e2e: cannot become a child subreaper: {e}");
            }
        });
        Scope::default()
    }

    /// Records a child that leads its own process group.
    pub(crate) fn track(&self, name: &str, pid: u32) {
        self.lock().push((name.to_owned(), pid as i32));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, i32)>> {
        self.groups.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// SIGKILLs every group of the scope.
    fn kill_all(&self) {
        for (_, pgid) in self.lock().iter() {
            let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
        }
    }

    /// Kills and reaps every group; returns a description of each process
    /// that was still alive before the kill (empty when the test cleaned up).
    fn sweep(&self) -> Vec<String> {
        let groups = self.lock().clone();
        let mut left = Vec::new();
        for (name, pgid) in &groups {
            for (pid, comm) in live_members(*pgid) {
                left.push(format!("{comm} (pid {pid}, group of {name} {pgid})"));
            }
        }
        self.kill_all();
        let dead = crate::wait::poll(DEATH_GRACE, || {
            let mut alive = Vec::new();
            for (_, pgid) in &groups {
                reap_orphans(*pgid);
                alive.extend(live_members(*pgid));
            }
            if alive.is_empty() { Ok(()) } else { Err(format!("{alive:?}")) }
        });
        if let Err(alive) = dead {
            left.push(format!("still alive {DEATH_GRACE:?} after SIGKILL: {alive}"));
        }
        left
    }
}

/// Members of process group `pgid` that are not zombies: (pid, command name).
pub(crate) fn live_members(pgid: i32) -> Vec<(i32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|entry| {
        let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = ProcStat::read(pid)?;
        (stat.pgrp == pgid && stat.state != 'Z').then_some((pid, stat.comm))
    })
    .collect()
}

/// Reaps the zombies of group `pgid` that were re-parented to this process.
fn reap_orphans(pgid: i32) {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else { return };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if let Some(stat) = ProcStat::read(pid)
            && stat.pgrp == pgid
            && stat.ppid == me
            && stat.state == 'Z'
        {
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        }
    }
}

/// The fields of `/proc/<pid>/stat` the sweep needs.
#[derive(Debug)]
pub(crate) struct ProcStat {
    /// Command name (without the parentheses).
    pub(crate) comm: String,
    /// R, S, D, Z, ...
    pub(crate) state: char,
    pub(crate) ppid: i32,
    pub(crate) pgrp: i32,
}

impl ProcStat {
    pub(crate) fn read(pid: i32) -> Option<ProcStat> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name may hold spaces and parentheses: split at the last ')'.
        let open = text.find('(')?;
        let close = text.rfind(')')?;
        let comm = text.get(open + 1..close)?.to_owned();
        let mut rest = text.get(close + 1..)?.split_whitespace();
        let state = rest.next()?.chars().next()?;
        let ppid = rest.next()?.parse().ok()?;
        let pgrp = rest.next()?.parse().ok()?;
        Some(ProcStat { comm, state, ppid, pgrp })
    }
}

/// Runs `body` with a fresh [`Scope`], failing the test if it takes longer
/// than `limit` or leaves a process alive. On timeout every process of the
/// scope is killed first, which unblocks a body waiting on them.
pub fn run<T: Send + 'static>(limit: Duration, body: impl FnOnce(Scope) -> T + Send + 'static) -> T {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let scope = Scope::new();
    let (done_tx, done_rx) = mpsc::channel();
    let inner = scope.clone();
    let thread = std::thread::Builder::new()
        .name("e2e-body".into())
        .spawn(move || {
            let result = catch_unwind(AssertUnwindSafe(|| body(inner)));
            let _ = done_tx.send(());
            result
        })
        .expect("spawn the test body");
    let timed_out = done_rx.recv_timeout(limit).is_err();
    if timed_out {
        scope.kill_all();
        if done_rx.recv_timeout(UNWIND_GRACE).is_err() {
            let left = scope.sweep();
            panic!(
                "test did not finish within {limit:?}, nor {UNWIND_GRACE:?} after its processes were killed; left: {left:?}"
            );
        }
    }
    let result = thread.join().unwrap_or_else(|p| resume_unwind(p));
    let left = scope.sweep();
    match result {
        _ if timed_out => {
            let ended = match &result {
                Ok(_) => "then returned".to_owned(),
                Err(panic) => format!("then panicked: {}", panic_message(panic.as_ref())),
            };
            panic!("test did not finish within {limit:?}; its processes were killed and it {ended}")
        }
        Err(panic) => {
            if !left.is_empty() {
                eprintln!("loader-e2e: the failed test also left processes alive: {left:?}");
            }
            resume_unwind(panic)
        }
        Ok(_) if !left.is_empty() => panic!("test left processes alive: {left:?}"),
        Ok(value) => value,
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)")
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::Duration;

    use super::run;
    use crate::proc::Proc;
    use crate::wait::wait_until;

    /// A child that starts a grandchild and prints the grandchild's pid.
    fn shell_with_grandchild(scope: &super::Scope) -> (Proc, i32) {
        let mut command = Command::new("sh");
        command.args(["-c", "sleep 60 & echo $!; wait"]);
        let proc = Proc::spawn(scope, "sh", command, false);
        wait_until("the shell printed its child's pid", Duration::from_secs(5), || !proc.stdout().is_empty());
        let pid = proc.stdout()[0].parse().expect("pid");
        (proc, pid)
    }

    #[test]
    fn a_dropped_child_takes_its_grandchildren_along_and_they_are_reaped() {
        let grandchild = run(Duration::from_secs(20), |scope| shell_with_grandchild(&scope).1);
        assert!(
            !std::path::Path::new(&format!("/proc/{grandchild}")).exists(),
            "the grandchild {grandchild} is still there (alive or an unreaped zombie)"
        );
    }

    #[test]
    #[should_panic(expected = "test left processes alive")]
    fn a_process_left_running_fails_the_test() {
        run(Duration::from_secs(20), |scope| std::mem::forget(shell_with_grandchild(&scope).0));
    }
}
