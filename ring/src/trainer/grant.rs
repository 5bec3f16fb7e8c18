//! The writing half of one worker's ring socket: grants go out from
//! whichever thread frees or credits a slot, straight into the socket,
//! without waking a task to write them.
//!
//! The line lives in the book's account of the connection, so grants are
//! encoded and sent under the book's lock: frames from two threads can never
//! interleave, and every grant the book makes in one change goes out in one
//! `send`. Sends never block (`MSG_DONTWAIT`): a grant is a dozen bytes and
//! a worker holds at most its fair share of them, so the socket's buffer is
//! practically never full; if it is, the rest waits in `unsent` and the
//! consumer is told when the socket is writable again (see
//! [`crate::wake::WaitSet::rewatch`]), which calls [`GrantLine::flush`].

use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use loader_proto::pb::{RingToWorker, SlotGrant, SlotReclaim, ring_to_worker};
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, send};

use super::conn_id::ConnId;
use crate::frame::encode_into;
use crate::wake::WaitSet;

/// Grants on their way to one worker.
#[derive(Debug)]
pub(crate) struct GrantLine {
    /// The worker's socket, shared with the consumer's read side.
    socket: Arc<UnixStream>,
    /// Encoded grants the socket has not taken yet.
    unsent: Vec<u8>,
    /// Grants pushed since the last flush: the worker does not know them.
    queued: u32,
    /// `unsent` waits for the socket to become writable: the wait set
    /// reports writability for this connection.
    blocked: bool,
    /// The socket failed: the worker is gone. Grants are dropped until the
    /// read side sees the close and the book closes the account (which
    /// reclaims the slots: only then is nothing writing them).
    broken: bool,
    /// Where writability is asked for while blocked.
    wait: Arc<WaitSet>,
    /// The connection's id, its token in the wait set.
    conn: ConnId,
}

impl GrantLine {
    /// A line to the worker at the other end of `socket`, which must be in
    /// non-blocking mode.
    pub(crate) fn new(socket: Arc<UnixStream>, wait: Arc<WaitSet>, conn: ConnId) -> Self {
        Self {
            socket,
            unsent: Vec::new(),
            queued: 0,
            blocked: false,
            broken: false,
            wait,
            conn,
        }
    }

    /// Whether grants can still reach the worker.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// Grants pushed and not flushed yet.
    pub(crate) fn queued(&self) -> u32 {
        self.queued
    }

    /// Queues one grant; [`GrantLine::flush`] sends it.
    pub(crate) fn push(&mut self, grant: SlotGrant) {
        if self.broken {
            return;
        }
        let msg = RingToWorker {
            msg: Some(ring_to_worker::Msg::Grant(grant)),
        };
        encode_into(&msg, &mut self.unsent);
        self.queued += 1;
    }

    /// Queues a request for up to `count` unused grants back (see
    /// `SlotReclaim`); [`GrantLine::flush`] sends it.
    pub(crate) fn reclaim(&mut self, count: u32) {
        if self.broken {
            return;
        }
        let msg = RingToWorker {
            msg: Some(ring_to_worker::Msg::Reclaim(SlotReclaim { count })),
        };
        encode_into(&msg, &mut self.unsent);
    }

    /// Sends what is queued, as far as the socket takes it without blocking
    /// (the rest goes when the socket is writable again).
    pub(crate) fn flush(&mut self) {
        self.queued = 0;
        if self.broken || self.unsent.is_empty() {
            return;
        }
        let fd = self.socket.as_raw_fd();
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        let mut sent = 0;
        let outcome = loop {
            match send(fd, &self.unsent[sent..], flags) {
                Ok(n) => {
                    sent += n;
                    if sent == self.unsent.len() {
                        break Ok(());
                    }
                }
                Err(Errno::EINTR) => {}
                Err(e) => break Err(e),
            }
        };
        self.unsent.drain(..sent);
        match outcome {
            Ok(()) => self.watch_writable(false),
            Err(Errno::EAGAIN) => self.watch_writable(true),
            Err(e) => {
                tracing::debug!(
                    conn = self.conn,
                    "cannot write grants to a ring worker: {e}"
                );
                self.broken = true;
                self.unsent = Vec::new();
                self.watch_writable(false);
            }
        }
    }

    fn watch_writable(&mut self, writable: bool) {
        if self.blocked == writable {
            return;
        }
        match self.wait.rewatch(self.socket.as_fd(), self.conn, writable) {
            Ok(()) => self.blocked = writable,
            Err(e) => {
                // A socket not watched yet (the inbox flushes once it is) or
                // no more (closed): the next flush tries again, if any.
                self.blocked = false;
                tracing::debug!(
                    conn = self.conn,
                    "cannot change what is watched on a ring socket: {e}"
                );
            }
        }
    }
}
