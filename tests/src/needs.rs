//! What a test needs from the machine (root, `ip`, `nft`, a Prometheus
//! server, moto's S3 server): `.ci/run` and test.sh install all of it, so
//! a test that lacks it fails in one line naming what is missing and what
//! installs it, rather than printing "skipped" and passing.

/// The value a test needs, or a one-line failure saying what this machine
/// lacks (`Err`, from e.g. [`RemoteNamespace::available`](crate::RemoteNamespace::available)).
pub fn needs<T>(found: Result<T, String>) -> T {
    found.unwrap_or_else(|missing| panic!("cannot run here: {missing} (.ci/run and test.sh install what every test needs)"))
}
