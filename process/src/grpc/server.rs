//! Serving a process's gRPC services: the coordinator's three, a worker's
//! `BatchService`. Each server also answers gRPC health checks (every
//! service it was given reports SERVING) and reflection, so `grpcurl` and
//! Kubernetes' gRPC probes work, and runs behind [`super::layers::stack`].

use std::convert::Infallible;
use std::future::Future;

use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::codegen::http::{Request, Response};
use tonic::server::NamedService;
use tonic::service::RoutesBuilder;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;

/// The services one server offers, and what reflection describes.
#[derive(Debug, Default)]
pub struct Services {
    /// The services, routed by name.
    routes: RoutesBuilder,
    /// Names health checking reports as SERVING.
    names: Vec<&'static str>,
    /// Encoded file descriptor sets for reflection.
    descriptors: Vec<&'static [u8]>,
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

    /// Serves a generated service server too; health checking reports it
    /// SERVING.
    pub fn serve<S>(mut self, service: S) -> Self
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
}

/// Serves `services` on `listener` until `shutdown` resolves; then stops
/// accepting, lets calls in flight finish, and returns.
pub async fn serve(
    listener: TcpListener,
    services: Services,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let Services { mut routes, names, descriptors } = services;
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in names {
        health.set_service_status(name, ServingStatus::Serving).await;
    }
    let reflection = descriptors
        .into_iter()
        .fold(tonic_reflection::server::Builder::configure(), |b, d| {
            b.register_encoded_file_descriptor_set(d)
        })
        .build_v1()?;
    routes.add_service(health_service).add_service(reflection);
    // `Server::tcp_nodelay` applies only to listeners tonic binds itself; an
    // incoming stream of ours sets it on each accepted connection, or Nagle
    // holds a response's trailers (and a worker's small frames) for the
    // peer's delayed ACK: 40 ms stalls of every small heartbeat.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .layer(super::layers::stack().into_inner())
        .add_routes(routes.routes())
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}
