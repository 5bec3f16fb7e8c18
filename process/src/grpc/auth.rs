//! The bearer-token check: one tower layer in front of every service of a
//! server. A call without a token, or with one the server does not know, is
//! UNAUTHENTICATED; a known token of another role is PERMISSION_DENIED. The
//! role a call was let through with is left in the request's extensions
//! ([`Caller`]).
//!
//! Tokens go in the `authorization: Bearer <token>` header; clients add it
//! in [`super::channel::Channel`].

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{BoxFuture, FutureExt as _};
use tonic::body::Body;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tower::{Layer, Service};

use super::access::{Access, Policy};
use crate::security::{Role, RoleTokens};

/// The role a call was authenticated as (absent when tokens are off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller(pub Role);

/// Why a call was refused; mapped to its gRPC status in one place
/// ([`AuthError::status`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `authorization` header.
    #[error("no token: {method} needs the {needed} role's token (set {var} or {var}_FILE)", var = needed.token_var())]
    Missing {
        /// The method called.
        method: String,
        /// The role it needs.
        needed: Role,
    },
    /// A header that is not `Bearer <token>`.
    #[error("malformed authorization header: expected `Bearer <token>`")]
    Malformed,
    /// A token this server does not know.
    #[error("invalid token for {method}")]
    Unknown {
        /// The method called.
        method: String,
    },
    /// A token of another role.
    #[error("the {got} role may not call {method} (it needs the {needed} role)")]
    WrongRole {
        /// The method called.
        method: String,
        /// The role of the token presented.
        got: Role,
        /// The role it needs.
        needed: Role,
    },
}

impl AuthError {
    /// The gRPC status of the refusal: the one mapping of auth failures.
    pub fn status(&self) -> tonic::Status {
        match self {
            AuthError::Missing { .. } | AuthError::Malformed | AuthError::Unknown { .. } => {
                tonic::Status::unauthenticated(self.to_string())
            }
            AuthError::WrongRole { .. } => tonic::Status::permission_denied(self.to_string()),
        }
    }
}

/// Decides one call: `Ok(Some(role))` let through as `role`, `Ok(None)` let
/// through without a role (an open service).
pub fn check(
    tokens: &RoleTokens,
    access: Access,
    method: &str,
    authorization: Option<&[u8]>,
    client_cert: bool,
) -> Result<Option<Role>, AuthError> {
    let Some(needed) = access.role() else { return Ok(None) };
    let method = method.trim_start_matches('/').to_owned();
    let Some(header) = authorization else {
        if access == Access::RoleOrClientCert(needed) && client_cert {
            return Ok(None);
        }
        return Err(AuthError::Missing { method, needed });
    };
    let header = std::str::from_utf8(header).map_err(|_| AuthError::Malformed)?;
    let (scheme, token) = header.trim().split_once(' ').ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::Malformed);
    }
    match tokens.role_of(token.trim()) {
        None => Err(AuthError::Unknown { method }),
        Some(got) if got == needed => Ok(Some(got)),
        Some(got) => Err(AuthError::WrongRole { method, got, needed }),
    }
}

/// The layer: checks every call against `tokens` and the server's policy.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    tokens: Option<Arc<RoleTokens>>,
    policy: Arc<Policy>,
}

impl AuthLayer {
    /// Checks calls against `tokens`, each service per `policy`; lets every
    /// call through when `tokens` is `None` (tokens off).
    pub fn new(tokens: Option<RoleTokens>, policy: Arc<Policy>) -> Self {
        Self { tokens: tokens.map(Arc::new), policy }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth { inner, tokens: self.tokens.clone(), policy: Arc::clone(&self.policy) }
    }
}

/// The service [`AuthLayer`] makes.
#[derive(Debug, Clone)]
pub struct Auth<S> {
    inner: S,
    tokens: Option<Arc<RoleTokens>>,
    policy: Arc<Policy>,
}

impl<S> Service<http::Request<Body>> for Auth<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let Some(tokens) = &self.tokens else { return self.inner.call(req).boxed() };
        let path = req.uri().path().to_owned();
        let client_cert = req
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(|info| info.peer_certs())
            .is_some_and(|certs| !certs.is_empty());
        let header = req.headers().get(http::header::AUTHORIZATION).map(|v| v.as_bytes());
        match check(tokens, self.policy.of_path(&path), &path, header, client_cert) {
            Ok(role) => {
                if let Some(role) = role {
                    req.extensions_mut().insert(Caller(role));
                }
                self.inner.call(req).boxed()
            }
            Err(refused) => {
                tracing::debug!(method = %path, "refused: {refused}");
                let response = refused.status().into_http();
                async move { Ok(response) }.boxed()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::Token;

    fn tokens() -> RoleTokens {
        let t = |s: &str| Token::new(s, "test").expect("token");
        RoleTokens::new(&[
            (Role::Worker, t("worker-token-0123456789")),
            (Role::Trainer, t("trainer-token-0123456789")),
            (Role::Admin, t("admin-token-0123456789")),
        ])
        .expect("tokens")
    }

    #[test]
    fn each_refusal_has_its_code_and_one_line() {
        let tokens = tokens();
        let m = "/loader.v1.AdminService/ListWorkers";
        let admin = Access::Role(Role::Admin);
        let code = |h: Option<&str>| {
            check(&tokens, admin, m, h.map(str::as_bytes), false).map_err(|e| (e.status().code(), e.to_string()))
        };
        assert_eq!(code(Some("Bearer admin-token-0123456789")), Ok(Some(Role::Admin)));
        assert_eq!(code(Some("bearer  admin-token-0123456789 ")), Ok(Some(Role::Admin)));
        let (c, msg) = code(None).expect_err("missing");
        assert_eq!(c, tonic::Code::Unauthenticated);
        assert_eq!(
            msg,
            "no token: loader.v1.AdminService/ListWorkers needs the admin role's token (set LOADER_ADMIN_TOKEN or LOADER_ADMIN_TOKEN_FILE)"
        );
        assert_eq!(code(Some("Bearer nope-0123456789abcdef")).expect_err("unknown").0, tonic::Code::Unauthenticated);
        assert_eq!(code(Some("admin-token-0123456789")).expect_err("no scheme").0, tonic::Code::Unauthenticated);
        assert_eq!(code(Some("Basic admin-token-0123456789")).expect_err("basic").0, tonic::Code::Unauthenticated);
        let (c, msg) = code(Some("Bearer trainer-token-0123456789")).expect_err("wrong role");
        assert_eq!(c, tonic::Code::PermissionDenied);
        assert_eq!(msg, "the trainer role may not call loader.v1.AdminService/ListWorkers (it needs the admin role)");
    }

    #[test]
    fn open_services_and_client_certificates() {
        let tokens = tokens();
        assert_eq!(check(&tokens, Access::Open, "/grpc.health.v1.Health/Check", None, false), Ok(None));
        let scaler = Access::RoleOrClientCert(Role::Admin);
        assert_eq!(check(&tokens, scaler, "/externalscaler.ExternalScaler/IsActive", None, true), Ok(None));
        assert!(check(&tokens, scaler, "/externalscaler.ExternalScaler/IsActive", None, false).is_err());
        // A certificate does not excuse a wrong token.
        assert!(check(&tokens, scaler, "/x/y", Some(b"Bearer worker-token-0123456789"), true).is_err());
    }
}
