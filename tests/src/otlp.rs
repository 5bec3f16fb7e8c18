//! A real OTLP/gRPC trace receiver (opentelemetry-proto's generated tonic
//! server) on a loopback port: what processes started with
//! `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at it export their spans to. The
//! traces test reads what it kept; the overhead benchmark runs it as the
//! `otlp_sink` example, so exporting processes talk to a live collector.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

/// A span as received, with the service that sent it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// `service.name` of the sender's resource.
    pub service: String,
    /// The span.
    pub span: Span,
}

/// The receiver's store: every span it was sent.
#[derive(Debug, Clone, Default)]
struct Store {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

#[tonic::async_trait]
impl TraceService for Store {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        for resource_spans in request.into_inner().resource_spans {
            let attributes = resource_spans.resource.map(|r| r.attributes).unwrap_or_default();
            let service = string_attribute(&attributes, "service.name").unwrap_or_default();
            for scope in resource_spans.scope_spans {
                spans.extend(scope.spans.into_iter().map(|span| ReceivedSpan { service: service.clone(), span }));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// The value of attribute `key`, as a string (integers in decimal).
pub fn string_attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes.iter().find(|kv| kv.key == key).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        _ => None,
    })
}

/// A running receiver; stops when dropped.
#[derive(Debug)]
pub struct OtlpReceiver {
    /// Where it listens.
    addr: SocketAddr,
    /// What it received.
    store: Store,
    /// Serves it; dropped (stopping the server) with the receiver.
    _runtime: tokio::runtime::Runtime,
}

impl OtlpReceiver {
    /// Starts a receiver on `listen` (e.g. `127.0.0.1:0`).
    pub fn start(listen: &str) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind(listen))?;
        let addr = listener.local_addr()?;
        let store = Store::default();
        let service = TraceServiceServer::new(store.clone());
        runtime.spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
        });
        Ok(Self { addr, store, _runtime: runtime })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `OTEL_EXPORTER_OTLP_ENDPOINT` for it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A copy of every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.store.spans.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many spans were received so far.
    pub fn count(&self) -> usize {
        self.store.spans.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}
