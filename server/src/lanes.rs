//! Keeping workers to lanes. A job whose sampler reads its epochs as lanes
//! (`sampler.lanes`: sequential streams over shards that take turns of a
//! few batches, see `loader_job::sampler::Lanes`) is cheap to produce
//! only if each lane is read front to back by one worker: a stream has no
//! random access, so a worker handed another lane's batches reads that
//! lane's shard up to them first. So a worker holds a lane of the job, and
//! gets the next turn of its lane, of every consumer; a worker without one
//! takes the free lane whose turn comes first; when every lane is held it
//! takes the lowest batches like any job's worker (the trainer waits for
//! them). Given-back batches still go first, to anyone.

use std::collections::HashMap;
use std::ops::Range;

use loader_job::sampler::{EpochOrder, LANE_TURN, Plan};

use crate::range_queue::RangeQueue;

/// Which worker holds which lane of one job.
#[derive(Debug)]
pub(crate) struct LaneHolders {
    /// Worker id -> its lane.
    holders: HashMap<u64, u32>,
    /// The epoch orders looked up lately (built per epoch, kept for the
    /// two epochs a job's consumers are in at once).
    orders: Vec<(u32, EpochOrder)>,
    /// Fresh batches looked at for a lane's next turn: every lane's turn,
    /// twice (a lane that ran out in this epoch comes back in the next).
    scan: usize,
}

impl LaneHolders {
    /// For a job read as lanes; None for any other.
    pub(crate) fn new(plan: &Plan) -> Option<Self> {
        (plan.lanes > 0 && plan.shards.is_some()).then(|| Self {
            holders: HashMap::new(),
            orders: Vec::new(),
            scan: (plan.lanes as usize + 1) * LANE_TURN as usize * 2,
        })
    }

    /// The worker left (or died): its lane is free.
    pub(crate) fn forget(&mut self, worker_id: u64) {
        self.holders.remove(&worker_id);
    }

    fn lane_of(&mut self, plan: &Plan, seq: u64) -> Option<u32> {
        let (epoch, _) = plan.locate(seq);
        let at = match self.orders.iter().position(|(e, _)| *e == epoch) {
            Some(at) => at,
            None => {
                if self.orders.len() >= 2 {
                    self.orders.remove(0);
                }
                self.orders.push((epoch, plan.order(epoch)));
                self.orders.len() - 1
            }
        };
        plan.lane_of(&self.orders[at].1, seq)
    }

    /// Up to `max` fresh batches of `queue` for `worker_id`: its lane's
    /// next turn, a free lane's, or the lowest ones.
    pub(crate) fn take(&mut self, plan: &Plan, queue: &mut RangeQueue, worker_id: u64, max: u64) -> Option<Range<u64>> {
        if max == 0 {
            return None;
        }
        let fresh: Vec<u64> = queue.fresh(self.scan).collect();
        let lanes: Vec<Option<u32>> = fresh.iter().map(|&s| self.lane_of(plan, s)).collect();
        let run = |lane: u32| {
            let at = lanes.iter().position(|&l| l == Some(lane))?;
            let len = fresh[at..]
                .iter()
                .zip(&lanes[at..])
                .enumerate()
                .take_while(|&(k, (&s, &l))| l == Some(lane) && s == fresh[at] + k as u64)
                .count();
            Some((fresh[at], (len as u64).min(max)))
        };
        if let Some(&lane) = self.holders.get(&worker_id) {
            if let Some((start, len)) = run(lane) {
                return queue.take_run(start, len);
            }
            // Its lane has no turn in sight: it takes another.
            self.holders.remove(&worker_id);
        }
        let held: Vec<u32> = self.holders.values().copied().collect();
        if let Some(lane) = lanes.iter().flatten().copied().find(|l| !held.contains(l)) {
            self.holders.insert(worker_id, lane);
            let (start, len) = run(lane)?;
            return queue.take_run(start, len);
        }
        queue.take(max)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn plan(lanes: u32) -> Plan {
        let sizes: Arc<[u64]> = vec![40u64, 3, 17, 0, 25, 9, 31].into();
        Plan {
            num_samples: sizes.iter().sum(),
            batch_size: 2,
            consumers: 1,
            shuffle: true,
            seed: 4,
            drop_last: false,
            epochs: 2,
            shards: Some(sizes),
            shuffle_within_shards: false,
            shuffle_window: 0,
            lanes,
            resume: None,
        }
    }

    #[test]
    fn each_worker_keeps_to_its_lane_and_every_batch_goes_out_once() {
        let p = plan(3);
        let order0 = p.order(0);
        let order1 = p.order(1);
        let lane = |s: u64| p.lane_of(if s < p.batches_per_epoch() { &order0 } else { &order1 }, s);
        let mut q = RangeQueue::starting_at(0, p.total_batches());
        let mut holders = LaneHolders::new(&p).expect("a laned plan");
        let mut got: Vec<u64> = Vec::new();
        let mut per_worker: HashMap<u64, Vec<Option<u32>>> = HashMap::new();
        // Three workers asking in turn, 3 batches a time.
        'out: loop {
            for worker in 1..=3u64 {
                let Some(r) = holders.take(&p, &mut q, worker, 3) else { break 'out };
                for s in r {
                    got.push(s);
                    per_worker.entry(worker).or_default().push(lane(s));
                }
            }
        }
        got.sort_unstable();
        assert_eq!(got, (0..p.total_batches()).collect::<Vec<_>>());
        // Within an epoch's lanes, a worker stays on one lane while the
        // three last; at the end lanes run out and workers move.
        let switches: usize = per_worker.values().map(|l| l.windows(2).filter(|w| w[0] != w[1]).count()).sum();
        assert!(switches <= 12, "{per_worker:?}");
        let first: Vec<Option<u32>> = (1..=3).map(|w| per_worker[&w][0]).collect();
        assert_ne!(first[0], first[1]);
        assert_ne!(first[1], first[2]);
        assert_ne!(first[0], first[2]);
    }

    #[test]
    fn a_worker_that_left_frees_its_lane() {
        let p = plan(2);
        let mut q = RangeQueue::starting_at(0, p.total_batches());
        let mut holders = LaneHolders::new(&p).expect("a laned plan");
        assert!(holders.take(&p, &mut q, 1, 4).is_some());
        assert!(holders.take(&p, &mut q, 2, 4).is_some());
        // Both lanes held: a third worker takes the lowest batches.
        let third = holders.take(&p, &mut q, 3, 1).expect("the lowest");
        assert_eq!(third, 8..9);
        holders.forget(1);
        assert!(holders.take(&p, &mut q, 3, 4).is_some());
        assert_eq!(holders.holders.get(&3).copied(), p.lane_of(&p.order(0), 0), "lane 0's next turn");
        assert!(LaneHolders::new(&plan(0)).is_none());
    }
}
