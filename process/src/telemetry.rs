//! The tracing subscriber of every Loader binary: human-readable lines on
//! stderr (stdout carries the machine-readable output: `listening <addr>`,
//! `--json` reports), filtered by `RUST_LOG`, warnings and errors by
//! default. Exporters join here, so every process gets them the same way:
//! [`metrics`] serves Prometheus metrics on `--metrics-listen`.

pub mod metrics;

/// Level filter used when `RUST_LOG` is unset or unparsable.
const DEFAULT_FILTER: &str = "warn";

/// Installs the subscriber. A second call in the same process (loaderctl's
/// hidden worker subcommand after loaderctl's own) is a no-op, as is a call
/// in a process whose host already installed one.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER));
    let _already = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
