//! How reading from a store fails: one line each, naming the object.

/// What went wrong, for callers that act on it (a changed object is the
/// job's corrupt-sample error; a store that is down gives the batch back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The URL cannot be read as an object's.
    BadUrl,
    /// The store cannot be configured from the environment.
    Config,
    /// No such object or bucket.
    NotFound,
    /// The store refused the credentials or the access.
    Denied,
    /// The object is not the one the job opened (replaced, rewritten,
    /// deleted), or a read is past its end.
    Changed,
    /// The store did not answer, or failed, after every retry.
    Unavailable,
}

/// A failed storage operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{url}: {problem}")]
pub struct StorageError {
    /// The object (or prefix) at fault, as given.
    pub url: String,
    /// What kind of failure.
    pub kind: ErrorKind,
    /// What went wrong, and what to do.
    pub problem: String,
}

impl StorageError {
    pub(crate) fn new(url: impl Into<String>, kind: ErrorKind, problem: impl Into<String>) -> Self {
        Self { url: url.into(), kind, problem: problem.into() }
    }

    /// The error `e` of an operation on `url`, made one line.
    pub(crate) fn from_store(url: &str, endpoint: &str, e: object_store::Error) -> Self {
        let at = if endpoint.is_empty() { String::new() } else { format!(" at {endpoint}") };
        match e {
            object_store::Error::NotFound { .. } => {
                Self::new(url, ErrorKind::NotFound, format!("no such object (check the bucket and key; the store{at})"))
            }
            object_store::Error::PermissionDenied { source, .. } | object_store::Error::Unauthenticated { source, .. } => {
                Self::new(
                    url,
                    ErrorKind::Denied,
                    format!(
                        "access denied: {} (credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / \
                         AWS_SESSION_TOKEN, web identity, or the instance's role)",
                        one_line(&source.to_string())
                    ),
                )
            }
            object_store::Error::Precondition { .. } | object_store::Error::NotModified { .. } => Self::changed(url, "its ETag no longer matches"),
            other => Self::new(url, ErrorKind::Unavailable, format!("the store{at} failed: {}", one_line(&causes(&other)))),
        }
    }

    /// The object changed since it was opened; `how` says how.
    pub(crate) fn changed(url: &str, how: &str) -> Self {
        Self::new(url, ErrorKind::Changed, format!("the object changed since the job opened it ({how}); its bytes would mix two versions"))
    }
}

/// The first and the innermost message of `e`'s chain: a retry error's
/// summary and the last response, a connection refused, a DNS failure.
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let first = e.to_string();
    let mut last = None;
    let mut source = e.source();
    while let Some(s) = source {
        last = Some(s.to_string());
        source = s.source();
    }
    match last {
        Some(last) if !first.contains(last.as_str()) => format!("{first}: {last}"),
        _ => first,
    }
}

/// `s` on one line; without the dangling `:` of a status whose answer had
/// no body (`503 Service Unavailable:`, as every HEAD's).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ").trim_end_matches([':', ' ']).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_error(message: &str) -> Box<dyn std::error::Error + Send + Sync> {
        Box::new(std::io::Error::other(message.to_owned()))
    }

    #[test]
    fn a_store_failure_is_one_line_naming_the_object_and_the_store() {
        let e = object_store::Error::Generic { store: "S3", source: store_error("after 8 retries - 503 Service Unavailable: ") };
        let e = StorageError::from_store("s3://b/k", "http://127.0.0.1:9", e);
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert_eq!(e.to_string(), "s3://b/k: the store at http://127.0.0.1:9 failed: Generic S3 error: after 8 retries - 503 Service Unavailable");
    }

    #[test]
    fn a_refusal_with_a_multi_line_body_is_one_line() {
        let body = "403 Forbidden: <?xml version=\"1.0\"?>\n<Error>\n  <Code>AccessDenied</Code>\n</Error>\n";
        let e = object_store::Error::PermissionDenied { path: "k".into(), source: store_error(body) };
        let e = StorageError::from_store("s3://b/k", "", e).to_string();
        assert!(e.starts_with("s3://b/k: access denied: 403 Forbidden: <?xml version=\"1.0\"?> <Error> <Code>AccessDenied</Code> </Error> (credentials"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
