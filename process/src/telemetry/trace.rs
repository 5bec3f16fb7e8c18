//! Traces: `tracing` spans exported over OTLP/gRPC when the standard
//! OpenTelemetry environment asks for it, and the W3C `traceparent` that
//! carries one batch's trace from process to process.
//!
//! Export is on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, and off otherwise: then no
//! exporter, runtime or layer exists, the batch spans are never created
//! ([`exporting`] is checked first) and nothing is carried in messages.
//! The service name is `OTEL_SERVICE_NAME` (the binary's name by default);
//! the sampler is the SDK's (`OTEL_TRACES_SAMPLER`, default
//! `parentbased_always_on`), except that `OTEL_TRACES_SAMPLER_ARG` alone
//! means `parentbased_traceidratio` with that ratio, which is what an
//! operator who sets only a ratio means. Batches of spans leave on the
//! SDK's batch processor (`OTEL_BSP_*`), whose exports run on a one-thread
//! runtime of their own, so a process without tokio (Python) exports too.
//!
//! Sampling is decided once per batch, by the coordinator: it starts each
//! batch's root span and carries the context only of sampled ones, and a
//! worker or trainer makes a batch's spans only when a context came with
//! it. An unsampled batch costs the workers and the trainer nothing.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

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

/// The W3C `traceparent` of `span` when spans are exported and `span` is
/// sampled; empty otherwise (nothing to carry).
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
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let cx = propagator().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
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

/// What keeps export running: the provider (flushed and shut down on drop)
/// and the runtime the exporter's gRPC channel lives on.
pub(super) struct Export {
    /// Flushed on drop, so a process that ends normally loses no span.
    provider: SdkTracerProvider,
    /// Drives the exporter's connection; dropped after the provider.
    runtime: Option<tokio::runtime::Runtime>,
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
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otlp-export")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the trace export runtime: {e}"))?;
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
    let mut builder = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource);
    if let Some(sampler) = ratio_only() {
        builder = builder.with_sampler(sampler);
    }
    let provider = builder.build();
    let tracer = provider.tracer("loader");
    Ok((tracer, Export { provider, runtime: Some(runtime) }))
}

/// `OTEL_TRACES_SAMPLER_ARG` without `OTEL_TRACES_SAMPLER`: a parent-based
/// ratio sampler (the SDK would ignore the ratio). None leaves the SDK's
/// own reading of the environment.
fn ratio_only() -> Option<Sampler> {
    if std::env::var_os("OTEL_TRACES_SAMPLER").is_some() {
        return None;
    }
    let ratio: f64 = std::env::var("OTEL_TRACES_SAMPLER_ARG").ok()?.trim().parse().ok()?;
    Some(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio.clamp(0.0, 1.0)))))
}

#[cfg(test)]
mod tests {
    use super::*;

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
