//! TLS settings: a server's certificate and key (re-read when the files
//! change, so cert-manager's renewals need no restart), the CA whose client
//! certificates a server requires (mutual TLS), and the CA a client
//! verifies servers with, with an optional client certificate.
//!
//! rustls with the aws-lc-rs provider, chosen explicitly (see [`provider`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::SecurityError;
use super::secret_file::{self, OpenSecrets};
use super::validity;

/// How often a server looks at its certificate files for changes.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// ALPN id of HTTP/2: gRPC clients (tonic among them) insist on it.
pub(crate) const ALPN_H2: &[u8] = b"h2";

/// A server's TLS files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
    /// PEM CA certificates: when set, every client must present a
    /// certificate signed by one of them (mutual TLS).
    pub client_ca: Option<PathBuf>,
    /// Whether a key file others can read is accepted.
    pub open_secrets: OpenSecrets,
}

impl ServerTls {
    /// Reads the files and builds the rustls configuration.
    pub fn load(&self) -> Result<Arc<ServerConfig>, SecurityError> {
        let certs = read_certs(&self.cert, "--tls-cert")?;
        if let Some(outside) = validity::outside(&certs[0], SystemTime::now()) {
            // Served anyway: the clients' clocks decide, and a renewal is
            // picked up without a restart. Every client that agrees fails.
            tracing::warn!("{}", outside.describe(&format!("this server's certificate (--tls-cert {})", self.cert.display())));
        }
        let key = read_key(&self.key, self.open_secrets)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| SecurityError::new("TLS", e))?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let roots = Arc::new(read_roots(ca, "--tls-client-ca")?);
                let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
                    .build()
                    .map_err(|e| SecurityError::new(format!("--tls-client-ca {}", ca.display()), e))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| SecurityError::new(format!("--tls-cert {} with --tls-key {}", self.cert.display(), self.key.display()), e))?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Arc::new(config))
    }

    /// What the files look like now: a change of any of them is a reason to
    /// read them again.
    fn stamp(&self) -> Stamp {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len()))))
            .collect()
    }
}

/// When each of a server's TLS files was last changed, and its size (None:
/// unreadable): what tells that they changed.
type Stamp = Vec<Option<(SystemTime, u64)>>;

/// A server configuration that follows its files: [`ReloadingTls::current`]
/// is what the next handshake uses; [`ReloadingTls::check`] reads the files
/// again when they changed, keeping the old configuration (and saying so
/// once) when the new files do not load.
#[derive(Debug)]
pub struct ReloadingTls {
    files: ServerTls,
    state: RwLock<(Arc<ServerConfig>, Stamp)>,
}

impl ReloadingTls {
    /// Loads the files now; an error here stops the server from starting.
    pub fn new(files: ServerTls) -> Result<Self, SecurityError> {
        let stamp = files.stamp();
        let config = files.load()?;
        Ok(Self { files, state: RwLock::new((config, stamp)) })
    }

    /// The configuration for the next handshake.
    pub fn current(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.state.read().unwrap_or_else(|p| p.into_inner()).0)
    }

    /// Reloads when the files changed; returns whether the configuration
    /// was replaced.
    pub fn check(&self) -> bool {
        let stamp = self.files.stamp();
        if self.state.read().unwrap_or_else(|p| p.into_inner()).1 == stamp {
            return false;
        }
        let loaded = self.files.load();
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        state.1 = stamp;
        match loaded {
            Ok(config) => {
                state.0 = config;
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                true
            }
            Err(e) => {
                tracing::warn!("TLS files changed but cannot be used, keeping the previous certificate: {e}");
                false
            }
        }
    }
}

/// A client's TLS files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM CA certificates the client verifies servers with.
    pub ca: PathBuf,
    /// The client's own certificate and key, for servers that require one.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// Whether a key file others can read is accepted.
    pub open_secrets: OpenSecrets,
}

impl ClientTls {
    /// The rustls configuration of a client: servers verified against the
    /// CA, the client's certificate offered when it has one, HTTP/2 by ALPN.
    /// Every file is read and parsed here, so one that is not PEM fails at
    /// start-up with its name, not at the first handshake.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, SecurityError> {
        let roots = read_roots(&self.ca, "--tls-ca")?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| SecurityError::new("TLS", e))?
            .with_root_certificates(roots);
        let mut config = match &self.identity {
            Some((cert, key)) => {
                let certs = read_certs(cert, "--tls-cert")?;
                note_presented(cert, &certs[0]);
                let key_der = read_key(key, self.open_secrets)?;
                builder
                    .with_client_auth_cert(certs, key_der)
                    .map_err(|e| SecurityError::new(format!("--tls-cert {} with --tls-key {}", cert.display(), key.display()), e))?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Arc::new(config))
    }
}

/// What is wrong with the certificate this process presents as a client,
/// as [`validity::Outside::describe`] says it, when it was outside its
/// validity window at load. A server refusing it under TLS 1.3 only hangs
/// up, so [`crate::grpc::channel::explain`] reads this to name the cause.
/// One per process: every binary presents one client identity.
static PRESENTED: Mutex<Option<String>> = Mutex::new(None);

/// The problem with this process's client certificate, if it has one (see
/// [`PRESENTED`]).
pub fn presented_certificate_problem() -> Option<String> {
    PRESENTED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

fn note_presented(path: &Path, leaf: &CertificateDer<'_>) {
    let problem = validity::outside(leaf, SystemTime::now())
        .map(|o| o.describe(&format!("this client's certificate (--tls-cert {})", path.display())));
    if let Some(p) = &problem {
        tracing::warn!("{p}");
    }
    *PRESENTED.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = problem;
}

/// The crypto of every gRPC connection's TLS: aws-lc-rs, chosen by name
/// because more than one provider is compiled in (the Kubernetes client
/// brings ring), and because its AES-GCM (AVX-512 where the CPU has it)
/// decrypts at twice ring's rate: on a trainer reading batches over TLS,
/// decryption is the largest cost after the copies every transport pays.
///
/// Its suites are offered AES-128-GCM first (the default puts AES-256
/// first, and the server takes the client's order): 14 AES rounds instead
/// of 10 make sealing measurably slower (docs/benchmarks.md, TLS section).
/// AES-128-GCM is TLS 1.3's mandatory suite; the others are still offered
/// and accepted.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
}

fn read_certs(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, SecurityError> {
    let what = || format!("{flag} {}", path.display());
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| SecurityError::new(what(), pem_cause(&e, "certificate")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| SecurityError::new(what(), pem_cause(&e, "certificate")))?;
    if certs.is_empty() {
        return Err(SecurityError::new(what(), "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// A private key: a secret, so read by [`secret_file`] (certificates are
/// public and read as they are).
fn read_key(path: &Path, open: OpenSecrets) -> Result<PrivateKeyDer<'static>, SecurityError> {
    let pem = secret_file::read(path, "--tls-key", open)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| SecurityError::new(format!("--tls-key {}", path.display()), pem_cause(&e, "private key")))
}

fn read_roots(path: &Path, flag: &str) -> Result<RootCertStore, SecurityError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path, flag)? {
        roots
            .add(cert)
            .map_err(|e| SecurityError::new(format!("{flag} {}", path.display()), e))?;
    }
    Ok(roots)
}

fn pem_cause(e: &rustls::pki_types::pem::Error, what: &str) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => io.to_string(),
        rustls::pki_types::pem::Error::NoItemsFound => format!("no PEM {what} in the file"),
        other => format!("not a PEM {what}: {other}"),
    }
}
