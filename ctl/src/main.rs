//! `loaderctl`: the operator's CLI. Everything lives in the library ([`loader_ctl::main`]).

/// Every Rust allocation of the process (see `loader_process::heap`).
#[global_allocator]
static ALLOCATOR: loader_process::heap::Allocator = loader_process::heap::Allocator;

fn main() -> std::process::ExitCode {
    loader_process::heap::keep_batch_buffers();
    loader_ctl::main()
}
