//! Traces: `tracing` spans exported over OTLP/gRPC when the standard
//! OpenTelemetry environment asks for it, and the W3C `traceparent` that
//! carries one batch's trace from process to process.
//!
//! Export is on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, and off otherwise: then no
//! exporter, runtime or layer exists, the batch spans are never created
//! ([`exporting`] is checked first) and nothing is carried in messages.
//! The service name is `OTEL_SERVICE_NAME` (the binary's name by default).
//! Batches of spans leave on the SDK's batch processor (`OTEL_BSP_*`),
//! whose exports run on the process's background runtime
//! ([`crate::runtime::background`]), so a process without tokio (Python)
//! exports too.
//!
//! Sampling is decided once per batch, by the coordinator, before any span
//! exists ([`sample_batch`]): at the ratio the standard variables give
//! (`OTEL_TRACES_SAMPLER` = `traceidratio` or `parentbased_traceidratio`
//! with `OTEL_TRACES_SAMPLER_ARG`; the ratio alone means the same;
//! `always_off` and `parentbased_always_off` trace nothing; anything else
//! every batch). Only a sampled batch gets a root span, whose context is
//! carried; a worker or trainer makes a batch's spans only when a context
//! came with it. So an unsampled batch costs one hash at the coordinator
//! and nothing anywhere else — at batch size 1, a span made and dropped
//! per batch just to be sampled out cost the embedded coordinator about
//! 2 µs a batch (a quarter of the throughput). The SDK's own sampler then
//! keeps every span it is given (`parentbased_always_on`), or none at a
//! ratio of 0; the rare other roots (a job's span) follow it.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Set once spans are exported by this process.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// The W3C trace-context propagator (stateless; one for the process).
fn propagator() -> &'static TraceContextPropagator {
    static PROPAGATOR: OnceLock<TraceContextPropagator> = OnceLock::new();
    PROPAGATOR.get_or_init(TraceContextPropagator::new)
}

/// The carrier key of the W3C header.
const TRACEPARENT: &str = "traceparent";

/// Whether this process exports spans: callers skip making batch spans and
/// carrying contexts when it does not.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The W3C `traceparent` of `span` when an OpenTelemetry layer records it
/// and it is sampled; empty otherwise (nothing to carry).
pub fn carry(span: &Span) -> String {
    if span.is_disabled() {
        return String::new();
    }
    let cx = span.context();
    if !cx.span().span_context().is_sampled() {
        return String::new();
    }
    let mut carrier = HashMap::with_capacity(2);
    propagator().inject_context(&cx, &mut carrier);
    carrier.remove(TRACEPARENT).unwrap_or_default()
}

/// Makes `span` a child of the span whose `traceparent` a message carried.
/// An empty or malformed `traceparent` leaves `span` a root (a peer that
/// sends garbage cannot break tracing, only its own trace).
pub fn adopt(span: &Span, traceparent: &str) {
    if traceparent.is_empty() || span.is_disabled() {
        return;
    }
    if let Some(cx) = remote_context(traceparent) {
        let _ = span.set_parent(cx);
    }
}

/// The remote parent a `traceparent` names; None when it is malformed.
fn remote_context(traceparent: &str) -> Option<opentelemetry::Context> {
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let cx = propagator().extract(&carrier);
    cx.span().span_context().is_valid().then_some(cx)
}

/// A span that is a child of the context `traceparent` carries, made by
/// `make` only when a context came (the batch is sampled);
/// [`Span::none`] otherwise, which costs nothing to hold, enter or drop.
/// Not gated on [`exporting`]: a program that embeds the SDK with its own
/// OpenTelemetry layer gets the trainer's spans in the batch's trace too.
pub fn child_of(traceparent: &str, make: impl FnOnce() -> Span) -> Span {
    if traceparent.is_empty() {
        return Span::none();
    }
    let span = make();
    adopt(&span, traceparent);
    span
}

/// What keeps export running: the provider (flushed and shut down on
/// drop). The exporter's gRPC channel lives on the background runtime.
pub(super) struct Export {
    /// Flushed on drop, so a process that ends normally loses no span.
    provider: SdkTracerProvider,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export").finish_non_exhaustive()
    }
}

impl Export {
    /// The subscriber with this export's layer is installed: batch spans
    /// are worth making from now on.
    pub(super) fn installed(&self) {
        EXPORTING.store(true, Ordering::Relaxed);
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        EXPORTING.store(false, Ordering::Relaxed);
        if let Err(e) = self.provider.shutdown() {
            tracing::debug!("trace export shutdown: {e}");
        }
    }
}

/// Whether the environment asks for export (`OTEL_EXPORTER_OTLP_ENDPOINT`
/// or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set and not empty).
pub fn wanted() -> bool {
    ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}

/// Builds the exporter, provider and tracer for `service` (the default
/// service name). Err is one line saying why export cannot start.
pub(super) fn start(service: &str) -> Result<(SdkTracer, Export), String> {
    let runtime = crate::runtime::background().map_err(|e| format!("cannot start the trace export runtime: {e}"))?;
    // The tonic channel is made (lazily connected) inside the runtime, which
    // then drives it for the batch processor's thread.
    let exporter = {
        let _entered = runtime.enter();
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .map_err(|e| format!("cannot set up OTLP trace export: {e}"))?
    };
    let name = std::env::var("OTEL_SERVICE_NAME").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| service.to_owned());
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(name).build();
    let ratio = batch_ratio_from_env();
    BATCH_RATIO.store(ratio.to_bits(), Ordering::Relaxed);
    let sampler = if ratio > 0.0 { Sampler::ParentBased(Box::new(Sampler::AlwaysOn)) } else { Sampler::AlwaysOff };
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .with_sampler(sampler)
        .build();
    let tracer = provider.tracer("loader");
    Ok((tracer, Export { provider }))
}

/// The fraction of batches traced (an `f64`'s bits), set by [`start`].
static BATCH_RATIO: AtomicU64 = AtomicU64::new(0);

/// Whether batch `seq` of consumer `consumer` of job `job_id` is traced:
/// spans are exported and a hash of the three, keyed per process (another
/// run traces other batches), falls under the ratio. The same batch given
/// out again gets the same answer.
pub fn sample_batch(job_id: u64, consumer: u32, seq: u64) -> bool {
    if !exporting() {
        return false;
    }
    let ratio = f64::from_bits(BATCH_RATIO.load(Ordering::Relaxed));
    if ratio >= 1.0 {
        return true;
    }
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    let hash = KEYS.get_or_init(RandomState::new).hash_one((job_id, consumer, seq));
    // The top 53 bits as a uniform number in [0, 1).
    ((hash >> 11) as f64) * (1.0 / (1u64 << 53) as f64) < ratio
}

/// The ratio the standard sampler variables ask for (see the module doc).
fn batch_ratio_from_env() -> f64 {
    let sampler = std::env::var("OTEL_TRACES_SAMPLER").ok();
    let arg = std::env::var("OTEL_TRACES_SAMPLER_ARG").ok();
    batch_ratio(sampler.as_deref(), arg.as_deref())
}

/// The ratio of batches traced for `OTEL_TRACES_SAMPLER` = `sampler` and
/// `OTEL_TRACES_SAMPLER_ARG` = `arg`.
fn batch_ratio(sampler: Option<&str>, arg: Option<&str>) -> f64 {
    let arg = || arg.and_then(|v| v.trim().parse::<f64>().ok()).filter(|r| !r.is_nan());
    let ratio = match sampler.map(|v| v.trim().to_ascii_lowercase()) {
        None => arg().unwrap_or(1.0),
        Some(s) if s == "always_off" || s == "parentbased_always_off" => 0.0,
        Some(s) if s == "traceidratio" || s == "parentbased_traceidratio" => arg().unwrap_or(1.0),
        Some(_) => 1.0,
    };
    ratio.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_ratio_follows_the_standard_sampler_variables() {
        let cases = [
            (None, None, 1.0),
            (None, Some("0.01"), 0.01),
            (None, Some("nonsense"), 1.0),
            (Some("traceidratio"), Some("0.25"), 0.25),
            (Some("parentbased_traceidratio"), Some(" 0.5 "), 0.5),
            (Some("parentbased_traceidratio"), None, 1.0),
            (Some("always_on"), Some("0.1"), 1.0),
            (Some("always_off"), None, 0.0),
            (Some("ParentBased_Always_Off"), None, 0.0),
            (Some("traceidratio"), Some("7"), 1.0),
            (Some("traceidratio"), Some("-1"), 0.0),
            (Some("traceidratio"), Some("NaN"), 1.0),
            (Some("jaeger_remote"), None, 1.0),
        ];
        for (sampler, arg, want) in cases {
            assert_eq!(batch_ratio(sampler, arg), want, "{sampler:?} {arg:?}");
        }
    }

    #[test]
    fn a_malformed_traceparent_names_no_parent() {
        let good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let cx = remote_context(good).expect("a valid traceparent");
        assert_eq!(format!("{:032x}", cx.span().span_context().trace_id()), "0af7651916cd43dd8448eb211c80319c");
        for bad in ["", "garbage", "00-zz-b7ad6b7169203331-01", "00-00000000000000000000000000000000-b7ad6b7169203331-01"] {
            assert!(remote_context(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn no_batch_is_sampled_without_export() {
        assert!(!sample_batch(1, 0, 0));
    }

    #[test]
    fn nothing_is_carried_or_adopted_without_export() {
        let span = tracing::info_span!("batch");
        assert_eq!(carry(&span), "");
        // No subscriber here: the span is disabled, so nothing is adopted.
        let child = child_of("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", || tracing::info_span!("c"));
        assert!(child.is_disabled());
        assert!(child_of("", || tracing::info_span!("c")).is_none());
    }
}
