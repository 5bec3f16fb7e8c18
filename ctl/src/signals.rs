//! SIGTERM and SIGINT for `run` and `consume`: instead of dying at once
//! (leaving embedded workers to live on until their leases expire), the
//! consuming loop stops at its next batch or wait tick, the loader is
//! dropped (which stops the workers it started and closes its session),
//! generated files go with their owners, and the process exits with the
//! shell's code for the signal (143 for SIGTERM, 130 for SIGINT). Kubernetes
//! stops pods with SIGTERM.

use std::sync::atomic::{AtomicI32, Ordering};

use loader_process::signals::StopSignals;

const SIGTERM: i32 = nix::sys::signal::Signal::SIGTERM as i32;
const SIGINT: i32 = nix::sys::signal::Signal::SIGINT as i32;

/// The signal received, 0 for none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// The loop was stopped by a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stopped by {}", name(*.0))]
pub(crate) struct Stopped(pub(crate) i32);

impl Stopped {
    /// The exit code a shell reports for a process killed by the signal.
    pub(crate) fn exit_code(self) -> u8 {
        u8::try_from(128 + self.0).unwrap_or(1)
    }
}

fn name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        _ => "a signal",
    }
}

/// Starts watching for SIGTERM and SIGINT on the background runtime; from then
/// on they no longer end the process by themselves.
pub(crate) fn watch() -> anyhow::Result<()> {
    let runtime = loader_process::runtime::background().map_err(|e| anyhow::anyhow!("cannot watch for signals: {e}"))?;
    // Registered here, before any worker starts: no window in which a
    // signal still kills the process outright.
    let mut signals = runtime.block_on(async { StopSignals::install() })?;
    runtime.spawn(async move {
        let got = signals.recv().await;
        RECEIVED.store(got.number(), Ordering::SeqCst);
    });
    Ok(())
}

/// `Err(Stopped)` once a signal arrived.
pub(crate) fn check() -> Result<(), Stopped> {
    match RECEIVED.load(Ordering::Relaxed) {
        0 => Ok(()),
        signal => Err(Stopped(signal)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_the_shells() {
        assert_eq!(Stopped(SIGTERM).exit_code(), 143);
        assert_eq!(Stopped(SIGINT).exit_code(), 130);
        assert_eq!(Stopped(SIGTERM).to_string(), "stopped by SIGTERM");
    }
}
