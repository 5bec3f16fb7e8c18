//! `loaderctl`: the operator's CLI. Everything lives in the library ([`loader_ctl::main`]).

fn main() -> std::process::ExitCode {
    loader_process::heap::keep_batch_buffers();
    loader_ctl::main()
}
