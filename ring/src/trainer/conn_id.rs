//! The id of a ring connection: a plain number that the book keys its
//! accounts by, the inbox its links and the wait set its epoll tokens, so
//! none of them needs a handle on another to name a connection.

/// Identifies one ring connection for the life of the ring.
pub type ConnId = u64;
