//! A test that cannot run here (no network namespaces, no `nft`, no
//! Prometheus) says so and passes; in CI, where `.ci/run` installs what
//! every test needs and sets `LOADER_TESTS_NO_SKIP=1`, it fails instead, so
//! a test that silently stopped running is seen.

/// The variable `.ci/run` sets.
pub const NO_SKIP: &str = "LOADER_TESTS_NO_SKIP";

/// Reports that (part of) a test did not run, for `reason`: prints
/// "skipped: {reason}", or panics when [`NO_SKIP`] is set.
pub fn skipped(reason: &str) {
    if std::env::var_os(NO_SKIP).is_some_and(|v| !v.is_empty() && v != "0") {
        panic!("cannot run here: {reason} ({NO_SKIP} is set: every test must run; .ci/run installs what they need)");
    }
    eprintln!("skipped: {reason}");
}
