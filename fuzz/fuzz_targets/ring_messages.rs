//! The shared-memory ring's messages: arbitrary bytes as a stream of framed
//! `RingToTrainer` and `RingToWorker` messages (whole, and cut anywhere),
//! the slot geometry's arithmetic, the trainer's inbox reading them as a
//! worker's reports over a real socket into a real sealed memfd, and the
//! worker's book taking them as a trainer's attach, grants and reclaims.
//! See `loader_fuzz::ring`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    loader_fuzz::ring::run(data);
});
