//! [`CacheUse`]: this worker's sample cache use, per job, for its
//! heartbeats (the coordinator adds the workers' counts up per job for
//! `loaderctl status` and `top`).
//!
//! A cache counts its readers' use per thread (`sample_cache::own_use`),
//! not per job: the cache is the trainer's, and the dataset reading
//! through it does not know which job it serves. The producer thread makes
//! one batch at a time and reads every sample itself, so the counts that
//! moved on it while it made a task's batches are that task's job's.

use std::collections::VecDeque;
use std::sync::Mutex;

use loader_proto::pb;

use crate::sample_cache::{self, Off, OwnUse};

/// Jobs whose counts a worker keeps (and reports, every heartbeat): the
/// least recently used go first. A worker serves a few jobs at a time.
const JOBS_KEPT: usize = 64;

/// Per job: this worker's counts since it started, and why the cache was
/// off, if it was found off.
#[derive(Debug, Default)]
pub(crate) struct CacheUse {
    jobs: Mutex<VecDeque<(u64, OwnUse, Option<Off>)>>,
}

/// Where the counts stood when a task started.
#[derive(Debug)]
pub(crate) struct Mark(OwnUse);

impl CacheUse {
    /// Marks the start of a task: its use is what this thread counts from
    /// here.
    pub(crate) fn mark() -> Mark {
        sample_cache::take_off_seen();
        Mark(sample_cache::own_use())
    }

    /// Credits job `job_id` with what this thread counted since `mark`, and the
    /// cache's being off if it was found off meanwhile. A job that used no
    /// cache is not listed.
    pub(crate) fn credit(&self, job_id: u64, mark: Mark) {
        let used = sample_cache::own_use().since(&mark.0);
        let off = sample_cache::take_off_seen();
        if used.is_empty() && off.is_none() {
            return;
        }
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let mut entry = match jobs.iter().position(|(job, ..)| *job == job_id) {
            Some(at) => jobs.remove(at).unwrap_or_default(),
            None => (job_id, OwnUse::default(), None),
        };
        entry.1.add(&used);
        entry.2 = entry.2.or(off);
        jobs.push_back(entry);
        if jobs.len() > JOBS_KEPT {
            jobs.pop_front();
        }
    }

    /// Every job's counts, for a heartbeat.
    pub(crate) fn report(&self) -> Vec<pb::JobCacheUse> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.iter()
            .map(|(job_id, used, off)| pb::JobCacheUse {
                job_id: *job_id,
                r#use: Some(pb::CacheUse {
                    hits: used.hits,
                    misses: used.misses,
                    stored_bytes: used.stored_bytes,
                    refused: used.refused,
                    off: off.map(Off::name).unwrap_or_default().to_owned(),
                }),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample_cache::SampleCache;

    /// What a cache counted while a task ran is its job's, and a cache
    /// found off says so; jobs that used none are not listed.
    #[test]
    fn use_is_credited_to_the_job_of_the_task() {
        let cache = SampleCache::create(4, 4096, None).expect("create");
        let uses = CacheUse::default();
        let mark = CacheUse::mark();
        uses.credit(7, mark);
        assert!(uses.report().is_empty(), "no use, no entry");

        let mark = CacheUse::mark();
        assert_eq!(cache.put(0, &[b"abc"]), sample_cache::Put::Stored);
        assert!(cache.get(0).is_some());
        cache.record_hit(None);
        cache.record_miss(10);
        uses.credit(7, mark);
        let mark = CacheUse::mark();
        cache.record_hit(None);
        uses.credit(7, mark);
        let report = uses.report();
        assert_eq!(report.len(), 1);
        let used = report[0].r#use.clone().unwrap_or_default();
        assert_eq!((report[0].job_id, used.hits, used.misses, used.stored_bytes, used.off.as_str()), (7, 2, 1, 3, ""));

        cache.turn_off(Off::DoesNotPay);
        let mark = CacheUse::mark();
        assert!(cache.get(0).is_none(), "off");
        uses.credit(8, mark);
        let report = uses.report();
        let eight = report.iter().find(|j| j.job_id == 8).and_then(|j| j.r#use.clone()).unwrap_or_default();
        assert_eq!((eight.hits, eight.off.as_str()), (0, "does-not-pay"));
    }
}
