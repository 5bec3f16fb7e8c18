//! Reading a secret (a token file, a TLS private key) from disk, refusing
//! one that other users can read: the one rule every binary and the
//! trainer SDK apply, as ssh does for private keys.
//!
//! A secret owned by the reader (or any user but root) may be readable by
//! its owner only (`chmod 600`). One owned by root may also be readable,
//! not writable, by its group: that is how a Kubernetes Secret volume
//! reaches a non-root pod (root-owned, group = the pod's `fsGroup`, mode
//! 0440 — the kubelet adds group read under `fsGroup` whatever
//! `defaultMode` says) and how `/etc/ssl/private` works (PostgreSQL allows
//! the same for its key). Platforms that cannot give even that (a Secret
//! volume without `fsGroup`, 0644 by default) opt out with
//! `--allow-open-secrets` / `LOADER_ALLOW_OPEN_SECRETS=1`; docs/security.md
//! lists them.
//!
//! The mode is read from the open file, so the bytes checked are the
//! bytes read even if the path is swapped in between.

use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use super::SecurityError;

/// Whether secret files that group or others can read are accepted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OpenSecrets {
    /// Refused in one line naming the file and its mode (the default).
    #[default]
    Refuse,
    /// Accepted: the platform cannot make them private (`--allow-open-secrets`).
    Allow,
}

/// The flag that accepts open secret files, for messages.
pub const ALLOW_FLAG: &str = "--allow-open-secrets";
/// The environment variable that accepts them (the flag's, and the SDK's).
pub const ALLOW_VAR: &str = "LOADER_ALLOW_OPEN_SECRETS";

/// Mode bits a secret file may not have: any access by group or others.
const PRIVATE: u32 = 0o077;
/// Mode bits a root-owned secret file may not have: group write or
/// execute, any access by others (group read is how a non-root process
/// reads a root-owned Secret mount).
const ROOT_OWNED: u32 = 0o037;

/// Reads the secret at `path`; `what` names the setting (a flag or
/// variable) for errors, which read `<what> <path>: <cause>`.
pub fn read(path: &Path, what: &str, open: OpenSecrets) -> Result<Vec<u8>, SecurityError> {
    let what = format!("{what} {}", path.display());
    let mut file = std::fs::File::open(path).map_err(|e| SecurityError::new(&what, e))?;
    let meta = file.metadata().map_err(|e| SecurityError::new(&what, e))?;
    check(meta.mode(), meta.uid(), open).map_err(|cause| SecurityError::new(&what, cause))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|e| SecurityError::new(&what, e))?;
    Ok(bytes)
}

/// Why a file of `mode` owned by `uid` cannot hold a secret, if it cannot.
fn check(mode: u32, uid: u32, open: OpenSecrets) -> Result<(), String> {
    let forbidden = if uid == 0 { ROOT_OWNED } else { PRIVATE };
    if open == OpenSecrets::Allow || mode & forbidden == 0 {
        return Ok(());
    }
    Err(format!(
        "mode {:04o} lets group or others read this secret; chmod 600 it, or pass {ALLOW_FLAG} ({ALLOW_VAR}=1) \
         where the platform cannot (some Kubernetes Secret mounts, docs/security.md)",
        mode & 0o7777
    ))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn only_private_files_are_read_unless_allowed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("admin.token");
        std::fs::write(&path, "secret").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = read(&path, "--admin-token-file", OpenSecrets::Refuse).expect_err("0644");
        assert_eq!(
            e.to_string(),
            format!(
                "--admin-token-file {}: mode 0644 lets group or others read this secret; chmod 600 it, or pass \
                 --allow-open-secrets (LOADER_ALLOW_OPEN_SECRETS=1) where the platform cannot (some Kubernetes \
                 Secret mounts, docs/security.md)",
                path.display()
            )
        );
        assert_eq!(read(&path, "t", OpenSecrets::Allow).expect("allowed"), b"secret");
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            assert_eq!(read(&path, "t", OpenSecrets::Refuse).expect("private"), b"secret");
        }
        // Refused whoever owns the file (tests may run as root, whose files
        // may be group-readable).
        for mode in [0o604, 0o620, 0o601, 0o660] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let e = read(&path, "t", OpenSecrets::Refuse).expect_err("open");
            assert!(e.to_string().contains(&format!("mode {mode:04o}")), "{e}");
        }
    }

    #[test]
    fn root_owned_files_may_be_read_by_their_group() {
        // What a Secret volume under fsGroup looks like, and /etc/ssl/private.
        assert_eq!(check(0o100440, 0, OpenSecrets::Refuse), Ok(()));
        assert_eq!(check(0o100640, 0, OpenSecrets::Refuse), Ok(()));
        assert!(check(0o100444, 0, OpenSecrets::Refuse).is_err());
        assert!(check(0o100460, 0, OpenSecrets::Refuse).is_err());
        assert!(check(0o100440, 1000, OpenSecrets::Refuse).is_err());
        assert_eq!(check(0o100644, 1000, OpenSecrets::Allow), Ok(()));
    }

    #[test]
    fn a_missing_file_names_the_setting_and_the_path() {
        let e = read(Path::new("/nonexistent/x"), "--tls-key", OpenSecrets::Refuse).expect_err("missing");
        assert!(e.to_string().starts_with("--tls-key /nonexistent/x: "), "{e}");
        assert!(e.to_string().contains("No such file"), "{e}");
    }
}
