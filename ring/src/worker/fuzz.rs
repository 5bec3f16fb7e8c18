//! Entry points for the fuzz target (`fuzz/`), not an API: the worker's
//! checks of what a trainer sends on its ring socket after the handshake
//! (the attach message's geometry against the memfd, then grants and
//! reclaims), over a real memfd mapping, without a socket.

use std::fs::File;

use loader_proto::pb::{RingAttach, RingToWorker, ring_to_worker};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::slots::{Mapping, Outgoing, SlotLease, Slots};
use crate::frame::RingGeometry;

/// Largest memfd a target makes: a geometry asking for more finds the memfd
/// short, which `Mapping::new` must refuse.
pub const MAX_MEMFD: u64 = 1 << 20;

/// One connection's slots after an attach, fed the trainer's messages as
/// the connection's loop would.
#[derive(Debug)]
pub struct WorkerRing {
    /// The book of the connection's slots.
    slots: Slots,
    /// Where leases report their end.
    tx: UnboundedSender<Outgoing>,
    /// The reports, settled as the connection settles them.
    rx: UnboundedReceiver<Outgoing>,
    /// The memfd, kept open like the worker keeps it.
    _memfd: File,
    /// Leases taken so far.
    leases: u64,
}

impl WorkerRing {
    /// Maps `memfd` (the target sizes it, at most [`MAX_MEMFD`]) with the
    /// geometry `attach` gives, as the worker does after the handshake.
    pub fn attach(attach: &RingAttach, memfd: File) -> Result<Self, String> {
        let geometry = RingGeometry { slot_size: attach.slot_size, slot_count: attach.slot_count };
        let mapping = Mapping::new(&memfd, geometry, attach.doorbell).map_err(|e| e.to_string())?;
        if let Some(bell) = mapping.doorbell() {
            let _ = bell.reported();
        }
        let (tx, rx) = unbounded_channel();
        Ok(Self { slots: Slots::new(mapping), tx, rx, _memfd: memfd, leases: 0 })
    }

    /// Handles one message from the trainer as the connection's loop does;
    /// `write` says, for each lease the producer then takes (numbered from
    /// 0 over the connection), how many bytes it writes (None: it gives the
    /// lease up). An error is the
    /// protocol error that ends the connection.
    pub fn on_message(&mut self, msg: RingToWorker, mut write: impl FnMut(u64) -> Option<u64>) -> Result<(), String> {
        match msg.msg {
            Some(ring_to_worker::Msg::Grant(g)) => {
                self.slots.grant(g.slot, g.generation).map_err(|e| e.to_string())?;
                while let Some(lease) = self.slots.take(&self.tx) {
                    self.collate(lease, &mut write);
                }
            }
            Some(ring_to_worker::Msg::Reclaim(r)) => {
                let count = usize::try_from(r.count).unwrap_or(usize::MAX);
                let _ = self.slots.take_unused_upto(count);
            }
            Some(ring_to_worker::Msg::Attach(_)) => return Err("a second attach message".into()),
            None => return Err("an empty or unknown message".into()),
        }
        self.settle();
        Ok(())
    }

    /// Gives back every grant, as a stopping worker does.
    pub fn stop(&mut self) -> usize {
        let n = self.slots.take_unused().len();
        self.settle();
        n
    }

    fn collate(&mut self, mut lease: SlotLease, write: &mut impl FnMut(u64) -> Option<u64>) {
        let n = self.leases;
        self.leases += 1;
        let Some(len) = write(n) else {
            return; // dropped: reported returned
        };
        let bytes = lease.bytes_mut();
        let len = len.min(bytes.len() as u64);
        // Touch both ends of what is written: the slot's whole range must be
        // mapped and this lease's alone.
        if let Some(b) = bytes.first_mut() {
            *b = 0x4c;
        }
        if let Some(b) = bytes.get_mut((len as usize).saturating_sub(1)) {
            *b = 0x42;
        }
        lease.fill(len, n, (0, 0), String::new());
    }

    /// Settles every ended lease, as the connection does before it reports.
    fn settle(&mut self) {
        while let Ok(out) = self.rx.try_recv() {
            match out {
                Outgoing::Filled { slot, generation, .. } | Outgoing::Returned { slot, generation } => {
                    self.slots.settle(slot, generation);
                }
            }
        }
    }
}
