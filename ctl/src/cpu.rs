//! CPU clocks for the consuming loop's report: the process's CPU time, and
//! the part of it spent on threads of one name (the embedded coordinator's,
//! which `run` hosts in the trainer's process but a real deployment does
//! not, so the trainer's own cost is the difference).

use std::time::Duration;

use anyhow::Context;
use nix::sys::resource::{UsageWho, getrusage};

/// CPU time (user + sys) this process has used so far, exited threads
/// included.
pub(super) fn process() -> anyhow::Result<Duration> {
    let usage = getrusage(UsageWho::RUSAGE_SELF).context("getrusage")?;
    let micros = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    Ok(micros(usage.user_time()) + micros(usage.system_time()))
}

/// CPU time used so far by this process's live threads named `name`
/// (compared as the kernel keeps it: the first 15 bytes), from each
/// thread's `schedstat` (nanoseconds on the CPU). None when the kernel
/// does not keep `schedstat`. A thread that exits drops out of the sum, so
/// a difference of two readings can only undercount these threads.
pub(super) fn threads_named(name: &str) -> Option<Duration> {
    std::fs::metadata("/proc/self/schedstat").ok()?;
    let comm = &name.as_bytes()[..name.len().min(15)];
    let mut total = Duration::ZERO;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let dir = task.path();
        let Ok(found) = std::fs::read(dir.join("comm")) else {
            continue;
        };
        if found.strip_suffix(b"\n").unwrap_or(&found) != comm {
            continue;
        }
        // Unreadable: the thread exited meanwhile.
        let Ok(stat) = std::fs::read_to_string(dir.join("schedstat")) else {
            continue;
        };
        let ns = stat.split_whitespace().next()?.parse::<u64>().ok()?;
        total += Duration::from_nanos(ns);
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread named here that spins for a while shows up under its name
    /// and nowhere else, and no more than the process used.
    #[test]
    fn a_named_thread_is_counted_under_its_name() {
        let before = threads_named("cpu-test-spin").expect("schedstat");
        assert_eq!(before, Duration::ZERO, "no such thread yet");
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let spinner = std::thread::Builder::new()
            .name("cpu-test-spin".into())
            .spawn(move || {
                let start = std::time::Instant::now();
                let mut x = 0u64;
                while start.elapsed() < Duration::from_millis(50) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
                }
                ready_tx.send(()).expect("send");
                // Alive while measured: exited threads drop out.
                let _ = done_rx.recv();
            })
            .expect("spawn");
        ready_rx.recv().expect("spun");
        let spun = threads_named("cpu-test-spin").expect("schedstat");
        let all = process().expect("process");
        done_tx.send(()).expect("send");
        spinner.join().expect("join");
        assert!(spun >= Duration::from_millis(1), "{spun:?}");
        assert!(
            spun <= all + Duration::from_millis(20),
            "{spun:?} of {all:?}"
        );
        assert_eq!(threads_named("no-such-thread"), Some(Duration::ZERO));
    }
}
