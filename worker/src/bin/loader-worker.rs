//! `loader-worker`: see [`loader_worker::main_with_args`].

use std::process::ExitCode;

fn main() -> ExitCode {
    loader_process::heap::keep_batch_buffers();
    loader_worker::main_with_args(std::env::args_os())
}
