//! `loader-server`: the coordinator binary.

fn main() -> std::process::ExitCode {
    loader_process::heap::keep_batch_buffers();
    loader_server::cli::main_with_args(std::env::args_os())
}
