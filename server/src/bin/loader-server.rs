//! `loader-server`: the coordinator binary.

fn main() -> std::process::ExitCode {
    // No batches pass through the coordinator: what its connections took
    // goes back to the kernel once they close (see `heap`).
    loader_process::heap::return_freed_memory(std::time::Duration::from_secs(2));
    loader_server::cli::main_with_args(std::env::args_os())
}
