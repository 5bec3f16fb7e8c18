//! What the background tasks (session, routes, fetch streams) tell the
//! consumer, and the credit that travels with each batch back to its stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use loader_proto::pb::FetchRequest;
use loader_ring::trainer::SlotCredit;
use loader_ring::wake::WaitSet;
use tokio::sync::mpsc;

use crate::batch::Batch;
use crate::error::LoaderError;

/// One message to the consumer.
#[derive(Debug)]
pub(crate) enum Event {
    /// A validated batch, and the credit to return once it is yielded.
    Batch(Batch, Credit),
    /// The session cannot go on (job failed, bad frame, lost job): yielded
    /// to the user, then the iterator ends.
    Fatal(LoaderError),
}

/// The background tasks' end of the channel to the consumer. Unbounded
/// because credits already bound it: a stream only sends what it was
/// granted, and the consumer only grants back what it yielded.
#[derive(Debug, Clone)]
pub(crate) struct EventTx {
    /// The channel.
    tx: mpsc::UnboundedSender<Event>,
    /// Rung after each send, in case the consumer sleeps in it.
    wait: Arc<WaitSet>,
}

/// The consumer's end.
pub(crate) type EventRx = mpsc::UnboundedReceiver<Event>;

/// The consumer is gone: the event was dropped.
#[derive(Debug)]
pub(crate) struct ConsumerGone;

/// A channel to a consumer that sleeps in `wait` when it blocks.
pub(crate) fn channel(wait: Arc<WaitSet>) -> (EventTx, EventRx) {
    let (tx, rx) = mpsc::unbounded_channel();
    (EventTx { tx, wait }, rx)
}

impl EventTx {
    /// Sends `event` and wakes the consumer if it sleeps.
    pub(crate) fn send(&self, event: Event) -> Result<(), ConsumerGone> {
        self.tx.send(event).map_err(|_| ConsumerGone)?;
        self.wait.ring();
        Ok(())
    }
}

/// The sending side of one `Fetch` stream's credit messages, and how many
/// credits the worker currently holds on it.
#[derive(Debug, Clone)]
pub(crate) struct CreditLine {
    /// Feeds the stream's request half; closed when the stream is gone, so
    /// credits for a dead stream vanish harmlessly.
    tx: mpsc::UnboundedSender<FetchRequest>,
    /// Granted minus received: zero means the worker cannot send.
    held: Arc<AtomicU32>,
}

impl CreditLine {
    /// A line over `tx`, with nothing granted yet.
    pub(crate) fn new(tx: mpsc::UnboundedSender<FetchRequest>) -> Self {
        Self {
            tx,
            held: Arc::new(AtomicU32::new(0)),
        }
    }

    /// Sends `request` (the first message) and counts its credits.
    pub(crate) fn open(&self, request: FetchRequest) {
        self.held.fetch_add(request.credits, Ordering::Relaxed);
        let _closed = self.tx.send(request);
    }

    /// Grants `n` more credits.
    pub(crate) fn grant(&self, n: u32) {
        self.open(FetchRequest {
            credits: n,
            ..Default::default()
        });
    }

    /// Records that a frame arrived, spending one credit.
    pub(crate) fn spent(&self) {
        let _ = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                Some(h.saturating_sub(1))
            });
    }

    /// Credits the worker holds right now.
    pub(crate) fn held(&self) -> u32 {
        self.held.load(Ordering::Relaxed)
    }
}

/// Which stream or ring connection a credit belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    /// A `Fetch` stream, by the address of its shared credit counter.
    Stream(usize),
    /// A ring connection.
    Ring(loader_ring::trainer::ConnId),
}

/// One credit owed to the stream or ring connection a batch came from.
#[derive(Debug)]
pub(crate) enum Credit {
    /// A `Fetch` stream's.
    Stream(CreditLine),
    /// A ring connection's: it may be granted another slot.
    Slot(SlotCredit),
    /// Already given back (the batch was copied out of its slot early).
    Returned,
}

impl From<SlotCredit> for Credit {
    /// The credit of a batch the ring's inbox read.
    fn from(credit: SlotCredit) -> Self {
        Credit::Slot(credit)
    }
}

impl Credit {
    /// The credit for a frame just received on `line`.
    pub(crate) fn for_frame(line: &CreditLine) -> Self {
        line.spent();
        Credit::Stream(line.clone())
    }

    /// Returns the credit: the batch was yielded (or dropped as a duplicate).
    pub(crate) fn give_back(self) {
        match self {
            Credit::Stream(line) => line.grant(1),
            Credit::Slot(credit) => credit.give_back(),
            Credit::Returned => {}
        }
    }

    /// Where the credit goes back to; None once given back.
    pub(crate) fn source(&self) -> Option<Source> {
        match self {
            Credit::Stream(line) => Some(Source::Stream(Arc::as_ptr(&line.held) as usize)),
            Credit::Slot(credit) => Some(Source::Ring(credit.conn())),
            Credit::Returned => None,
        }
    }

    /// Gives the credit back before the batch is yielded.
    pub(crate) fn give_back_early(&mut self) {
        std::mem::replace(self, Credit::Returned).give_back();
    }
}
