//! The README's Rust example is `examples/readme.rs` (which `cargo test`
//! compiles against this crate): the two must not drift apart.

/// The lines between `open` and `close` (exclusive), each with its common
/// indentation removed.
fn block<'a>(text: &'a str, open: &str, close: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = text
        .lines()
        .skip_while(|l| l.trim() != open)
        .skip(1)
        .take_while(|l| l.trim() != close)
        .collect();
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    lines.iter().map(|l| l.get(indent..).unwrap_or("")).collect()
}

#[test]
fn the_readme_shows_the_compiled_example() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/../README.md")).expect("README.md");
    let example = std::fs::read_to_string(format!("{root}/examples/readme.rs")).expect("example");
    let shown = block(&readme, "```rust", "```");
    let compiled = block(&example, "// README begins", "// README ends");
    assert!(!compiled.is_empty(), "the example lost its README markers");
    assert_eq!(shown, compiled, "README.md's Rust example differs from client/examples/readme.rs");
}
