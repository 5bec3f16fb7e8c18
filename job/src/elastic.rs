//! Resuming a job on another world size or batch size.
//!
//! The order of an epoch is a pure function of (seed, epoch), and
//! DistributedSampler's split makes the union of every rank's batch `k` one
//! contiguous block of it: positions `[k*G, (k+1)*G)` with `G = B*W`. The
//! epoch is thus one global stream of samples cut into global batches, and
//! a saved run is described, whatever its world size, by which positions of
//! which epochs it delivered. [`delivered`] computes that from every rank's
//! progress, as [`Resumed`] epochs: a prefix of the epoch's order plus the
//! few positions beyond it that ranks a step ahead (or out of order) had
//! already yielded. [`replan`] turns it into the spec of the rest of the
//! job on `W'` ranks of `B'` samples: each partly delivered epoch serves
//! only its remaining positions, split like a whole epoch (padding or
//! truncation recomputed for them, so every rank gets as many batches), and
//! later epochs are whole.
//!
//! With `B'*W' = G` the global batches after the resume hold exactly the
//! samples of the uninterrupted run's (the last one's padding, which only
//! fills the ranks up, follows `W'`); with another `G` the stream goes on
//! at the same sample.

use std::collections::BTreeSet;

use loader_proto::pb::{EpochResume, JobSpec};
use crate::sampler::{MAX_DELIVERED, Plan, Resumed};
use crate::spec::SpecError;

/// What one rank of a saved run had yielded: every batch below `next_seq`
/// and those in `yielded_above` (out of order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Every batch with a lower sequence number was yielded.
    pub next_seq: u64,
    /// Batches above `next_seq` also yielded.
    pub yielded_above: BTreeSet<u64>,
}

/// Why a saved run cannot be resumed on another world size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    /// Progress was given for another number of ranks than the job has.
    #[error("the job has {expected} ranks, but progress was given for {got}")]
    Ranks {
        /// Ranks of the job.
        expected: u32,
        /// Ranks with progress.
        got: usize,
    },
    /// A rank yielded past the job's end.
    #[error("rank {rank} yielded batch {seq}, but the job has only {total} batches per rank")]
    PastEnd {
        /// The rank.
        rank: u32,
        /// The batch.
        seq: u64,
        /// Batches per rank.
        total: u64,
    },
    /// The ranks are so far apart that the positions delivered out of order
    /// do not fit a spec.
    #[error(
        "the ranks' progress is too far apart (more than {MAX_DELIVERED} samples of epoch {epoch} delivered beyond the slowest rank); resume on the same world size, where each rank continues on its own"
    )]
    TooFarApart {
        /// The epoch.
        epoch: u32,
    },
    /// Some rank went on into the next epoch while another had not finished
    /// this one: the rest of the job would start in two epochs at once.
    #[error(
        "the ranks' progress spans two epochs (some finished epoch {epoch} and went on, others had not); merge states saved at the same step, or resume on the same world size, where each rank continues on its own"
    )]
    SpreadOverEpochs {
        /// The epoch some rank had not finished.
        epoch: u32,
    },
    /// The resumed job's spec is not valid (e.g. a batch size that leaves
    /// no batch with drop_last).
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// New weights for a job that is not a mixture, or for other sources.
    #[error("{0}")]
    Reweight(String),
}

/// Every rank of a job at the same step: `next_seq` for all, and the
/// out-of-order extras of the one rank they are known for. What a single
/// rank's saved state says of the job when the ranks ran in lockstep (a
/// synchronous data-parallel job saves at the same step on every rank).
pub fn lockstep(
    consumers: u32,
    rank: u32,
    next_seq: u64,
    yielded_above: &BTreeSet<u64>,
) -> Vec<Progress> {
    (0..consumers)
        .map(|r| Progress {
            next_seq,
            yielded_above: if r == rank {
                yielded_above.clone()
            } else {
                BTreeSet::new()
            },
        })
        .collect()
}

/// Batches of `epoch` rank `p` yielded, as whole-epoch batch indices.
fn yielded_in(plan: &Plan, p: &Progress, epoch: u32) -> (u64, Vec<u64>) {
    let base = u64::from(epoch) * plan.batches_per_epoch();
    let (start, end) = (plan.epoch_start(epoch), base + plan.batches_per_epoch());
    let prefix = p.next_seq.clamp(start, end) - start;
    let extras = p
        .yielded_above
        .range(start..end)
        .map(|s| s - base)
        .collect();
    (prefix, extras)
}

/// What the run planned by `plan` had delivered, given every rank's
/// progress, of the first epoch some rank had not finished: where the rest
/// of the job starts (an epoch with nothing delivered when the run stopped
/// at an epoch boundary; the last epoch, wholly delivered, when the job is
/// done).
pub fn delivered(plan: &Plan, ranks: &[Progress]) -> Result<Resumed, ResumeError> {
    if ranks.len() != plan.consumers as usize {
        return Err(ResumeError::Ranks {
            expected: plan.consumers,
            got: ranks.len(),
        });
    }
    let total = plan.total_batches();
    for (rank, p) in (0u32..).zip(ranks) {
        if p.next_seq > total || p.yielded_above.last().is_some_and(|&s| s >= total) {
            let seq = p.yielded_above.last().copied().unwrap_or(0).max(p.next_seq);
            return Err(ResumeError::PastEnd { rank, seq, total });
        }
    }
    let n = plan.num_samples;
    let bpe = plan.batches_per_epoch();
    let finished = |epoch: u32| {
        let batches = plan.epoch_batches(epoch);
        ranks.iter().all(|p| {
            let (prefix, extras) = yielded_in(plan, p, epoch);
            prefix + extras.len() as u64 == batches
        })
    };
    let mut epoch = plan.first_epoch();
    while epoch < plan.epochs && finished(epoch) {
        epoch += 1;
    }
    if epoch == plan.epochs {
        return Ok(Resumed {
            epoch: plan.epochs.saturating_sub(1),
            offset: n,
            delivered: Vec::new(),
        });
    }
    let next_epoch_start = u64::from(epoch + 1) * bpe;
    if ranks.iter().any(|p| {
        p.next_seq > next_epoch_start || p.yielded_above.range(next_epoch_start..).next().is_some()
    }) {
        return Err(ResumeError::SpreadOverEpochs { epoch });
    }

    let old = plan.resumed(epoch);
    let remaining = old.map_or(n, |r| r.remaining(n));
    let yielded: Vec<(u64, Vec<u64>)> = ranks.iter().map(|p| yielded_in(plan, p, epoch)).collect();
    let slowest = yielded.iter().map(|(k, _)| *k).min().unwrap_or(0);
    // Every rank yielded its first `slowest` batches of the epoch: the
    // first `served` remaining positions, in order.
    let per = plan.epoch_samples_per_consumer(epoch);
    let served = ((slowest * plan.batch_size).min(per) * u64::from(plan.consumers)).min(remaining);
    let offset = if served < remaining {
        old.map_or(served, |r| r.position(served))
    } else {
        n
    };
    let mut beyond: BTreeSet<u64> = old
        .map_or(&[][..], |r| &r.delivered[..])
        .iter()
        .copied()
        .filter(|&d| d >= offset)
        .collect();
    let first_index = bpe - plan.epoch_batches(epoch);
    for (rank, (k, extras)) in (0u32..).zip(&yielded) {
        let ahead = (k - slowest).saturating_add(extras.len() as u64);
        if ahead.saturating_mul(plan.batch_size) > MAX_DELIVERED as u64 {
            return Err(ResumeError::TooFarApart { epoch });
        }
        let prefix_batches = (first_index + slowest)..(first_index + k);
        for batch in prefix_batches.chain(extras.iter().copied()) {
            for p in plan.batch_positions(epoch, batch) {
                let (position, padding) = plan.epoch_position(epoch, rank, p);
                if !padding && position >= offset {
                    beyond.insert(position);
                }
            }
        }
    }
    if beyond.len() > MAX_DELIVERED {
        return Err(ResumeError::TooFarApart { epoch });
    }
    // The prefix grows over positions delivered right after it.
    let mut offset = offset;
    while beyond.first() == Some(&offset) {
        beyond.pop_first();
        offset += 1;
    }
    Ok(Resumed {
        epoch,
        offset,
        delivered: beyond.into_iter().collect(),
    })
}

/// The spec of the rest of the job `spec` (planned as `plan`) on
/// `consumers` ranks of `batch_size` samples, after the run whose ranks
/// made `ranks` progress. Rank r of the new job starts at its batch 0.
pub fn replan(
    spec: &JobSpec,
    plan: &Plan,
    ranks: &[Progress],
    consumers: u32,
    batch_size: u32,
) -> Result<JobSpec, ResumeError> {
    let resume = delivered(plan, ranks)?;
    let mut next = spec.clone();
    next.consumers = consumers;
    next.batch_size = batch_size;
    next.resume = Some(EpochResume {
        epoch: resume.epoch,
        offset: resume.offset,
        delivered: resume.delivered,
    });
    crate::spec::plan(&next)?;
    Ok(next)
}

/// A resumed mixture (`spec` from [`replan`]) under new `weights`, one per
/// source: every source's walk continues where it stands, and the new
/// proportions hold from the first block past everything the saved run
/// delivered (positions delivered out of order included), so no position
/// the run already delivered is drawn again under other weights and nothing
/// of a source repeats before its pass ends.
pub fn reweight(spec: &JobSpec, weights: &[f64]) -> Result<JobSpec, ResumeError> {
    use loader_proto::pb::{MixStage, dataset_spec::Kind};
    let mut next = spec.clone();
    let block = u64::from(spec.batch_size) * u64::from(spec.consumers.max(1));
    let Some(Kind::Mix(m)) = next.dataset.as_mut().and_then(|d| d.kind.as_mut()) else {
        return Err(ResumeError::Reweight(
            "new weights are for a mixture, and this job is not one".into(),
        ));
    };
    if weights.len() != m.sources.len() {
        return Err(ResumeError::Reweight(format!(
            "{} weights for a mixture of {} sources; a resumed mixture keeps its sources",
            weights.len(),
            m.sources.len()
        )));
    }
    let Some(r) = &spec.resume else {
        return Err(ResumeError::Reweight(
            "new weights need a resumed spec (replan it first)".into(),
        ));
    };
    let block = if m.block == 0 { block } else { m.block };
    let end = r
        .delivered
        .last()
        .map_or(r.offset, |&d| d + 1)
        .max(r.offset);
    let delivered_to = u64::from(r.epoch)
        .checked_mul(m.samples_per_epoch)
        .and_then(|p| p.checked_add(end))
        .ok_or_else(|| ResumeError::Reweight("the stream position overflows".into()))?;
    let from = delivered_to.div_ceil(block.max(1)) * block.max(1);
    if from > m.weights_from {
        m.stages.push(MixStage {
            start: m.weights_from,
            weights: m.sources.iter().map(|s| s.weight).collect(),
        });
        m.weights_from = from;
    }
    for (source, &w) in m.sources.iter_mut().zip(weights) {
        source.weight = w;
    }
    crate::spec::plan(&next)?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;

    fn plan(n: u64, b: u64, w: u32, drop_last: bool, epochs: u32) -> Plan {
        Plan {
            num_samples: n,
            batch_size: b,
            consumers: w,
            shuffle: true,
            seed: 5,
            drop_last,
            epochs,
            shards: None,
            shuffle_within_shards: false,
            shuffle_window: 0,
            lanes: 0,
            resume: None,
        }
    }

    /// `plan` resumed on `w` ranks of `b` after `ranks`' progress.
    fn resumed(plan: &Plan, ranks: &[Progress], w: u32, b: u64) -> Plan {
        let resume = delivered(plan, ranks).expect("delivered");
        Plan {
            consumers: w,
            batch_size: b,
            resume: Some(Arc::new(resume)),
            ..plan.clone()
        }
    }

    /// The real (not padding) positions each epoch's batches delivered,
    /// from the batches `yielded(rank, seq)` says were yielded.
    fn real_positions(
        plan: &Plan,
        yielded: impl Fn(u32, u64) -> bool,
        into: &mut BTreeMap<u32, Vec<u64>>,
    ) {
        for rank in 0..plan.consumers {
            for seq in plan.first_seq()..plan.total_batches() {
                if !yielded(rank, seq) {
                    continue;
                }
                let (epoch, batch) = plan.locate(seq);
                for p in plan.batch_positions(epoch, batch) {
                    let (position, padding) = plan.epoch_position(epoch, rank, p);
                    if !padding {
                        into.entry(epoch).or_default().push(position);
                    }
                }
            }
        }
    }

    /// Global batch `seq` (every rank's batch `seq`) as sorted indices.
    fn global(plan: &Plan, seq: u64) -> Vec<u64> {
        let mut all: Vec<u64> = (0..plan.consumers)
            .flat_map(|r| plan.batch_indices(r, seq))
            .collect();
        all.sort_unstable();
        all
    }

    /// Global batch `seq` without its padding, as sorted positions.
    fn global_real(plan: &Plan, seq: u64) -> Vec<u64> {
        let (epoch, batch) = plan.locate(seq);
        let mut all: Vec<u64> = (0..plan.consumers)
            .flat_map(|r| {
                plan.batch_positions(epoch, batch)
                    .map(move |p| plan.epoch_position(epoch, r, p))
            })
            .filter(|&(_, padding)| !padding)
            .map(|(position, _)| position)
            .collect();
        all.sort_unstable();
        all
    }

    /// Checks exactly-once over every epoch of a run interrupted after
    /// `ranks`' progress and resumed on `w2` ranks of `b2`.
    fn check_exactly_once(
        old: &Plan,
        ranks: &[Progress],
        w2: u32,
        b2: u64,
    ) -> Result<(), TestCaseError> {
        let new = resumed(old, ranks, w2, b2);
        let mut real = BTreeMap::new();
        real_positions(
            old,
            |r, s| s < ranks[r as usize].next_seq || ranks[r as usize].yielded_above.contains(&s),
            &mut real,
        );
        real_positions(&new, |_, _| true, &mut real);
        let counts: Vec<u64> = (0..w2)
            .map(|r| {
                (new.first_seq()..new.total_batches())
                    .map(|s| new.batch_indices(r, s).len() as u64)
                    .sum()
            })
            .collect();
        prop_assert!(
            counts.windows(2).all(|c| c[0] == c[1]),
            "ranks get different sample counts: {:?}",
            counts
        );
        for epoch in 0..old.epochs {
            let mut got = real.remove(&epoch).unwrap_or_default();
            got.sort_unstable();
            let before = got.len();
            got.dedup();
            prop_assert_eq!(
                before,
                got.len(),
                "epoch {} delivered a sample twice",
                epoch
            );
            if old.drop_last {
                // The dropped tail: at most what each plan's truncation
                // drops (a partial batch per rank and the uneven part).
                let slack =
                    (old.batch_size + 1) * u64::from(old.consumers) + (b2 + 1) * u64::from(w2);
                prop_assert!(
                    got.len() as u64 + slack >= old.num_samples,
                    "epoch {}: {} of {}",
                    epoch,
                    got.len(),
                    old.num_samples
                );
            } else {
                prop_assert_eq!(
                    got,
                    (0..old.num_samples).collect::<Vec<_>>(),
                    "epoch {} not delivered whole",
                    epoch
                );
            }
        }
        Ok(())
    }

    #[test]
    fn global_batches_are_the_uninterrupted_runs_when_g_is_kept() {
        for (n, w, b, w2, b2, step, drop_last) in [
            (1000u64, 4u32, 6u64, 2u32, 12u64, 7u64, false),
            (1000, 4, 6, 8, 3, 30, true),
            (999, 2, 12, 3, 8, 5, false),
            (999, 3, 8, 1, 24, 41, true),
            (97, 8, 2, 1, 16, 3, false),
        ] {
            let old = plan(n, b, w, drop_last, 2);
            let ranks = lockstep(w, 0, step, &BTreeSet::new());
            let new = resumed(&old, &ranks, w2, b2);
            // The same global batch size cuts the epochs into as many
            // batches: the resumed job's sequence numbers are the old ones.
            assert_eq!(new.first_seq(), step, "n={n} w={w} w2={w2}");
            assert_eq!(new.total_batches(), old.total_batches());
            for j in 0..old.total_batches() - step {
                let (a, c) = (global(&old, step + j), global(&new, step + j));
                let last_of_epoch = old.locate(step + j).1 + 1 == old.batches_per_epoch();
                if drop_last || !last_of_epoch {
                    assert_eq!(
                        a, c,
                        "global batch {j} after step {step} (n={n} w={w}->{w2} drop_last={drop_last})"
                    );
                } else {
                    // The last batch of an epoch: the same samples; the
                    // padding that fills the ranks up follows the world size.
                    assert_eq!(
                        global_real(&old, step + j),
                        global_real(&new, step + j),
                        "last global batch of the epoch"
                    );
                }
            }
        }
    }

    #[test]
    fn stopping_at_an_epoch_boundary_starts_the_next_epoch_whole() {
        let old = plan(100, 5, 4, false, 3);
        let bpe = old.batches_per_epoch();
        let new = resumed(&old, &lockstep(4, 2, bpe, &BTreeSet::new()), 3, 7);
        assert_eq!(new.first_epoch(), 1);
        let r = new.resume.as_deref().expect("resumed");
        assert_eq!((r.offset, r.delivered.len()), (0, 0));
        let whole = Plan {
            resume: None,
            ..new.clone()
        };
        let first = new.first_seq();
        assert_eq!(first, whole.epoch_start(1));
        assert_eq!(new.batch_indices(1, first), whole.batch_indices(1, first));
        assert_eq!(new.total_batches() - first, 2 * new.batches_per_epoch());
        // And a finished job resumes to nothing.
        let done = resumed(
            &old,
            &lockstep(4, 0, old.total_batches(), &BTreeSet::new()),
            2,
            5,
        );
        assert_eq!(done.first_seq(), done.total_batches());
    }

    #[test]
    fn ranks_at_different_steps_with_extras_merge_exactly() {
        let old = plan(500, 4, 3, false, 2);
        let ranks = vec![
            Progress {
                next_seq: 10,
                yielded_above: BTreeSet::from([12, 15]),
            },
            Progress {
                next_seq: 11,
                yielded_above: BTreeSet::new(),
            },
            Progress {
                next_seq: 9,
                yielded_above: BTreeSet::from([11]),
            },
        ];
        for (w2, b2) in [(5, 4), (1, 9), (3, 4), (2, 6)] {
            check_exactly_once(&old, &ranks, w2, b2).expect("exactly once");
        }
    }

    #[test]
    fn progress_that_cannot_be_true_is_refused() {
        let old = plan(100, 5, 2, false, 1);
        let e = delivered(&old, &lockstep(3, 0, 1, &BTreeSet::new())).expect_err("3 of 2");
        assert_eq!(
            e.to_string(),
            "the job has 2 ranks, but progress was given for 3"
        );
        let e = delivered(&old, &lockstep(2, 0, 11, &BTreeSet::new())).expect_err("past end");
        assert!(
            e.to_string()
                .contains("yielded batch 11, but the job has only 10"),
            "{e}"
        );
        let big = plan(1_000_000, 1000, 2, false, 1);
        let far = vec![
            Progress {
                next_seq: 0,
                ..Default::default()
            },
            Progress {
                next_seq: 200,
                ..Default::default()
            },
        ];
        let e = delivered(&big, &far).expect_err("too far apart");
        assert!(e.to_string().contains("too far apart"), "{e}");
        // Rank 1 into the next epoch while rank 0 has a batch of this one left.
        let bpe = old.batches_per_epoch();
        let spread = vec![
            Progress {
                next_seq: bpe - 1,
                ..Default::default()
            },
            Progress {
                next_seq: bpe + 1,
                ..Default::default()
            },
        ];
        let two = plan(100, 5, 2, false, 2);
        let e = delivered(&two, &spread).expect_err("two epochs");
        assert!(e.to_string().contains("spans two epochs"), "{e}");
    }

    /// A mixture of two synthetic sources at 1:3, 1000 positions an epoch
    /// in blocks of 64, over 3 epochs, resumed at `resume`.
    fn mix_job(resume: Option<EpochResume>) -> JobSpec {
        use loader_proto::pb::{
            DatasetSpec, Dtype, MixSource, MixSpec, SyntheticSpec, dataset_spec::Kind,
        };
        let source = |name: &str, weight, num_samples| MixSource {
            name: name.into(),
            weight,
            dataset: Some(DatasetSpec {
                kind: Some(Kind::Synthetic(SyntheticSpec {
                    num_samples,
                    shape: vec![2],
                    dtype: Dtype::U8 as i32,
                    ..Default::default()
                })),
            }),
        };
        JobSpec {
            dataset: Some(DatasetSpec {
                kind: Some(Kind::Mix(MixSpec {
                    sources: vec![source("a", 1.0, 300), source("b", 3.0, 100)],
                    samples_per_epoch: 1000,
                    block: 64,
                    ..Default::default()
                })),
            }),
            batch_size: 8,
            epochs: 3,
            consumers: 2,
            resume,
            ..Default::default()
        }
    }

    fn mix_of(spec: &JobSpec) -> &loader_proto::pb::MixSpec {
        match spec.dataset.as_ref().and_then(|d| d.kind.as_ref()) {
            Some(loader_proto::pb::dataset_spec::Kind::Mix(m)) => m,
            other => panic!("not a mixture: {other:?}"),
        }
    }

    fn weights(m: &loader_proto::pb::MixSpec) -> Vec<f64> {
        m.sources.iter().map(|s| s.weight).collect()
    }

    #[test]
    fn reweighting_a_resumed_mixture_keeps_what_was_delivered() {
        let resume = |offset, delivered| {
            Some(EpochResume {
                epoch: 1,
                offset,
                delivered,
            })
        };
        let spec = mix_job(resume(100, vec![130]));
        crate::spec::plan(&spec).expect("the resumed mixture plans");
        let next = reweight(&spec, &[2.0, 1.0]).expect("reweighted");
        let m = mix_of(&next);
        assert_eq!(weights(m), vec![2.0, 1.0]);
        assert_eq!(m.stages.len(), 1);
        assert_eq!(
            (m.stages[0].start, m.stages[0].weights.clone()),
            (0, vec![1.0, 3.0]),
            "the old weights hold from the start"
        );
        // The first block past epoch 1's position 130: ceil(1131 / 64) x 64.
        assert_eq!(m.weights_from, (1000u64 + 131).div_ceil(64) * 64);
        assert_eq!(m.weights_from, 1152);
        // Every position before it draws what the run drew.
        let old = crate::spec::mix_plan(&spec).expect("old").expect("mix");
        let new = crate::spec::mix_plan(&next).expect("new").expect("mix");
        for p in 0..1152 {
            assert_eq!(old.at(p), new.at(p), "position {p}");
        }
        assert!(
            (1152..1152 + 4 * 64).any(|p| old.at(p) != new.at(p)),
            "the new weights hold from 1152 on"
        );

        // Reweighted again before anything more was delivered: the new
        // weights replace the last ones, no stage is added.
        let again = JobSpec {
            resume: resume(131, vec![]),
            ..next.clone()
        };
        let twice = reweight(&again, &[1.0, 1.0]).expect("reweighted twice");
        let m2 = mix_of(&twice);
        assert_eq!(weights(m2), vec![1.0, 1.0]);
        assert_eq!(m2.stages, mix_of(&next).stages);
        assert_eq!(m2.weights_from, 1152);
        let same = reweight(&next, &[1.0, 1.0]).expect("the same resume");
        assert_eq!(mix_of(&same).stages.len(), 1);
        assert_eq!(mix_of(&same).weights_from, 1152);

        // Resumed later, in epoch 2: a second stage from 1152 keeps the
        // first new weights, the newest hold from the next block on.
        let later = JobSpec {
            resume: Some(EpochResume {
                epoch: 2,
                offset: 10,
                delivered: vec![],
            }),
            ..next.clone()
        };
        let third = reweight(&later, &[1.0, 4.0]).expect("reweighted in epoch 2");
        let m3 = mix_of(&third);
        let stages: Vec<(u64, Vec<f64>)> = m3
            .stages
            .iter()
            .map(|s| (s.start, s.weights.clone()))
            .collect();
        assert_eq!(stages, vec![(0, vec![1.0, 3.0]), (1152, vec![2.0, 1.0])]);
        assert_eq!(m3.weights_from, 2048);
        assert_eq!(weights(m3), vec![1.0, 4.0]);
    }

    #[test]
    fn reweighting_what_it_cannot_is_one_line() {
        let resumed = Some(EpochResume {
            epoch: 1,
            offset: 100,
            delivered: vec![130],
        });
        let mut not_mix = mix_job(resumed.clone());
        not_mix.dataset = Some(loader_proto::pb::DatasetSpec {
            kind: Some(loader_proto::pb::dataset_spec::Kind::Synthetic(
                loader_proto::pb::SyntheticSpec {
                    num_samples: 1000,
                    shape: vec![2],
                    dtype: loader_proto::pb::Dtype::U8 as i32,
                    ..Default::default()
                },
            )),
        });
        crate::spec::plan(&not_mix).expect("a valid job");
        let cases = [
            (
                reweight(&not_mix, &[1.0]),
                "new weights are for a mixture, and this job is not one",
            ),
            (
                reweight(&mix_job(resumed.clone()), &[1.0, 2.0, 3.0]),
                "3 weights for a mixture of 2 sources",
            ),
            (
                reweight(&mix_job(resumed.clone()), &[1.0]),
                "1 weights for a mixture of 2 sources",
            ),
            (
                reweight(&mix_job(None), &[1.0, 2.0]),
                "new weights need a resumed spec",
            ),
            (
                reweight(&mix_job(resumed.clone()), &[1.0, -2.0]),
                "invalid job spec: dataset.mix.sources[1].weight: must be a finite number >= 0",
            ),
            (
                reweight(&mix_job(resumed.clone()), &[0.0, 0.0]),
                "invalid job spec: dataset.mix.sources: weights: a mixture needs at least one source",
            ),
        ];
        for (got, expect) in cases {
            let e = got.expect_err(expect).to_string();
            assert!(e.starts_with(expect), "got: {e}\nwant: {expect}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        #[test]
        fn resuming_on_any_world_size_delivers_every_sample_once(
            n in 1u64..400,
            w in 1u32..9,
            w2 in 1u32..9,
            b in 1u64..20,
            b2 in 1u64..20,
            drop_last: bool,
            step_frac in 0.0f64..=1.0,
            ahead in proptest::collection::vec(0u64..3, 8),
            extra in proptest::collection::vec(proptest::option::of(1u64..4), 8),
            again: bool,
        ) {
            let old = plan(n, b, w, drop_last, 2);
            prop_assume!(old.batches_per_epoch() > 0);
            let new_probe = Plan { consumers: w2, batch_size: b2, ..old.clone() };
            prop_assume!(new_probe.batches_per_epoch() > 0);
            let total = old.total_batches();
            let step = ((total as f64) * step_frac) as u64;
            let ranks: Vec<Progress> = (0..w as usize)
                .map(|r| {
                    let next_seq = (step + ahead[r]).min(total);
                    let yielded_above = extra[r]
                        .map(|d| next_seq + d)
                        .filter(|&s| s < total)
                        .into_iter()
                        .collect();
                    Progress { next_seq, yielded_above }
                })
                .collect();
            // Ranks spread over two epochs are refused (tested below).
            prop_assume!(!matches!(delivered(&old, &ranks), Err(ResumeError::SpreadOverEpochs { .. })));
            check_exactly_once(&old, &ranks, w2, b2)?;
            if again {
                // A resumed job resumed again, half way through.
                let mid = resumed(&old, &ranks, w2, b2);
                let half = mid.first_seq() + (mid.total_batches() - mid.first_seq()) / 2;
                let mid_ranks = lockstep(w2, 0, half, &BTreeSet::new());
                let last = resumed(&mid, &mid_ranks, w, b);
                let mut real = BTreeMap::new();
                real_positions(&old, |r, s| s < ranks[r as usize].next_seq || ranks[r as usize].yielded_above.contains(&s), &mut real);
                real_positions(&mid, |_, s| s < half, &mut real);
                real_positions(&last, |_, _| true, &mut real);
                for epoch in 0..old.epochs {
                    let mut got = real.remove(&epoch).unwrap_or_default();
                    got.sort_unstable();
                    let before = got.len();
                    got.dedup();
                    prop_assert_eq!(before, got.len(), "twice resumed: epoch {} delivered a sample twice", epoch);
                    if !drop_last {
                        prop_assert_eq!(got.len() as u64, n, "twice resumed: epoch {} not whole", epoch);
                    }
                }
            }
        }
    }
}
