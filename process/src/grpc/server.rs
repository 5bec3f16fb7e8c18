//! Serving a process's gRPC services: the coordinator's, a worker's
//! `BatchService`. Each server also answers gRPC health checks (every
//! service it was given reports SERVING) and reflection, so `grpcurl` and
//! Kubernetes' gRPC probes work; runs behind [`super::layers::stack`]; and
//! speaks TLS when its [`ServerSecurity`] has certificates.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::codegen::http::{Request, Response};
use tonic::server::NamedService;
use tonic::service::RoutesBuilder;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;

use super::access::{Access, Policy};
use super::connections::Connections;
use super::limits::CALLS_PER_CONNECTION;
use crate::security::{SecurityError, ServerSecurity, tls::ReloadingTls};

/// The services one server offers, and what reflection describes.
#[derive(Debug, Default)]
pub struct Services {
    /// The services, routed by name.
    routes: RoutesBuilder,
    /// Names health checking reports as SERVING.
    names: Vec<&'static str>,
    /// Who may call each service.
    policy: Policy,
    /// Encoded file descriptor sets for reflection.
    descriptors: Vec<&'static [u8]>,
    /// Where the server counts its open connections.
    connections: Connections,
}

impl Services {
    /// No services yet; reflection describes `descriptors` (a `.proto`
    /// package's encoded file descriptor set), and health checking itself.
    pub fn new(descriptors: &'static [u8]) -> Self {
        Self {
            descriptors: vec![descriptors, tonic_health::pb::FILE_DESCRIPTOR_SET],
            ..Self::default()
        }
    }

    /// Serves a generated service server too, to callers `access` lets
    /// through; health checking reports it SERVING.
    pub fn serve<S>(mut self, access: Access, service: S) -> Self
    where
        S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        self.routes.add_service(service);
        self.names.push(S::NAME);
        self.policy.insert(S::NAME, access);
        self
    }

    /// Counts the server's open connections in `connections`, which the
    /// services read to tell whether a caller's connection has ended.
    pub fn with_connections(mut self, connections: Connections) -> Self {
        self.connections = connections;
        self
    }
}

/// Why a server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The reflection service could not be built from the descriptors.
    #[error("cannot build gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The transport failed.
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The TLS files cannot be used.
    #[error(transparent)]
    Security(#[from] SecurityError),
}

/// Serves `services` on `listener` until `shutdown` resolves; then stops
/// accepting, lets calls in flight finish, and returns. TLS and tokens as
/// `security` says; an unusable certificate fails here, before serving.
pub async fn serve(
    listener: TcpListener,
    services: Services,
    security: &ServerSecurity,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let Services { mut routes, names, descriptors, mut policy, connections } = services;
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in names {
        health.set_service_status(name, ServingStatus::Serving).await;
    }
    // Reflection as v1 and as v1alpha: grpcurl, evans and Python's
    // grpcio-reflection in the versions most people have still ask v1alpha.
    let reflection = || {
        descriptors.iter().fold(tonic_reflection::server::Builder::configure(), |b, &d| {
            b.register_encoded_file_descriptor_set(d)
        })
    };
    let (v1, v1alpha) = (reflection().build_v1()?, reflection().build_v1alpha()?);
    policy.insert("grpc.health.v1.Health", Access::Open);
    policy.insert("grpc.reflection.v1.ServerReflection", Access::Open);
    policy.insert("grpc.reflection.v1alpha.ServerReflection", Access::Open);
    routes.add_service(health_service).add_service(v1).add_service(v1alpha);
    let mut server = tonic::transport::Server::builder()
        .concurrency_limit_per_connection(CALLS_PER_CONNECTION)
        .max_concurrent_streams(u32::try_from(CALLS_PER_CONNECTION).ok())
        .layer(super::layers::stack(policy, security.tokens.clone()).into_inner());
    let router = server.add_routes(routes.routes());
    match &security.tls {
        Some(files) => {
            let tls = Arc::new(ReloadingTls::new(files.clone())?);
            router
                .serve_with_incoming_shutdown(super::incoming::tls(listener, tls, connections), shutdown)
                .await?;
        }
        None => {
            // `Server::tcp_nodelay` applies only to listeners tonic binds
            // itself; an incoming stream of ours sets it on each accepted
            // connection, or Nagle holds a response's trailers (and a
            // worker's small frames) for the peer's delayed ACK: 40 ms
            // stalls of every small heartbeat.
            let incoming = TcpIncoming::from(listener)
                .with_nodelay(Some(true))
                .map(move |accepted| accepted.map(|tcp| connections.track(tcp)));
            router.serve_with_incoming_shutdown(incoming, shutdown).await?;
        }
    }
    Ok(())
}
