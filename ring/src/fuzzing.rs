//! Entry points for the fuzz target (`fuzz/`'s `ring_messages`), not an
//! API: each half of the ring fed arbitrary messages from the other.

pub use crate::trainer::fuzz::{SLOT_SIZE, TrainerRing};
pub use crate::worker::fuzz::{MAX_MEMFD, WorkerRing};
