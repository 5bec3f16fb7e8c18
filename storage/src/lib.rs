//! Where a dataset's bytes come from.
//!
//! A dataset names its files by path (`/data/tokens.bin`), read through
//! `mmap` by the workers, or by URL (`s3://bucket/tokens.bin`), read here
//! from object storage. Both the submitter (which counts what a dataset
//! holds, `loader_listing`) and the workers go through this crate, so they
//! see the same objects.
//!
//! # Layout
//! - [`location`]: telling a URL from a path, and which stores are known.
//! - [`stores`]: one client per bucket, configured the way the AWS CLI and
//!   boto3 are (environment variables; `AWS_ENDPOINT_URL` for an
//!   S3-compatible store).
//! - [`io`]: the runtime object requests run on, and waiting on them from
//!   the workers' threads (datasets are read synchronously).
//! - [`listing`]: the objects under a prefix (an image folder), and many
//!   small objects fetched at once.
//! - [`local_copy`]: where fetched bytes are kept on local disk, and the
//!   byte budget they share.
//! - [`node_pile`]: a folder's small objects kept once for the workers of a
//!   node, when the local copy is shared.
//! - `node_chunks`: a large object's chunks kept, and fetched, once for the
//!   workers of a node, when the local copy is shared.
//! - [`pile`]: many small objects (an image folder's images) kept in one
//!   file of the local copy.
//! - [`object`]: one object, read in chunks of a few MB (a sample is a
//!   copy out of a chunk; neighbouring samples share a request), chunks
//!   fetched ahead of need, many in flight, and kept while a byte budget
//!   allows; every read is pinned to the ETag seen at open, so an object
//!   replaced mid-job is an error, never a mix of two versions.
//! - [`reader`]: an object read as a file (`Read + Seek`), for code that
//!   walks a file from its start (tar indexes, npy headers).
//! - `slot`: one request's answer, waited for from any thread.
//! - `attempts`: the HTTP client every request goes through, counting the
//!   attempts the store's client retries (it retries out of our sight).
//! - `meters`: requests, retries, latency, bytes and the local copy's hit
//!   ratio, for Prometheus, and as this process's [`totals`] (for the
//!   worker's heartbeats: `loaderctl status` and `top`).
//! - [`error`]: one line for each way a store can fail.

mod attempts;
pub mod error;
pub mod io;
pub mod listing;
pub mod local_copy;
pub mod location;
mod node_chunks;
pub mod node_pile;
mod meters;
pub mod object;
pub mod pile;
pub mod reader;
mod slot;
pub mod stores;

pub use error::{ErrorKind, StorageError};
pub use listing::{Listed, get, get_many, list};
pub use location::{ObjectUrl, is_url};
pub use meters::{LATENCY_BUCKETS, StorageTotals, flush_reads, totals};
pub use object::RemoteObject;
pub use pile::{Got, Pile};
pub use reader::ObjectReader;
