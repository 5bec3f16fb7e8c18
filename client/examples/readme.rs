//! The README's Rust example, compiled by `cargo test` against the SDK as a
//! trainer depends on it (no worker crate, no libjpeg); `tests/readme.rs`
//! checks that the README still shows exactly the body of `train` below.
//! Running it tries the README's placeholder address, `HOST:7070`, and
//! stops with that one-line error.

#![allow(unused_variables, clippy::unwrap_used)]

fn train() -> Result<(), loader_client::LoaderError> {
    // README begins
    use loader_client::{Dtype, Loader, spec};

    let job = spec::synthetic(10_000, &[3, 224, 224], Dtype::U8)
        .batch_size(64).epochs(2).consumers(2).shuffle(0).name("train").build()?;
    let loader = Loader::builder("http://HOST:7070").job(job).rank(0).world_size(2).build()?;
    for batch in loader {
        let batch = batch?;
        let images = batch.tensor("data").unwrap();     // [64, 3, 224, 224] uint8, zero-copy
        let labels: Vec<i64> = batch.tensor("label").unwrap().to_vec()?;
    }
    // README ends
    Ok(())
}

fn main() -> std::process::ExitCode {
    match train() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("readme: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
