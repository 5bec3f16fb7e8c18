//! Bearer tokens per role, and the session keys that bind a trainer to its
//! own session.
//!
//! A token is a shared secret an operator generates (`openssl rand -hex
//! 32`) and hands to the processes of one role. Servers keep only SHA-256
//! digests and compare them in constant time, so neither timing nor a core
//! dump of a server gives a token away.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use ring::{digest, hmac};
use subtle::ConstantTimeEq as _;

use super::SecurityError;
use super::secret_file::{self, OpenSecrets};

/// What a caller may do; each RPC belongs to exactly one role (docs/security.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Registers, heartbeats, serves batches.
    Worker,
    /// Creates jobs, opens sessions, fetches its own session's batches.
    Trainer,
    /// Reads status, drains and scales workers.
    Admin,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 3] = [Role::Worker, Role::Trainer, Role::Admin];

    /// The role's name in messages: `worker`, `trainer`, `admin`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Trainer => "trainer",
            Role::Admin => "admin",
        }
    }

    /// The environment variable holding the role's token.
    pub fn token_var(self) -> &'static str {
        match self {
            Role::Worker => "LOADER_WORKER_TOKEN",
            Role::Trainer => "LOADER_TRAINER_TOKEN",
            Role::Admin => "LOADER_ADMIN_TOKEN",
        }
    }

    /// The environment variable (and flag) naming a file with the role's token.
    pub fn token_file_var(self) -> &'static str {
        match self {
            Role::Worker => "LOADER_WORKER_TOKEN_FILE",
            Role::Trainer => "LOADER_TRAINER_TOKEN_FILE",
            Role::Admin => "LOADER_ADMIN_TOKEN_FILE",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A bearer token. Its `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Arc<str>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Shortest token accepted: 16 characters, so a placeholder such as
/// "changeme" is refused at start-up instead of guarded against nothing.
pub const MIN_TOKEN_LEN: usize = 16;

impl Token {
    /// A token from its text; `what` names where it came from, for errors.
    pub fn new(text: &str, what: &str) -> Result<Self, SecurityError> {
        let text = text.trim();
        if text.len() < MIN_TOKEN_LEN {
            return Err(SecurityError::new(
                what,
                format!("a token must be at least {MIN_TOKEN_LEN} characters (e.g. `openssl rand -hex 32`)"),
            ));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(SecurityError::new(what, "a token must be printable ASCII without spaces"));
        }
        Ok(Self(text.into()))
    }

    /// The token in a file (surrounding whitespace, such as the final
    /// newline, is not part of it); a file others can read is refused
    /// unless `open` allows it ([`secret_file`]).
    pub fn from_file(path: &Path, what: &str, open: OpenSecrets) -> Result<Self, SecurityError> {
        let bytes = secret_file::read(path, what, open)?;
        let what = format!("{what} {}", path.display());
        let text = String::from_utf8(bytes).map_err(|_| SecurityError::new(&what, "a token must be printable ASCII"))?;
        Self::new(&text, &what)
    }

    /// The role's token from the environment: `LOADER_<ROLE>_TOKEN`, or the
    /// file `file` (its flag) / `LOADER_<ROLE>_TOKEN_FILE` names; `None`
    /// when neither is set, an error when both are.
    pub fn for_role(role: Role, file: Option<&Path>, open: OpenSecrets) -> Result<Option<Self>, SecurityError> {
        let value = std::env::var(role.token_var()).ok().filter(|v| !v.is_empty());
        let file = file
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os(role.token_file_var()).filter(|v| !v.is_empty()).map(Into::into));
        match (value, file) {
            (Some(_), Some(_)) => Err(SecurityError::new(
                role.token_var(),
                format!("set either {} or {}, not both", role.token_var(), role.token_file_var()),
            )),
            (Some(text), None) => Self::new(&text, role.token_var()).map(Some),
            (None, Some(path)) => Self::from_file(&path, role.token_file_var(), open).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// The secret, for the `authorization` header.
    pub fn secret(&self) -> &str {
        &self.0
    }

    fn digest(&self) -> [u8; 32] {
        let d = digest::digest(&digest::SHA256, self.0.as_bytes());
        let mut out = [0; 32];
        out.copy_from_slice(d.as_ref());
        out
    }
}

/// The tokens a server accepts, as digests, by role.
#[derive(Clone)]
pub struct RoleTokens {
    digests: Vec<(Role, [u8; 32])>,
}

impl fmt::Debug for RoleTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.digests.iter().map(|(r, _)| r)).finish()
    }
}

impl RoleTokens {
    /// Accepts `tokens`; two roles sharing one token is refused, since the
    /// server could not tell them apart.
    pub fn new(tokens: &[(Role, Token)]) -> Result<Self, SecurityError> {
        let digests: Vec<(Role, [u8; 32])> = tokens.iter().map(|(r, t)| (*r, t.digest())).collect();
        for (i, (a, da)) in digests.iter().enumerate() {
            if let Some((b, _)) = digests[i + 1..].iter().find(|(_, db)| db == da) {
                return Err(SecurityError::new(
                    format!("{} and {}", a.token_var(), b.token_var()),
                    "two roles have the same token; give each role its own",
                ));
            }
        }
        Ok(Self { digests })
    }

    /// The role whose token `presented` is, if any; every digest is
    /// compared, in constant time.
    pub fn role_of(&self, presented: &str) -> Option<Role> {
        let d = digest::digest(&digest::SHA256, presented.as_bytes());
        let mut found = None;
        for (role, want) in &self.digests {
            if bool::from(want.as_slice().ct_eq(d.as_ref())) {
                found = Some(*role);
            }
        }
        found
    }

    /// Whether this server knows a token for `role`.
    pub fn has(&self, role: Role) -> bool {
        self.digests.iter().any(|(r, _)| *r == role)
    }
}

/// Session keys: a trainer gets its session's key when it opens the
/// session and presents it with every call about that session and every
/// fetch from a worker. The key is an HMAC of (job, consumer, session)
/// under a secret derived from the worker token, which the coordinator and
/// the workers hold and trainers do not: workers check a fetch without
/// asking the coordinator, and a trainer cannot make a key for a session it
/// did not open.
#[derive(Clone)]
pub struct SessionKeys {
    key: hmac::Key,
}

impl fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}

impl SessionKeys {
    /// Keys derived from the worker token.
    pub fn from_worker_token(token: &Token) -> Self {
        let derived = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, token.secret().as_bytes()), b"loader session keys v1");
        Self { key: hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()) }
    }

    /// The key of `session` of `consumer` of `job`, as hex.
    pub fn key(&self, job: u64, consumer: u32, session: u64) -> String {
        let tag = hmac::sign(&self.key, &Self::message(job, consumer, session));
        tag.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `presented` is the key of that session (constant time).
    pub fn verify(&self, job: u64, consumer: u32, session: u64, presented: &str) -> bool {
        bool::from(self.key(job, consumer, session).as_bytes().ct_eq(presented.as_bytes()))
    }

    fn message(job: u64, consumer: u32, session: u64) -> [u8; 20] {
        let mut m = [0; 20];
        m[..8].copy_from_slice(&job.to_le_bytes());
        m[8..12].copy_from_slice(&consumer.to_le_bytes());
        m[12..].copy_from_slice(&session.to_le_bytes());
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(s: &str) -> Token {
        Token::new(s, "test").expect("valid token")
    }

    #[test]
    fn short_and_spaced_tokens_are_refused_in_one_line() {
        let e = Token::new("changeme", "LOADER_ADMIN_TOKEN").expect_err("too short");
        assert_eq!(e.to_string(), "LOADER_ADMIN_TOKEN: a token must be at least 16 characters (e.g. `openssl rand -hex 32`)");
        assert!(Token::new("0123456789 abcdef", "t").is_err());
        assert_eq!(token("  0123456789abcdef\n").secret(), "0123456789abcdef");
        assert_eq!(format!("{:?}", token("0123456789abcdef")), "Token(..)");
    }

    #[test]
    fn a_presented_token_maps_to_its_role_only() {
        let tokens = RoleTokens::new(&[
            (Role::Worker, token("worker-0123456789")),
            (Role::Trainer, token("trainer-0123456789")),
        ])
        .expect("distinct");
        assert_eq!(tokens.role_of("worker-0123456789"), Some(Role::Worker));
        assert_eq!(tokens.role_of("trainer-0123456789"), Some(Role::Trainer));
        assert_eq!(tokens.role_of("trainer-012345678"), None);
        assert_eq!(tokens.role_of(""), None);
        assert!(tokens.has(Role::Trainer) && !tokens.has(Role::Admin));
    }

    #[test]
    fn two_roles_with_one_token_are_refused() {
        let t = token("same-0123456789ab");
        let e = RoleTokens::new(&[(Role::Worker, t.clone()), (Role::Admin, t)]).expect_err("same");
        assert!(e.to_string().contains("two roles have the same token"), "{e}");
    }

    #[test]
    fn session_keys_bind_job_consumer_and_session() {
        let keys = SessionKeys::from_worker_token(&token("worker-0123456789"));
        let k = keys.key(7, 1, 42);
        assert_eq!(k.len(), 32);
        assert!(keys.verify(7, 1, 42, &k));
        assert!(!keys.verify(7, 1, 43, &k));
        assert!(!keys.verify(7, 0, 42, &k));
        assert!(!keys.verify(8, 1, 42, &k));
        assert!(!keys.verify(7, 1, 42, ""));
        let other = SessionKeys::from_worker_token(&token("worker-other-0123456789"));
        assert!(!other.verify(7, 1, 42, &k));
    }

    #[test]
    fn token_files_are_read_and_trimmed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t");
        std::fs::write(&path, "file-token-0123456789\n").expect("write");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
        let read = |p: &Path| Token::from_file(p, "--admin-token-file", OpenSecrets::Refuse);
        assert_eq!(read(&path).expect("read").secret(), "file-token-0123456789");
        let e = read(&dir.path().join("missing")).expect_err("missing");
        assert!(e.to_string().starts_with("--admin-token-file "), "{e}");
        assert!(e.to_string().contains("No such file"), "{e}");
    }
}
