//! Telling a dataset whose reads wait on a network (objects in a store)
//! which batches this worker makes next.
//!
//! A worker's queued tasks say which batches it makes next, and the plan
//! says which samples each holds. A dataset that reads from a store starts
//! fetching those samples' bytes while the worker makes the batch at hand,
//! so that a batch's fetch overlaps the decoding of the ones before it
//! instead of following it. A local dataset is never asked: it has
//! nothing to wait on.

use loader_proto::pb::Task;
use loader_job::sampler::Plan;

use crate::dataset::{Dataset, SampleKey};

/// Batches after the one being made that a dataset is told of: enough that
/// a store's latency and its slow answers hide behind the making of the
/// batches before them (2 read 1,250 images/s from a store on this
/// machine, 4 read 1,420-1,560; the store bounds it).
pub(crate) const BATCHES: usize = 4;

/// Batch `seq` of `task`, then the [`BATCHES`] batches this worker makes
/// after it: the task's next ones, then those of the tasks `queued` behind
/// it for the same job. Each is (the consumer whose order it follows, its
/// sequence number).
///
/// The batch at hand comes first, so that its fetches, when they have not
/// started yet (a worker's first batch, a range it did not expect), are
/// first in line for the requests in flight (taken in turn), not behind
/// the next four batches'. Once the worker is under way they started
/// batches ago and this costs a lookup.
pub(crate) fn upcoming<'a>(task: &Task, seq: u64, queued: impl Iterator<Item = &'a Task>) -> Vec<(u32, u64)> {
    let job_id = |t: &Task| t.job.as_ref().map(|j| j.job_id);
    let batches = |t: &Task, from: u64| {
        let rank = t.rank.unwrap_or(t.consumer);
        (from..t.end_seq).map(move |s| (rank, s))
    };
    let same_job = queued.filter(|t| job_id(t) == job_id(task));
    batches(task, seq)
        .chain(same_job.flat_map(|t| batches(t, t.start_seq)))
        .take(BATCHES + 1)
        .collect()
}

/// Tells `dataset` of the samples of each of `batches` in `plan`, when it
/// fetches ahead. A batch the plan does not hold is passed over: the task
/// that names it fails on its own when its turn comes.
pub(crate) fn hint(dataset: &dyn Dataset, plan: &Plan, batches: &[(u32, u64)]) {
    for &(rank, seq) in batches.iter().filter(|(_, seq)| (plan.first_seq()..plan.total_batches()).contains(seq)) {
        let (epoch, _) = plan.locate(seq);
        let keys: Vec<SampleKey> = plan
            .batch_indices(rank, seq)
            .into_iter()
            .map(|index| SampleKey { seed: plan.seed, epoch: u64::from(epoch), index })
            .collect();
        dataset.prefetch_batch(&keys);
    }
}

#[cfg(test)]
mod tests {
    use loader_proto::pb::Job;

    use super::*;

    fn task(job_id: u64, consumer: u32, seqs: std::ops::Range<u64>) -> Task {
        Task {
            job: Some(Job { job_id, ..Default::default() }),
            consumer,
            start_seq: seqs.start,
            end_seq: seqs.end,
            ..Default::default()
        }
    }

    #[test]
    fn the_next_batches_come_from_the_task_then_the_queue_of_its_job() {
        let at = task(1, 0, 10..12);
        let queued = [task(2, 0, 0..5), task(1, 1, 4..5), task(1, 0, 12..14)];
        // Batch 10 itself, the task's batch 11, then the queued tasks of job 1.
        assert_eq!(upcoming(&at, 10, queued.iter()), vec![(0, 10), (0, 11), (1, 4), (0, 12), (0, 13)]);
        // Its last batch: then only queued tasks of job 1, in queue order.
        assert_eq!(upcoming(&at, 11, queued.iter()), vec![(0, 11), (1, 4), (0, 12), (0, 13)]);
        // Nothing queued: the batch at hand.
        assert_eq!(upcoming(&at, 11, [].iter()), vec![(0, 11)]);
        let mut shared = task(1, 3, 0..1);
        shared.rank = Some(0);
        assert_eq!(upcoming(&at, 11, [shared].iter()), vec![(0, 11), (0, 0)], "a shared stream's task follows its rank's order");
        let many = task(1, 0, 0..100);
        assert_eq!(upcoming(&many, 0, [].iter()).len(), BATCHES + 1, "the batch at hand and BATCHES more");
    }
}
