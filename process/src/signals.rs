//! SIGTERM and SIGINT: how a process is asked to stop (Kubernetes sends
//! SIGTERM, a terminal SIGINT). Servers resolve [`StopSignals::recv`] into
//! their shutdown future; `loaderctl` records which one came to exit with
//! the shell's code for it.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// Which stop signal arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM (15).
    Term,
    /// SIGINT (2).
    Int,
}

impl StopSignal {
    /// The signal's number.
    pub fn number(self) -> i32 {
        match self {
            StopSignal::Term => libc::SIGTERM,
            StopSignal::Int => libc::SIGINT,
        }
    }
}

/// Handlers for SIGTERM and SIGINT. From [`StopSignals::install`] on, the
/// two no longer end the process by themselves.
#[derive(Debug)]
pub struct StopSignals {
    /// SIGTERM's stream.
    term: Signal,
    /// SIGINT's stream.
    int: Signal,
}

impl StopSignals {
    /// Installs the handlers; needs a tokio runtime with I/O enabled.
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves when either signal arrives.
    pub async fn recv(&mut self) -> StopSignal {
        tokio::select! {
            _ = self.term.recv() => StopSignal::Term,
            _ = self.int.recv() => StopSignal::Int,
        }
    }
}

/// Resolves on SIGTERM or SIGINT: a server's shutdown future. Where the
/// handlers cannot be installed it never resolves, and the signals keep
/// their default action (the process still stops, only less cleanly).
pub async fn stop_requested() {
    match StopSignals::install() {
        Ok(mut signals) => {
            signals.recv().await;
        }
        Err(e) => {
            tracing::warn!("cannot handle SIGTERM/SIGINT, they will end the process at once: {e}");
            std::future::pending::<()>().await;
        }
    }
}
