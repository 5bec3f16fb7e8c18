//! `loaderctl run --cache SIZE`: the sample cache the run's workers share,
//! keeping each image of a built-in image job decoded across epochs
//! (docs/images.md, "Kept frames"), as `Loader.local(spec, cache=...)`
//! does for Python users.
//!
//! This process creates the cache (a memfd, or an unnamed file in
//! `--cache-dir`) and its workers inherit the descriptor across `exec`,
//! named in their environment: the file goes when the last of them closes
//! it, so nothing is left behind, even after SIGKILL.

use std::ffi::OsString;
use std::path::Path;

use anyhow::Context;
use loader_proto::pb::JobSpec;
use loader_worker::sample_cache::{self, Off, SampleCache};
use serde::Serialize;

/// The cache for `spec`'s workers, of `bytes` bytes of frames, and the
/// variable that names it to them.
pub(crate) fn create(spec: &JobSpec, bytes: u64, dir: Option<&Path>) -> anyhow::Result<(SampleCache, (OsString, OsString))> {
    let entries = loader_worker::dataset::frame_cache_entries(spec)
        .map_err(anyhow::Error::msg)?
        .context("--cache: only an image_folder or webdataset job keeps frames (its decoded images)")?;
    let cache = SampleCache::create(entries, bytes, dir).map_err(|e| anyhow::anyhow!("--cache: {e}"))?;
    cache.inherit_across_exec().context("--cache: cannot hand the cache to the workers")?;
    let variable = (OsString::from(sample_cache::INHERITED), OsString::from(cache.variable()));
    Ok((cache, variable))
}

/// What the run's report says of the cache (`--json`: `cache`).
#[derive(Debug, Serialize)]
pub(crate) struct CacheReport {
    /// Whether it was still on at the end.
    on: bool,
    /// Why a worker turned it off, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    off_reason: Option<&'static str>,
    hits: u64,
    misses: u64,
    stored_bytes: u64,
    /// Frames not kept because the budget was full.
    refused: u64,
}

impl CacheReport {
    /// The counters of every worker, summed in the cache's header.
    pub(crate) fn of(cache: &SampleCache) -> Self {
        let s = cache.stats();
        Self {
            on: s.off.is_none(),
            off_reason: s.off.map(Off::describe),
            hits: s.hits,
            misses: s.misses,
            stored_bytes: s.stored_bytes,
            refused: s.refused,
        }
    }

    /// One line for a terminal.
    pub(crate) fn line(&self) -> String {
        let reads = (self.hits + self.misses).max(1) as f64;
        let state = match self.off_reason {
            Some(why) => format!("off ({why})"),
            None => "on".into(),
        };
        format!(
            "sample cache {state}: {:.0}% of {} reads hit, {:.1} MB kept, {} frames over budget",
            100.0 * self.hits as f64 / reads,
            self.hits + self.misses,
            self.stored_bytes as f64 / 1e6,
            self.refused
        )
    }
}
