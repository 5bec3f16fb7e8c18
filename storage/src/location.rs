//! A dataset file's name: a local path, or an object's URL.

use std::fmt;

use crate::StorageError;
use crate::error::ErrorKind;

/// Schemes read from object storage.
const SCHEMES: &[&str] = &["s3://"];
/// Schemes people may try that are not read (yet), with what to do instead.
const OTHER_SCHEMES: &[(&str, &str)] = &[
    ("gs://", "read Google Cloud Storage through its S3 API: s3://BUCKET/... with AWS_ENDPOINT_URL=https://storage.googleapis.com and HMAC keys"),
    ("az://", "Azure Blob Storage is not supported yet; copy the data to an S3-compatible store or a local path"),
    ("abfs://", "Azure Blob Storage is not supported yet; copy the data to an S3-compatible store or a local path"),
    ("http://", "plain HTTP URLs are not read; serve the data from an S3-compatible store (AWS_ENDPOINT_URL may be http://)"),
    ("https://", "plain HTTPS URLs are not read; name the object as s3://BUCKET/KEY (AWS_ENDPOINT_URL for another store)"),
];

/// Whether `name` is an object URL (any `scheme://`), not a local path.
pub fn is_url(name: &str) -> bool {
    name.split_once("://").is_some_and(|(scheme, _)| !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric()))
}

/// An object (or a prefix of objects) in a bucket.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectUrl {
    /// The bucket.
    pub bucket: String,
    /// The key, without a leading `/`; may be empty (the whole bucket) or
    /// end in `/` (a prefix).
    pub key: String,
}

impl ObjectUrl {
    /// Parses `s3://bucket/key`; any other scheme is refused in one line
    /// that says what to do instead.
    pub fn parse(url: &str) -> Result<Self, StorageError> {
        let bad = |problem: &str| StorageError::new(url, ErrorKind::BadUrl, problem);
        let Some(rest) = SCHEMES.iter().find_map(|s| url.strip_prefix(s)) else {
            if let Some((_, what)) = OTHER_SCHEMES.iter().find(|(s, _)| url.starts_with(s)) {
                return Err(bad(what));
            }
            return Err(bad("only s3:// URLs are read from object storage (or give a local path)"));
        };
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("names no bucket (s3://BUCKET/KEY)"));
        }
        if !bucket.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')) {
            return Err(bad("the bucket name holds characters S3 does not allow"));
        }
        Ok(Self { bucket: bucket.to_owned(), key: key.to_owned() })
    }
}

impl fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_paths_are_told_apart() {
        assert!(is_url("s3://b/k") && is_url("gs://b/k") && is_url("https://x/y"));
        assert!(!is_url("/data/a.bin") && !is_url("data/s3://x") && !is_url("C:/x") && !is_url("://x"));
    }

    #[test]
    fn s3_urls_parse_and_others_say_what_to_do() {
        let u = ObjectUrl::parse("s3://my-bucket/a/b.bin").expect("parses");
        assert_eq!((u.bucket.as_str(), u.key.as_str()), ("my-bucket", "a/b.bin"));
        assert_eq!(u.to_string(), "s3://my-bucket/a/b.bin");
        assert_eq!(ObjectUrl::parse("s3://b").expect("bucket only").key, "");
        for (url, words) in [
            ("s3:///k", "no bucket"),
            ("s3://b b/k", "characters"),
            ("gs://b/k", "S3 API"),
            ("az://b/k", "not supported"),
            ("ftp://b/k", "only s3://"),
        ] {
            let e = ObjectUrl::parse(url).expect_err(url).to_string();
            assert!(e.contains(words) && e.contains(url) && !e.contains('\n'), "{url}: {e}");
        }
    }
}
