//! The example binary is a full worker: it takes the stock worker's flags and
//! rejects a bad one with the stock one-line error. (Being an integration
//! test also makes `cargo test --workspace` build the binary, which the
//! end-to-end test `tests/tests/custom_dataset.rs` starts.)

use std::process::Command;

#[test]
fn a_bad_flag_is_a_one_line_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_custom-worker"))
        .arg("--no-such-flag")
        .output()
        .expect("run custom-worker");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {stderr}");
    assert!(lines[0].contains("--no-such-flag"), "the error names the flag: {stderr}");
}
