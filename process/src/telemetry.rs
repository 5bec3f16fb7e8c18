//! The tracing subscriber of every Loader binary: human-readable lines on
//! stderr (stdout carries the machine-readable output: `listening <addr>`,
//! `--json` reports), filtered by `RUST_LOG`, warnings and errors by
//! default. Exporters join here, so every process gets them the same way:
//! [`trace`] exports spans over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is
//! set, [`metrics`] serves Prometheus metrics on `--metrics-listen`.

pub mod blocked;
pub mod metrics;
pub mod trace;

use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Level filter used when `RUST_LOG` is unset or unparsable.
const DEFAULT_FILTER: &str = "warn";

/// What the process holds while it runs: dropping it (at the end of `main`)
/// flushes the spans not yet exported.
#[derive(Debug)]
#[must_use = "dropping it stops trace export: hold it until the process ends"]
pub struct Telemetry {
    /// Span export, when the environment asked for it.
    _export: Option<trace::Export>,
}

/// Installs the subscriber: logs on stderr and, when the OpenTelemetry
/// environment asks for it, span export with `service` as the default
/// service name. A second call in the same process (loaderctl's hidden
/// worker subcommand after loaderctl's own) is a no-op, as is a call in a
/// process whose host already installed one. Trace export that cannot
/// start is logged once; the process runs without it.
pub fn init(service: &str) -> Telemetry {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter);
    let (tracer, export, failed) = match trace::wanted().then(|| trace::start(service)) {
        Some(Ok((tracer, export))) => (Some(tracer), Some(export), None),
        Some(Err(e)) => (None, None, Some(e)),
        None => (None, None, None),
    };
    // Spans of Loader's own crates (targets loader_*) at info and above,
    // and their warnings and errors (span events: a skipped sample inside
    // its batch's span), whatever RUST_LOG says: the log filter decides
    // what is printed, not what is traced. Other crates' spans (tonic, h2,
    // the exporter itself) are not exported. The filter reads metadata
    // only, so each callsite's answer is cached: an info event in a hot
    // path stays as cheap as with export off.
    let spans = tracer.map(|tracer| {
        tracing_opentelemetry::layer().with_tracer(tracer).with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            let level = if meta.is_span() { tracing::Level::INFO } else { tracing::Level::WARN };
            meta.target().starts_with("loader") && *meta.level() <= level
        }))
    });
    let installed = tracing_subscriber::registry().with(logs).with(spans).try_init().is_ok();
    if let Some(e) = failed {
        tracing::warn!("{e}; spans are not exported");
    }
    let export = export.filter(|_| installed);
    if let Some(export) = &export {
        export.installed();
    }
    Telemetry { _export: export }
}
