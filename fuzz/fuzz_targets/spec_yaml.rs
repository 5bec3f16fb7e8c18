//! A spec file (YAML, or JSON when it starts with a brace), parsed, planned and
//! submitted to an in-memory coordinator. See `loader_fuzz::spec`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        loader_fuzz::spec::run(text, false);
    }
});
