//! Admission: a job whose batches cannot fit the memory of any registered
//! worker is refused when it is submitted, with one line naming the field
//! and the sizes, instead of being handed to workers that can only fail it.
//!
//! Workers announce their memory budget when they register (see
//! `loader_worker::budget`); a job's batch size comes from its spec
//! ([`loader_job::footprint`]). When no worker has announced a budget yet,
//! or the spec does not tell its batch size (npy, custom datasets), the job
//! is admitted and the workers refuse it themselves, failing its tasks with
//! the same sizes.

use loader_job::footprint::{batch_bytes, human_bytes};
use loader_proto::pb::JobSpec;
use loader_job::spec::SpecError;

use crate::workers::WorkerTable;

/// Refuses `spec` when its batches, `max_outstanding` of them in flight,
/// fit the budget of no registered worker that announced one.
pub(crate) fn admit(workers: &WorkerTable, spec: &JobSpec) -> Result<(), SpecError> {
    let Some(bytes) = batch_bytes(spec) else {
        return Ok(());
    };
    let budgets: Vec<(u64, u64)> = workers
        .workers
        .values()
        .filter(|w| w.memory_budget > 0)
        .map(|w| (w.memory_budget, w.max_outstanding))
        .collect();
    if budgets.is_empty() || budgets.iter().any(|&(budget, k)| bytes.saturating_mul(k) <= budget) {
        return Ok(());
    }
    let (budget, k) = budgets.iter().copied().max_by_key(|&(b, k)| b / k.max(1)).unwrap_or((0, 1));
    Err(SpecError {
        field: "batch_size".into(),
        problem: format!(
            "a batch of {} samples takes {}, but the largest worker memory budget is {} for {k} batches in flight \
             ({} a batch); use a smaller batch_size or sample shape, or give workers more --memory-budget",
            spec.batch_size,
            human_bytes(bytes),
            human_bytes(budget),
            human_bytes(budget / k.max(1)),
        ),
    })
}

#[cfg(test)]
mod tests {
    use loader_proto::pb::{DatasetSpec, Dtype, SyntheticSpec, dataset_spec::Kind};

    use super::*;

    fn spec(shape: Vec<u64>, batch_size: u32) -> JobSpec {
        JobSpec {
            dataset: Some(DatasetSpec {
                kind: Some(Kind::Synthetic(SyntheticSpec { num_samples: 16, shape, dtype: Dtype::U8 as i32, cost_ns: 0, wait_ns_by_epoch: Vec::new() })),
            }),
            batch_size,
            epochs: 1,
            consumers: 1,
            ..Default::default()
        }
    }

    #[test]
    fn a_batch_no_worker_can_hold_is_refused_naming_the_sizes() {
        let mut workers = WorkerTable::default();
        let huge = spec(vec![100_000, 100_000], 4);
        assert!(admit(&workers, &huge).is_ok(), "no worker said its budget: the workers decide");
        workers.register("http://a".into(), "n".into(), 8, 0);
        assert!(admit(&workers, &huge).is_ok(), "an old worker without a budget");
        workers.workers.clear();
        workers.register("http://a".into(), "n".into(), 8, 12 << 30);
        workers.register("http://b".into(), "n".into(), 8, 2 << 30);
        let e = admit(&workers, &huge).expect_err("refused");
        assert_eq!(e.field, "batch_size");
        assert!(e.to_string().starts_with("invalid job spec: batch_size: a batch of 4 samples takes 40.0 GB, but the largest"), "{e}");
        assert!(admit(&workers, &spec(vec![3, 224, 224], 64)).is_ok());
    }
}
