//! The worker's half of the ring's doorbell ([`crate::doorbell`]):
//! after each filled report on the socket, count it in the shared page and
//! write the trainer's eventfd when the trainer asked to be woken at that
//! count. Rings whose trainer offered no doorbell skip all of it: their
//! trainer wakes on the socket itself.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::slots::Mapping;

/// The doorbell of one attached ring.
#[derive(Debug)]
pub(crate) struct Bell {
    /// Holds the page; `Mapping::doorbell` is `Some` for this mapping.
    mapping: Arc<Mapping>,
    /// The trainer's eventfd (checked to be one at attach).
    eventfd: OwnedFd,
}

impl Bell {
    /// The doorbell of `mapping`, if it has one and an eventfd came with it.
    pub(crate) fn new(mapping: Arc<Mapping>, eventfd: Option<OwnedFd>) -> Option<Self> {
        let eventfd = eventfd?;
        mapping.doorbell()?;
        Some(Self { mapping, eventfd })
    }

    /// One filled report is in the socket: counts it, and wakes the trainer
    /// if this was the report it waits for.
    pub(crate) fn reported(&self) {
        let Some(doorbell) = self.mapping.doorbell() else {
            return;
        };
        if doorbell.count_report()
            && let Err(e) = nix::unistd::write(&self.eventfd, &1u64.to_ne_bytes())
        {
            // Full (never: the trainer drains it on every wake-up) or the
            // trainer is gone; its own deadline wakes it either way.
            tracing::debug!("cannot ring the trainer's doorbell: {e}");
        }
    }
}
