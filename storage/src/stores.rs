//! One store client per bucket, configured as the AWS CLI and boto3 are.
//!
//! Configuration comes from the environment: `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` (or
//! `AWS_DEFAULT_REGION`), and `AWS_ENDPOINT_URL` for an S3-compatible store
//! (MinIO, Ceph RGW, R2, GCS's S3 API); an `http://` endpoint is allowed,
//! for a store on the local network. Without keys, the client asks web
//! identity (`AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`: IRSA on EKS),
//! ECS task credentials or the instance's metadata service, as
//! `object_store`'s `AmazonS3Builder::from_env` does. Credential files
//! (`~/.aws/credentials` profiles) are not read.
//!
//! Requests that fail with a server error or time out are retried with
//! exponential backoff and jitter (each backoff drawn between 0.1 s and
//! twice the one before, at most 15 s), within [`RETRY_TIMEOUT`]; then the
//! read fails naming the object. How many times depends on who reads:
//!
//! - a worker ([`ride_out_outages`]) retries until the time is spent: a
//!   store that throttles (`503 Slow Down`) or restarts for a few seconds
//!   delays its batches, it does not fail the job;
//! - a submitter (the SDKs, `loaderctl`) retries [`RETRIES`] times, spent
//!   in 1-4 s, so that a wrong endpoint or a store that is down is said at
//!   once, when the job is submitted.
//!
//! `LOADER_STORAGE_RETRY_TIMEOUT` (seconds, [`RETRY_TIMEOUT_VAR`]) sets
//! that time instead, for operators whose stores or networks want more
//! patience or less; it also bounds each request's and connection's own
//! time, so that a store that stops answering fails a read within it. A
//! value that is not a number of seconds fails every read in one line
//! naming the variable, rather than running with a limit nobody chose.
//! The attempts retried are counted, as `loader_storage_retries_total`
//! (`attempts`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use crate::attempts::CountingConnector;
use crate::error::ErrorKind;
use crate::{ObjectUrl, StorageError};

/// Retries of one request before a submitter's read fails.
pub const RETRIES: usize = 8;
/// A worker's retries: as many as fit in the time ([`RETRY_TIMEOUT`]),
/// which ends them first.
const WORKER_RETRIES: usize = 1000;

/// Whether this process retries until [`RETRY_TIMEOUT`] ends it.
static RIDES_OUT: AtomicBool = AtomicBool::new(false);

/// Makes this process's reads retry a failing store until the retry time
/// is spent, not [`RETRIES`] times: what a worker does, whose batches can
/// wait out a throttle or a store's restart. Call before the first read.
pub fn ride_out_outages() {
    RIDES_OUT.store(true, Ordering::Relaxed);
}
/// Longest a request and its retries may take, unless
/// [`RETRY_TIMEOUT_VAR`] says otherwise.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(60);
/// The environment variable that replaces [`RETRY_TIMEOUT`], in seconds.
pub const RETRY_TIMEOUT_VAR: &str = "LOADER_STORAGE_RETRY_TIMEOUT";
/// The largest [`RETRY_TIMEOUT_VAR`]: past an hour a read that waits is a
/// job that hangs.
const MAX_RETRY_TIMEOUT: Duration = Duration::from_secs(3600);
/// Longest one request may take (a 16 MB range at a slow link included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A bucket's client, and the endpoint it talks to (for messages).
#[derive(Clone, Debug)]
pub struct Store {
    pub(crate) client: Arc<dyn ObjectStore>,
    pub(crate) endpoint: String,
    /// The longest one request may take with all its retries.
    pub(crate) longest: Duration,
}

/// The client of `url`'s bucket, built once per process and bucket.
pub fn store(url: &ObjectUrl) -> Result<Store, StorageError> {
    static STORES: Mutex<Option<HashMap<String, Store>>> = Mutex::new(None);
    let mut stores = STORES.lock().unwrap_or_else(|p| p.into_inner());
    let stores = stores.get_or_insert_with(HashMap::new);
    if let Some(s) = stores.get(&url.bucket) {
        return Ok(s.clone());
    }
    let budget = std::env::var_os(RETRY_TIMEOUT_VAR).map(|v| v.to_string_lossy().into_owned());
    let s = build(url, budget.as_deref())?;
    stores.insert(url.bucket.clone(), s.clone());
    Ok(s)
}

/// The client of `url`'s bucket; `retry_budget` is [`RETRY_TIMEOUT_VAR`]'s
/// value, if set.
fn build(url: &ObjectUrl, retry_budget: Option<&str>) -> Result<Store, StorageError> {
    let config = |problem: String| StorageError::new(url.to_string(), ErrorKind::Config, problem);
    let builder = AmazonS3Builder::from_env().with_bucket_name(&url.bucket);
    let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint).unwrap_or_default();
    let retry_timeout = retry_timeout(retry_budget).map_err(config)?;
    let max_retries = if RIDES_OUT.load(Ordering::Relaxed) { WORKER_RETRIES } else { RETRIES };
    let retry = RetryConfig { max_retries, retry_timeout, ..RetryConfig::default() };
    // A plain-HTTP store with keys given talks TLS to nobody: the
    // system's root certificates (~150 files parsed, in every worker
    // process before its first request) are not loaded. Without keys,
    // credentials may come from an HTTPS service (STS for web identity),
    // which needs them.
    let plain_http = endpoint.starts_with("http://");
    let keys_given = builder.get_config_value(&AmazonS3ConfigKey::AccessKeyId).is_some();
    let client = builder
        .with_retry(retry)
        // Counts the attempts those retries follow (`attempts`).
        .with_http_connector(CountingConnector::default())
        .with_client_options(
            ClientOptions::new()
                .with_timeout(REQUEST_TIMEOUT.min(retry_timeout))
                .with_connect_timeout(CONNECT_TIMEOUT.min(retry_timeout))
                // A store on the local network may speak plain HTTP.
                .with_allow_http(plain_http)
                .with_no_system_certificates(plain_http && keys_given),
        )
        .build()
        .map_err(|e| config(e.to_string()))?;
    Ok(Store { client: Arc::new(client), endpoint, longest: retry_timeout + REQUEST_TIMEOUT })
}

/// The retry budget `value` (of [`RETRY_TIMEOUT_VAR`]) asks for:
/// [`RETRY_TIMEOUT`] when unset, else seconds (`10`, `2.5`) above 0 and at
/// most [`MAX_RETRY_TIMEOUT`].
fn retry_timeout(value: Option<&str>) -> Result<Duration, String> {
    let Some(value) = value else { return Ok(RETRY_TIMEOUT) };
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && *s <= MAX_RETRY_TIMEOUT.as_secs_f64())
        .map(Duration::from_secs_f64)
        .ok_or_else(|| {
            format!(
                "{RETRY_TIMEOUT_VAR}={value:?} is not a number of seconds above 0 and at most {} \
                 (how long a store's request and its retries may take; unset, {} s)",
                MAX_RETRY_TIMEOUT.as_secs(),
                RETRY_TIMEOUT.as_secs()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_budget_is_seconds_or_a_one_line_error_naming_the_variable() {
        assert_eq!(retry_timeout(None), Ok(RETRY_TIMEOUT));
        assert_eq!(retry_timeout(Some("5")), Ok(Duration::from_secs(5)));
        assert_eq!(retry_timeout(Some(" 2.5 ")), Ok(Duration::from_millis(2500)));
        assert_eq!(retry_timeout(Some("3600")), Ok(MAX_RETRY_TIMEOUT));
        for bad in ["", "abc", "0", "-1", "NaN", "inf", "3601", "5s", "1e9"] {
            let e = retry_timeout(Some(bad)).expect_err(bad);
            assert!(e.starts_with(&format!("{RETRY_TIMEOUT_VAR}={bad:?} is not a number of seconds")), "{bad}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn a_bad_retry_budget_fails_the_read_in_one_line_naming_the_object_and_the_variable() {
        let url = ObjectUrl::parse("s3://b/k").expect("url");
        let e = build(&url, Some("soon")).expect_err("a bad budget");
        assert_eq!(e.kind, ErrorKind::Config);
        assert!(e.to_string().starts_with("s3://b/k: LOADER_STORAGE_RETRY_TIMEOUT=\"soon\" is not a number of seconds"), "{e}");
        assert!(build(&url, Some("2")).is_ok(), "a good one builds");
    }
}
