//! The batch wire format: arbitrary bytes parsed as a batch (plain, and
//! through a table cache primed with a different batch, which must change
//! nothing), every parsed payload read back, and the trainer's checks of a
//! worker's frame; and the same bytes read as a layout to write, which must
//! parse back to what was written. See `loader_fuzz::batch` for both.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    loader_fuzz::batch::parse(data);
    loader_fuzz::batch::write(data);
});
