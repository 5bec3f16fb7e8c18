//! An OTLP/gRPC trace receiver for benchmarks: prints `listening ADDR`,
//! keeps (and counts) what it is sent until stdin closes or it is killed,
//! then prints `spans N`.
//!
//!   cargo run -p loader-e2e --example otlp_sink -- 127.0.0.1:0

use std::io::Read;

fn main() -> std::process::ExitCode {
    let listen = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:0".to_owned());
    let receiver = match loader_e2e::OtlpReceiver::start(&listen) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("otlp_sink: cannot listen on {listen}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("listening {}", receiver.addr());
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    println!("spans {}", receiver.count());
    std::process::ExitCode::SUCCESS
}
