//! Sessions whose trainer is gone before their lease says so.
//!
//! A session is renewed by its trainer's heartbeats and expires a lease
//! after the last one. A resumed run (a spec with `resume`) may replace its
//! job only when no session is left on it, so a run restarted after its
//! trainers were killed would wait a lease for them. But a killed process's
//! sockets close at once: when the connection a session was last heard on
//! has ended and nothing came from the session since, its trainer is gone
//! (or cut off, and then it reopens on its next heartbeat, as after an
//! expiry), and the resumed run need not wait for it
//! (`loader_process::grpc::connections`).
//!
//! Only the resume uses this evidence; everything else still waits for the
//! lease, which a proxy between trainer and coordinator (whose own
//! connection outlives the trainer's) cannot fool either way.

use loader_process::grpc::{Connection, Connections};

use super::{Coordinator, Tables, end_sessions};

impl Coordinator {
    /// Records the connection a call of `session_id` came on (open,
    /// heartbeat), so that its end can later tell that the trainer left.
    pub(crate) fn seen_on(&self, session_id: u64, connection: Option<Connection>) {
        if let Some(s) = self.lock().sessions.sessions.get_mut(&session_id) {
            s.connection = connection;
        }
    }
}

/// Ends every session of `job_id` whose trainer is provably gone: its last
/// call came on a connection this server saw close. Returns the number of
/// sessions ended and of workers to tell (as `end_sessions`).
pub(super) fn end_departed(t: &mut Tables, connections: &Connections, job_id: u64) -> (usize, usize) {
    end_sessions(t, "session ended: its connection closed, so its trainer is gone", |_, s| {
        s.job_id == job_id && s.connection.is_some_and(|c| !connections.is_open(&c))
    })
}
