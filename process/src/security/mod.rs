//! Who may talk to a Loader process, and how the bytes are protected on the
//! way: TLS on every gRPC connection and bearer tokens per role, configured
//! the same way in every binary (flags, or the environment they read).
//!
//! - [`token`]: the three roles' tokens, read from a file or an environment
//!   variable (never from argv, where `ps` shows them), compared in
//!   constant time; and the session keys that tie a trainer to its own
//!   session's batches.
//! - [`tls`]: server certificates (re-read when their files change) and the
//!   CA a client verifies servers with; optional client certificates
//!   (mutual TLS).
//! - `validity`: whether a certificate is inside its validity window now,
//!   so an expired one is named where a server's hang-up would hide it.
//! - [`secret_file`]: reading a token or private key file, refusing one
//!   that group or others can read (the one place that rule lives).
//! - [`config`]: the flags every binary shares, and what a server and a
//!   client of each role take from them.
//!
//! The checks themselves are tower layers applied by [`crate::grpc`], once
//! for every server and channel. The threat model and the roles' rights are
//! in docs/security.md.

pub mod config;
pub mod secret_file;
pub mod tls;
pub mod token;
mod validity;

pub use config::{ClientSecurity, SecurityArgs, ServerSecurity};
pub use secret_file::OpenSecrets;
pub use token::{Role, RoleTokens, SessionKeys, Token};

/// A security setting that cannot be used, on one line: what was given and
/// what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {cause}")]
pub struct SecurityError {
    /// The setting: a flag or variable, and the file it names.
    pub what: String,
    /// Why it cannot be used.
    pub cause: String,
}

impl SecurityError {
    pub(crate) fn new(what: impl Into<String>, cause: impl std::fmt::Display) -> Self {
        let cause = cause.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
        Self { what: what.into(), cause }
    }
}
