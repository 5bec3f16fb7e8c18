//! Test certificates, made with rcgen: a CA, and leaf certificates it signs
//! for `localhost` and `127.0.0.1`, usable both as server and as client
//! certificates (as a Loader worker's is). Written as PEM files, as an
//! operator (or cert-manager) would hand them over: keys mode 0600, which
//! the binaries insist on.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// A certificate authority whose files are in a directory.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    dir: PathBuf,
    name: String,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").field("name", &self.name).finish()
    }
}

/// A leaf certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct TestCert {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

impl TestCa {
    /// A new CA named `name`, its certificate written to `dir/<name>.pem`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, format!("Loader test CA {name}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).expect("CA certificate");
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).expect("write CA");
        TestCa { issuer: Issuer::new(params, key), dir: dir.to_owned(), name: name.to_owned() }
    }

    /// The CA's certificate file.
    pub fn cert(&self) -> PathBuf {
        self.dir.join(format!("{}.pem", self.name))
    }

    /// A leaf for `localhost` and `127.0.0.1`, for servers and clients,
    /// written to `dir/<leaf>.pem` and `dir/<leaf>.key`.
    pub fn leaf(&self, leaf: &str) -> TestCert {
        self.leaf_with(leaf, |_| {})
    }

    /// A leaf as [`leaf`](Self::leaf) that expired on 2020-01-01.
    pub fn expired_leaf(&self, leaf: &str) -> TestCert {
        self.leaf_with(leaf, |params| {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        })
    }

    fn leaf_with(&self, leaf: &str, edit: impl FnOnce(&mut CertificateParams)) -> TestCert {
        let key = KeyPair::generate().expect("leaf key");
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, leaf);
        edit(&mut params);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).expect("leaf certificate");
        let out = TestCert { cert: self.dir.join(format!("{leaf}.pem")), key: self.dir.join(format!("{leaf}.key")) };
        std::fs::write(&out.cert, cert.pem()).expect("write leaf");
        write_secret(&out.key, key.serialize_pem().as_bytes());
        out
    }
}

/// Writes a secret (a token, a private key) as an operator should: mode
/// 0600, since the binaries refuse one that group or others can read.
pub fn write_secret(path: &Path, contents: &[u8]) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, contents).expect("write secret");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600 secret");
}
