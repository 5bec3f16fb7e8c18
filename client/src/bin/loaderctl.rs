//! `loaderctl`: the operator's CLI. Everything lives in [`loader_client::ctl`].

fn main() -> std::process::ExitCode {
    loader_proto::heap::keep_batch_buffers();
    loader_client::ctl::main()
}
