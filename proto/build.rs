//! Compiles `loader/v1/*.proto` and KEDA's external-scaler interface
//! (`keda/externalscaler.proto`) with protox (pure Rust, no system protoc).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "loader/v1/common.proto",
        "loader/v1/coordinator.proto",
        "loader/v1/worker.proto",
        "loader/v1/ring.proto",
        "keda/externalscaler.proto",
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={file}");
    }
    let fds = protox::compile(files, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out.join("loader_descriptor.bin");
    std::fs::write(&descriptor_path, prost::Message::encode_to_vec(&fds))?;
    // Without the `grpc` feature only the messages are generated: no
    // clients or servers, so nothing in them names tonic.
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        // Batch payloads stay `bytes::Bytes` end to end: no copy on decode.
        .bytes(".loader.v1.BatchFrame.data")
        // Blob chunks: sliced from the coordinator's copy without a copy.
        .bytes(".loader.v1.GetBlobResponse.data")
        .bytes(".loader.v1.PutBlobRequest.data")
        .compile_fds(fds)?;
    Ok(())
}
