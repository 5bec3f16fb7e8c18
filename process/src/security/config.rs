//! The security flags every binary shares, and what a server and a client
//! take from them.
//!
//! Every flag also reads an environment variable (`--tls-ca` is
//! `LOADER_TLS_CA`, …), so a library user (the Rust SDK, the Python
//! package) configures the same things without flags: a trainer reads the
//! environment on its first connection. Token values are only ever read
//! from the environment or from files: a flag with a secret would show in
//! `ps` and in shell history.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use super::secret_file::{self, OpenSecrets};
use super::tls::{ClientTls, ServerTls};
use super::token::{Role, RoleTokens, SessionKeys, Token};
use super::SecurityError;

/// Every environment variable the security settings read: what a process
/// that starts plaintext, token-less children (the embedded mode) removes
/// from their environment.
pub const VARIABLES: [&str; 11] = [
    "LOADER_TLS_CERT",
    "LOADER_TLS_KEY",
    "LOADER_TLS_CLIENT_CA",
    "LOADER_TLS_CA",
    "LOADER_WORKER_TOKEN",
    "LOADER_WORKER_TOKEN_FILE",
    "LOADER_TRAINER_TOKEN",
    "LOADER_TRAINER_TOKEN_FILE",
    "LOADER_ADMIN_TOKEN",
    "LOADER_ADMIN_TOKEN_FILE",
    secret_file::ALLOW_VAR,
];

/// TLS and token flags, flattened into each binary's command line.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct SecurityArgs {
    /// PEM certificate (chain) this process presents: as a server, and as
    /// a client to servers that require client certificates.
    #[arg(long, env = "LOADER_TLS_CERT", value_name = "PATH", requires = "tls_key", help_heading = "Security")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "LOADER_TLS_KEY", value_name = "PATH", requires = "tls_cert", help_heading = "Security")]
    pub tls_key: Option<PathBuf>,
    /// Serving: require client certificates signed by this PEM CA (mutual TLS).
    #[arg(long, env = "LOADER_TLS_CLIENT_CA", value_name = "PATH", help_heading = "Security")]
    pub tls_client_ca: Option<PathBuf>,
    /// Connecting: verify servers with this PEM CA; `host:port` addresses
    /// then mean https://.
    #[arg(long, env = "LOADER_TLS_CA", value_name = "PATH", help_heading = "Security")]
    pub tls_ca: Option<PathBuf>,
    /// File with the worker role's token (or set LOADER_WORKER_TOKEN).
    #[arg(long, env = "LOADER_WORKER_TOKEN_FILE", value_name = "PATH", help_heading = "Security")]
    pub worker_token_file: Option<PathBuf>,
    /// File with the trainer role's token (or set LOADER_TRAINER_TOKEN).
    #[arg(long, env = "LOADER_TRAINER_TOKEN_FILE", value_name = "PATH", help_heading = "Security")]
    pub trainer_token_file: Option<PathBuf>,
    /// File with the admin role's token (or set LOADER_ADMIN_TOKEN).
    #[arg(long, env = "LOADER_ADMIN_TOKEN_FILE", value_name = "PATH", help_heading = "Security")]
    pub admin_token_file: Option<PathBuf>,
    /// Accept token and private key files that group or others can read,
    /// where the platform cannot make them private (docs/security.md).
    #[arg(long, env = secret_file::ALLOW_VAR, value_parser = clap::builder::BoolishValueParser::new(), help_heading = "Security")]
    pub allow_open_secrets: bool,
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// A boolean variable read as the flag reads it (clap's boolish values):
/// `1`, `y`, `yes`, `t`, `true`, `on` (any case) are true.
fn env_flag(var: &str) -> bool {
    std::env::var(var)
        .is_ok_and(|v| ["1", "y", "yes", "t", "true", "on"].contains(&v.trim().to_ascii_lowercase().as_str()))
}

impl SecurityArgs {
    /// The settings from the environment alone (what the flags would read).
    pub fn from_env() -> Self {
        Self {
            tls_cert: env_path("LOADER_TLS_CERT"),
            tls_key: env_path("LOADER_TLS_KEY"),
            tls_client_ca: env_path("LOADER_TLS_CLIENT_CA"),
            tls_ca: env_path("LOADER_TLS_CA"),
            worker_token_file: env_path(Role::Worker.token_file_var()),
            trainer_token_file: env_path(Role::Trainer.token_file_var()),
            admin_token_file: env_path(Role::Admin.token_file_var()),
            allow_open_secrets: env_flag(secret_file::ALLOW_VAR),
        }
    }

    fn open_secrets(&self) -> OpenSecrets {
        if self.allow_open_secrets { OpenSecrets::Allow } else { OpenSecrets::Refuse }
    }

    fn token_file(&self, role: Role) -> Option<&std::path::Path> {
        match role {
            Role::Worker => self.worker_token_file.as_deref(),
            Role::Trainer => self.trainer_token_file.as_deref(),
            Role::Admin => self.admin_token_file.as_deref(),
        }
    }

    /// The role's token, from its file flag or the environment.
    pub fn token(&self, role: Role) -> Result<Option<Token>, SecurityError> {
        Token::for_role(role, self.token_file(role), self.open_secrets())
    }

    fn server_tls(&self) -> Result<Option<ServerTls>, SecurityError> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                Ok(Some(ServerTls {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
                open_secrets: self.open_secrets(),
            }))
            }
            (None, None) if self.tls_client_ca.is_some() => Err(SecurityError::new(
                "--tls-client-ca",
                "client certificates are checked only over TLS: set --tls-cert and --tls-key too",
            )),
            (None, None) => Ok(None),
            (Some(_), None) => Err(SecurityError::new("--tls-cert", "needs --tls-key (LOADER_TLS_KEY)")),
            (None, Some(_)) => Err(SecurityError::new("--tls-key", "needs --tls-cert (LOADER_TLS_CERT)")),
        }
    }

    /// TLS as a client: verify servers with --tls-ca, present --tls-cert
    /// when set.
    pub fn client_tls(&self) -> Result<Option<ClientTls>, SecurityError> {
        let identity = match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            _ => None,
        };
        Ok(self
            .tls_ca
            .as_ref()
            .map(|ca| ClientTls { ca: ca.clone(), identity, open_secrets: self.open_secrets() }))
    }

    /// What a server that answers `served` roles checks. Tokens are all or
    /// nothing: once any role's token is set, every served role needs one
    /// (a role left without would be open to anyone).
    pub fn server(&self, served: &[Role]) -> Result<ServerSecurity, SecurityError> {
        let tls = self.server_tls()?;
        let tokens: Vec<(Role, Option<Token>)> =
            Role::ALL.iter().map(|r| Ok((*r, self.token(*r)?))).collect::<Result<_, SecurityError>>()?;
        let any = tokens.iter().any(|(_, t)| t.is_some());
        let session_keys = tokens
            .iter()
            .find(|(r, _)| *r == Role::Worker)
            .and_then(|(_, t)| t.as_ref())
            .map(SessionKeys::from_worker_token);
        if !any {
            return Ok(ServerSecurity { tls, tokens: None, session_keys: None });
        }
        // The worker token is the session keys' secret, so every server
        // needs it; a server knows it as a role it refuses (PERMISSION_DENIED,
        // not UNAUTHENTICATED) where workers have nothing to call.
        let mut accepted = Vec::new();
        for role in Role::ALL.into_iter().filter(|r| served.contains(r) || *r == Role::Worker) {
            match tokens.iter().find(|(r, _)| *r == role).and_then(|(_, t)| t.clone()) {
                Some(t) => accepted.push((role, t)),
                None => {
                    return Err(SecurityError::new(
                        role.token_var(),
                        format!(
                            "tokens are on (another role's token is set) but the {role} role has none: set {} or {}",
                            role.token_var(),
                            role.token_file_var()
                        ),
                    ));
                }
            }
        }
        Ok(ServerSecurity { tls, tokens: Some(RoleTokens::new(&accepted)?), session_keys })
    }

    /// What a client of `role` uses.
    pub fn client(&self, role: Role) -> Result<ClientSecurity, SecurityError> {
        Ok(ClientSecurity { tls: self.client_tls()?, token: self.token(role)? })
    }
}

/// What a server checks: TLS (with client certificates or not), the tokens
/// of the roles it answers, and the session keys trainers present.
#[derive(Debug, Clone, Default)]
pub struct ServerSecurity {
    /// TLS files; plaintext when `None`.
    pub tls: Option<ServerTls>,
    /// Accepted tokens by role; every call is let through when `None`.
    pub tokens: Option<RoleTokens>,
    /// Session keys, when tokens are on.
    pub session_keys: Option<SessionKeys>,
}

impl ServerSecurity {
    /// Plaintext, no tokens: the embedded mode, and tests.
    pub fn none() -> Self {
        Self::default()
    }
}

/// What a client of one role presents: TLS to verify the server with (and
/// its own certificate), and the role's token.
#[derive(Debug, Clone, Default)]
pub struct ClientSecurity {
    /// TLS settings; plaintext when `None`.
    pub tls: Option<ClientTls>,
    /// The bearer token sent with every call.
    pub token: Option<Token>,
}

impl ClientSecurity {
    /// Plaintext, no token.
    pub fn none() -> Self {
        Self::default()
    }

    /// This process's settings for `role`: what [`ClientSecurity::install`]
    /// set, or else the environment, read once.
    pub fn for_role(role: Role) -> Result<Arc<ClientSecurity>, SecurityError> {
        let mut chosen = installed().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = chosen.get(&role) {
            return Ok(Arc::clone(found));
        }
        let made = Arc::new(SecurityArgs::from_env().client(role)?);
        chosen.insert(role, Arc::clone(&made));
        Ok(made)
    }

    /// Makes `security` this process's settings for `role` (a binary's
    /// flags), before its first connection.
    pub fn install(role: Role, security: ClientSecurity) {
        installed().lock().unwrap_or_else(|p| p.into_inner()).insert(role, Arc::new(security));
    }
}

fn installed() -> &'static Mutex<HashMap<Role, Arc<ClientSecurity>>> {
    static INSTALLED: OnceLock<Mutex<HashMap<Role, Arc<ClientSecurity>>>> = OnceLock::new();
    INSTALLED.get_or_init(Default::default)
}
