//! A certificate's validity window, read from its DER with x509-parser, so
//! that an expired or not-yet-valid certificate is named where it shows:
//! a server that refuses a client's certificate under TLS 1.3 only hangs
//! up (it checks the certificate after the client's side of the handshake
//! is done), and a server serving an expired certificate fails every
//! client. Both are told apart here, at load time, against this machine's
//! clock.

use std::time::SystemTime;

/// Why a certificate is outside its validity window now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outside {
    /// Its `notAfter` has passed (the date, as written in the certificate).
    Expired(String),
    /// Its `notBefore` is still ahead.
    NotYetValid(String),
}

impl Outside {
    /// The problem in words, for a certificate shown as `what` ("this
    /// client's certificate (--tls-cert /etc/x.pem)").
    pub(crate) fn describe(&self, what: &str) -> String {
        match self {
            Outside::Expired(at) => format!("{what} expired on {at}: renew it"),
            Outside::NotYetValid(at) => {
                format!("{what} is not valid before {at}: check this machine's clock, or wait")
            }
        }
    }
}

/// Whether the leaf `der` is outside its validity window at `now`; `None`
/// when it is inside, or when it does not parse (rustls reports that).
pub(crate) fn outside(der: &[u8], now: SystemTime) -> Option<Outside> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let validity = cert.validity();
    let now = match now.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(_) => return None,
    };
    if now > validity.not_after.timestamp() {
        Some(Outside::Expired(validity.not_after.to_string()))
    } else if now < validity.not_before.timestamp() {
        Some(Outside::NotYetValid(validity.not_before.to_string()))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Valid from 2000-01-01 to 2001-01-01 (UTC).
    fn cert() -> Vec<u8> {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    const Y2000: u64 = 946_684_800;
    const Y2001: u64 = 978_307_200;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn inside_before_and_after_the_window() {
        let der = cert();
        assert_eq!(outside(&der, at(Y2000 + 1)), None);
        assert!(matches!(outside(&der, at(Y2001 + 1)), Some(Outside::Expired(_))));
        assert!(matches!(outside(&der, at(Y2000 - 1)), Some(Outside::NotYetValid(_))));
        let said = outside(&der, at(Y2001 + 1)).expect("expired").describe("this client's certificate (--tls-cert c.pem)");
        assert!(said.starts_with("this client's certificate (--tls-cert c.pem) expired on "), "{said}");
        assert!(said.contains("2001"), "{said}");
    }

    #[test]
    fn bytes_that_are_not_a_certificate_are_left_to_rustls() {
        assert_eq!(outside(b"not a certificate", SystemTime::now()), None);
        assert_eq!(outside(&[], SystemTime::now()), None);
    }
}
