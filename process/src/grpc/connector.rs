//! The connections a channel to an `https://` address makes: TCP, then a
//! rustls handshake over a [`ReadAhead`] socket.
//!
//! tonic has a TLS connector of its own, but it hands rustls the bare
//! socket, which rustls reads 4 KiB at a time (see [`super::read_ahead`]),
//! and it takes tonic's choice of crypto provider. Batches are what a TLS
//! channel mostly carries, so channels do their TLS here; tonic then sees
//! an already-encrypted connection to an `http://` origin (given `https://`
//! and no TLS settings of its own, it refuses to connect).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::read_ahead::{CLIENT_READ_AHEAD, ReadAhead};
use crate::security::tls::ALPN_H2;

/// Port of an `https://` address that names none.
const HTTPS_PORT: u16 = 443;

/// Makes TLS connections to one server.
#[derive(Clone)]
pub(crate) struct TlsConnector {
    /// Roots, client identity, ALPN.
    config: Arc<ClientConfig>,
    /// The name the server's certificate must carry (the address's host).
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

impl TlsConnector {
    /// Connections to `host` (as in the address: a DNS name or an IP
    /// address, brackets allowed) verified with `config`.
    pub(crate) fn new(config: Arc<ClientConfig>, host: &str) -> Result<Self, String> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let server_name = ServerName::try_from(host.to_owned())
            .map_err(|_| format!("{host:?} cannot be checked against a certificate (not a DNS name or an IP address)"))?;
        Ok(Self { config, server_name })
    }
}

impl tower::Service<Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<ReadAhead>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.config));
        let server_name = self.server_name.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the address has no host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let tcp = TcpStream::connect((host.as_str(), uri.port_u16().unwrap_or(HTTPS_PORT))).await?;
            // Small frames (heartbeats, trailers) must not wait for the
            // peer's delayed ACK.
            tcp.set_nodelay(true)?;
            let tls = connector.connect(server_name, ReadAhead::new(tcp, CLIENT_READ_AHEAD)).await?;
            if tls.get_ref().1.alpn_protocol() != Some(ALPN_H2) {
                return Err(io::Error::other("the server did not agree to HTTP/2 (ALPN h2): is it a gRPC server?"));
            }
            Ok(TokioIo::new(tls))
        })
    }
}

#[cfg(test)]
mod tests {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tower::ServiceExt as _;

    use super::*;
    use crate::grpc::read_ahead::SERVER_READ_AHEAD;
    use crate::security::tls::ClientTls;

    /// A TLS server on loopback offering `alpn`, echoing 4 bytes once; and
    /// the client configuration that trusts its self-signed certificate.
    async fn server(alpn: &[&[u8]]) -> (Uri, Arc<ClientConfig>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("dir");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, cert.pem()).expect("write");
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).expect("cert der")],
                PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("key der"),
            )
            .expect("server config");
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let uri: Uri = format!("https://localhost:{}", listener.local_addr().expect("addr").port()).parse().expect("uri");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            if let Ok(mut tls) = acceptor.accept(ReadAhead::new(tcp, SERVER_READ_AHEAD)).await {
                let mut word = [0u8; 4];
                if tls.read_exact(&mut word).await.is_ok() {
                    let _ = tls.write_all(&word).await;
                    let _ = tls.flush().await;
                }
            }
        });
        let client = ClientTls { ca, identity: None, open_secrets: Default::default() }.client_config().expect("client config");
        (uri, client, dir)
    }

    #[tokio::test]
    async fn connects_over_tls_with_http2() {
        // Loopback only: a hang is a failure, not a wait.
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            let (uri, config, _dir) = server(&[ALPN_H2]).await;
            let connector = TlsConnector::new(config, uri.host().expect("host")).expect("name");
            let io = connector.oneshot(uri).await.expect("handshake");
            let mut tls = io.into_inner();
            let suite = tls.get_ref().1.negotiated_cipher_suite().map(|s| s.suite());
            assert_eq!(suite, Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256), "the client's first choice");
            tls.write_all(b"ping").await.expect("write");
            tls.flush().await.expect("flush");
            let mut back = [0u8; 4];
            tls.read_exact(&mut back).await.expect("read");
            assert_eq!(&back, b"ping");
        })
        .await
        .expect("finished within 20 s");
    }

    #[tokio::test]
    async fn a_server_without_http2_is_one_clear_error() {
        // Loopback only: a hang is a failure, not a wait.
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            let (uri, config, _dir) = server(&[b"http/1.1"]).await;
            let connector = TlsConnector::new(config, uri.host().expect("host")).expect("name");
            // rustls itself refuses a server that picks a protocol the client
            // did not offer; a server that picks none gets our message.
            let err = connector.oneshot(uri.clone()).await.expect_err("no h2");
            assert!(!err.to_string().contains('\n'), "{err}");
            let (uri, config, _dir) = server(&[]).await;
            let connector = TlsConnector::new(config, uri.host().expect("host")).expect("name");
            let err = connector.oneshot(uri).await.expect_err("no ALPN");
            assert!(err.to_string().contains("ALPN h2"), "{err}");
        })
        .await
        .expect("finished within 20 s");
    }

    #[test]
    fn a_host_that_no_certificate_can_name_is_refused() {
        let (_, config, _dir) = tokio::runtime::Runtime::new().expect("rt").block_on(server(&[ALPN_H2]));
        assert!(TlsConnector::new(Arc::clone(&config), "[::1]").is_ok());
        assert!(TlsConnector::new(config, "bad_host!").is_err());
    }
}
