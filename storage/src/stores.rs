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
//! exponential backoff and jitter, at most [`RETRIES`] times within
//! [`RETRY_TIMEOUT`]; then the read fails naming the object.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use crate::error::ErrorKind;
use crate::{ObjectUrl, StorageError};

/// Retries of one request before its read fails.
pub const RETRIES: usize = 8;
/// Longest a request and its retries may take.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest one request may take (a 16 MB range at a slow link included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A bucket's client, and the endpoint it talks to (for messages).
#[derive(Clone, Debug)]
pub struct Store {
    pub(crate) client: Arc<dyn ObjectStore>,
    pub(crate) endpoint: String,
}

/// The client of `url`'s bucket, built once per process and bucket.
pub fn store(url: &ObjectUrl) -> Result<Store, StorageError> {
    static STORES: Mutex<Option<HashMap<String, Store>>> = Mutex::new(None);
    let mut stores = STORES.lock().unwrap_or_else(|p| p.into_inner());
    let stores = stores.get_or_insert_with(HashMap::new);
    if let Some(s) = stores.get(&url.bucket) {
        return Ok(s.clone());
    }
    let s = build(url)?;
    stores.insert(url.bucket.clone(), s.clone());
    Ok(s)
}

fn build(url: &ObjectUrl) -> Result<Store, StorageError> {
    let config = |problem: String| StorageError::new(url.to_string(), ErrorKind::Config, problem);
    let builder = AmazonS3Builder::from_env().with_bucket_name(&url.bucket);
    let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint).unwrap_or_default();
    let retry = RetryConfig { max_retries: RETRIES, retry_timeout: RETRY_TIMEOUT, ..RetryConfig::default() };
    let client = builder
        .with_retry(retry)
        .with_client_options(
            ClientOptions::new()
                .with_timeout(REQUEST_TIMEOUT)
                .with_connect_timeout(CONNECT_TIMEOUT)
                // A store on the local network may speak plain HTTP.
                .with_allow_http(endpoint.starts_with("http://")),
        )
        .build()
        .map_err(|e| config(e.to_string()))?;
    Ok(Store { client: Arc::new(client), endpoint })
}
