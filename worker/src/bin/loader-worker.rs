//! `loader-worker`: see [`loader_worker::main_with_args`].

use std::process::ExitCode;

/// Every Rust allocation of the process (see `loader_process::heap`).
#[global_allocator]
static ALLOCATOR: loader_process::heap::Allocator = loader_process::heap::Allocator;

fn main() -> ExitCode {
    loader_process::heap::keep_batch_buffers();
    loader_worker::main_with_args(std::env::args_os())
}
