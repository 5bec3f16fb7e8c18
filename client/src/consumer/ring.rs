//! The shared-memory ring's part in a wait: before it, the workers are
//! asked to ring the doorbell after as many reports as the pace plans
//! (`ring::Pace`), so a sleeping consumer is woken once per few batches;
//! after it, every ring socket is read (reports become batches, grants
//! that waited go out). For the async front, the wait set is registered
//! with the caller's runtime and awaited there.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use loader_ring::wake::{Ready, WaitFd, WaitSet};
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

use crate::batch::Batch;
use crate::error::LoaderError;

use super::{Consumer, accept};

/// The ring's part in a wait.
pub(super) enum RingWait {
    /// No ring.
    Off,
    /// Reports are in that were not read: read instead of sleeping.
    Unread,
    /// The workers ring after enough reports; read by the deadline, if any,
    /// whatever came.
    Armed(Option<Instant>),
}

impl Consumer {
    /// Registers the wait set with the caller's runtime, the first time an
    /// async `next` waits on a ring.
    pub(super) fn register_async_wait(&mut self) -> io::Result<()> {
        if self.inbox.is_some() && self.async_wait.is_none() {
            self.async_wait = Some(WaitFd::register(Arc::clone(&self.wait))?);
        }
        Ok(())
    }

    /// Before a wait: asks the ring's workers to ring after the reports the
    /// pace plans for (see `ring::pace`), unless some are in already.
    pub(super) fn arm_ring(&mut self, now: Instant) -> RingWait {
        let Some(inbox) = &self.inbox else {
            return RingWait::Off;
        };
        if inbox.unread() {
            return RingWait::Unread;
        }
        let received = self.yielded + self.reorder.len() as u64;
        let plan = self
            .pace
            .plan(inbox.in_flight(), self.total.saturating_sub(received));
        if !inbox.arm(plan.reports) {
            return RingWait::Unread;
        }
        self.pace.waiting(now, plan);
        RingWait::Armed(plan.hold.map(|hold| now + hold))
    }

    /// After a wait, whatever ended it.
    pub(super) fn disarm_ring(&self) {
        if let Some(inbox) = &self.inbox {
            inbox.disarm();
        }
    }

    /// Reads every ring socket: reports become batches, writable sockets
    /// take the grants that waited for them. Returns the batches read.
    pub(super) fn read_ring(&mut self) -> Result<u64, LoaderError> {
        let Some(inbox) = self.inbox.as_ref() else {
            return Ok(0);
        };
        if !self.ready.writable.is_empty() {
            inbox.flush(&self.ready.writable);
            self.ready.writable.clear();
        }
        let reorder = &mut self.reorder;
        let Some(expected) = self.expected.as_ref() else {
            return Ok(0);
        };
        let filled = inbox.read_all(|filled| Batch::from_filled(filled, expected), |batch, credit| accept(reorder, batch, credit))?;
        self.pace.read(Instant::now(), filled);
        Ok(filled)
    }
}

/// Waits until the ring's doorbell rings (the reports asked for are in) or
/// one of its sockets hangs up, for an async consumer. Readiness is cleared
/// only once the wait set was seen empty.
pub(super) async fn ring_ready(
    fd: Option<&AsyncFd<WaitFd>>,
    wait: &WaitSet,
    ready: &mut Ready,
) -> io::Result<()> {
    let Some(fd) = fd else {
        return std::future::pending().await;
    };
    loop {
        let mut guard = fd.readable().await?;
        wait.wait(Duration::ZERO, false, || false, ready)?;
        if !ready.timed_out {
            return Ok(());
        }
        guard.clear_ready();
    }
}
