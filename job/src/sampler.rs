//! The sampler: which dataset indices make up each batch of each consumer.
//!
//! Two pieces, both pure functions of the job spec so that the coordinator,
//! every worker and the trainer agree without sending index lists:
//!
//! - [`Permutation`]: a seeded bijection of `[0, N)` per epoch, evaluated at
//!   any position in O(1) memory (a Feistel network on the smallest power
//!   of two >= N, unbalanced by a bit where its width is odd, with cycle
//!   walking back into range).
//! - [`Plan`]: `DistributedSampler`'s split of one epoch between `W`
//!   consumers (pad by wrapping around when `drop_last` is false, truncate
//!   when true), cut into batches of `batch_size` like `DataLoader` does.
//! - [`EpochOrder`]: the dataset order of one epoch. For most datasets it is
//!   the permutation of samples. For a sharded dataset (WebDataset tar
//!   shards) the permutation shuffles whole shards and the samples of a
//!   shard keep their file order, so consecutive positions (and so
//!   consecutive batches, which a worker produces together) read a shard
//!   front to back instead of seeking all over every shard.
//!
//! - [`Resumed`]: what a saved run had delivered of an epoch, for a job
//!   resumed on another world size or batch size: such an epoch serves only
//!   the positions of its order left over, split between the consumers
//!   like a whole epoch (see `crate::elastic`).
//!
//! Consumer-local sequence numbers run across epochs:
//! `seq = epoch * batches_per_epoch + batch`. A resumed job's first epoch
//! has fewer batches: they take the last sequence numbers of the epoch, so
//! the job starts at [`Plan::first_seq`], like a job resumed mid-epoch.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;
use std::sync::Arc;

const ROUNDS: usize = 8;
// `Permutation::encrypt` relies on an even count: its halves swap widths
// every round and must end as they started.
const _: () = assert!(ROUNDS.is_multiple_of(2));

/// SplitMix64's finalizer: a fast bijective 64-bit mixer.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seed derived from `seed` and a `salt`, for an independent stream (a
/// mixture's per-source and per-block permutations).
pub fn mix_seed(seed: u64, salt: u64) -> u64 {
    mix64(seed ^ mix64(salt.wrapping_add(0x5eed_5a17_0000_0001)))
}

/// A seeded permutation of `[0, n)` for one epoch.
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    shuffle: bool,
    /// Bits of the Feistel network's left half (its domain is
    /// `2^(left_bits + right_bits)`, the smallest power of two >= n).
    left_bits: u32,
    /// Bits of its right half: `left_bits` or one fewer.
    right_bits: u32,
    keys: [u64; ROUNDS],
}

impl Permutation {
    /// The permutation for `(seed, epoch)`; the identity when `shuffle` is false.
    pub fn new(n: u64, seed: u64, epoch: u64, shuffle: bool) -> Self {
        let bits = if n <= 1 { 0 } else { 64 - (n - 1).leading_zeros() };
        // At least one bit per half; an odd width splits one bit unevenly
        // (an unbalanced network) rather than doubling the domain, so the
        // cycle walk below takes fewer than 2 steps on average, not 4.
        let bits = bits.max(2);
        let right_bits = bits / 2;
        let left_bits = bits - right_bits;
        let mut state = mix64(seed ^ 0x4c6f_6164_6572_2121) ^ mix64(epoch.wrapping_add(0x9e37_79b9_7f4a_7c15));
        let keys = std::array::from_fn(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            mix64(state)
        });
        Self { n, shuffle, left_bits, right_bits, keys }
    }

    /// Number of elements permuted.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True when there is nothing to permute.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// One pass of the network over `x < 2^(left_bits + right_bits)`.
    /// Each round maps (left, right) to (right, left ^ F(right)), which is
    /// invertible whatever the halves' widths; the widths swap every round
    /// and, the rounds being even, end as they started.
    fn encrypt(&self, x: u64) -> u64 {
        let (mut lb, mut rb) = (self.left_bits, self.right_bits);
        let (mut left, mut right) = (x >> rb, x & ((1u64 << rb) - 1));
        for key in &self.keys {
            let f = mix64(right ^ key) & ((1u64 << lb) - 1);
            (left, right) = (right, left ^ f);
            (lb, rb) = (rb, lb);
        }
        (left << rb) | right
    }

    /// The element at position `i` (`i < len()`).
    pub fn at(&self, i: u64) -> u64 {
        debug_assert!(i < self.n, "position {i} outside permutation of {}", self.n);
        if !self.shuffle || self.n <= 1 {
            return i;
        }
        // Cycle walking: the Feistel domain is < 2n, so this ends after
        // fewer than 2 steps on average, and always ends because encrypt is a bijection
        // whose cycle through i returns to i, which is < n.
        let mut x = self.encrypt(i);
        while x >= self.n {
            x = self.encrypt(x);
        }
        x
    }
}

/// The dataset order of one epoch: position `i` holds sample `at(i)`.
#[derive(Debug, Clone)]
pub enum EpochOrder {
    /// Every sample permuted on its own.
    Samples(Permutation),
    /// Shards permuted, samples in file order within each shard, or
    /// (a block shuffle) in an order of their own within each shard.
    Shards {
        /// Order of the shards.
        perm: Permutation,
        /// `starts[j]`: first position of the `j`-th shard in epoch order;
        /// `starts[len]` is the number of samples.
        starts: Vec<u64>,
        /// `first[s]`: dataset index of the first sample of shard `s`.
        first: Vec<u64>,
        /// The order within each shard.
        within: Within,
    },
    /// Shards dealt to sequential streams (lanes) that take turns in
    /// chunks: see [`Lanes`].
    Lanes(Lanes),
}

/// The order of the samples within one shard: file order, or shuffled
/// (seed and epoch) as a whole or in consecutive windows of `window`
/// samples (a stream's shuffle buffer: a sample moves less than `window`
/// positions, so a reader holding `window` samples reads the shard
/// front to back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Within {
    /// Seed and epoch of the shuffle; None keeps file order.
    pub shuffle: Option<(u64, u64)>,
    /// Samples per window; 0: the whole shard is one.
    pub window: u64,
}

impl Within {
    /// File order.
    pub const FILE_ORDER: Self = Self { shuffle: None, window: 0 };

    /// The offset in the shard of its `offset`-th sample in this order.
    fn at(&self, shard: u64, size: u64, offset: u64) -> u64 {
        let Some((seed, epoch)) = self.shuffle else {
            return offset;
        };
        let shard_seed = mix_seed(seed, shard);
        if self.window == 0 || self.window >= size {
            return Permutation::new(size, shard_seed, epoch, true).at(offset);
        }
        let window = offset / self.window;
        let base = window * self.window;
        let len = self.window.min(size - base);
        base + Permutation::new(len, mix_seed(shard_seed, window), epoch, true).at(offset - base)
    }
}

/// A sharded epoch read as `L` sequential streams (lanes): the shards, in
/// the epoch's shard order, are dealt to the lane holding the fewest
/// samples so far, and the epoch takes `chunk` positions from each lane in
/// turn (a lane that has run out is passed over). One worker can then
/// read a lane front to back while others read the other lanes, and an
/// in-order trainer still has every lane's next chunk coming: DataLoader's
/// round robin over its workers' streams, with the split fixed by the
/// job rather than by the number of workers.
#[derive(Debug, Clone)]
pub struct Lanes {
    /// Each lane's shards, in reading order.
    shards: Vec<Vec<u64>>,
    /// `starts[l][k]`: offset in lane `l` of its `k`-th shard; one more
    /// entry, the lane's length.
    starts: Vec<Vec<u64>>,
    /// Samples per lane.
    sizes: Vec<u64>,
    /// Positions per turn.
    chunk: u64,
    /// Samples per shard.
    shard_sizes: Arc<[u64]>,
    /// `first[s]`: dataset index of the first sample of shard `s`.
    first: Vec<u64>,
    /// The order within each shard.
    within: Within,
}

impl Lanes {
    fn new(perm: &Permutation, shard_sizes: Arc<[u64]>, first: Vec<u64>, lanes: u32, chunk: u64, within: Within) -> Self {
        let lanes = lanes.max(1) as usize;
        let mut shards = vec![Vec::new(); lanes];
        let mut starts = vec![vec![0u64]; lanes];
        let mut sizes = vec![0u64; lanes];
        // The lane with the fewest samples, the lowest of equals, on top.
        let mut fewest: BinaryHeap<Reverse<(u64, usize)>> = (0..lanes).map(|l| Reverse((0, l))).collect();
        for j in 0..perm.len() {
            let shard = perm.at(j);
            let size = shard_sizes.get(shard as usize).copied().unwrap_or(0);
            let Some(Reverse((_, l))) = fewest.pop() else { break };
            shards[l].push(shard);
            sizes[l] = sizes[l].saturating_add(size);
            starts[l].push(sizes[l]);
            fewest.push(Reverse((sizes[l], l)));
        }
        Self { shards, starts, sizes, chunk: chunk.max(1), shard_sizes, first, within }
    }

    /// Positions before turn `r`: every lane's first `r` chunks.
    fn before_turn(&self, r: u64) -> u64 {
        let upto = r.saturating_mul(self.chunk);
        self.sizes.iter().map(|&n| n.min(upto)).sum()
    }

    /// Lane and offset in it of epoch position `i`.
    pub fn locate(&self, i: u64) -> (usize, u64) {
        let longest = self.sizes.iter().copied().max().unwrap_or(0);
        // The last turn that starts at or before i.
        let (mut lo, mut hi) = (0u64, longest.div_ceil(self.chunk));
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if self.before_turn(mid) <= i {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let mut rest = i - self.before_turn(lo).min(i);
        let taken = lo * self.chunk;
        for (l, &n) in self.sizes.iter().enumerate() {
            let turn = self.chunk.min(n.saturating_sub(taken));
            if rest < turn {
                return (l, taken + rest);
            }
            rest -= turn;
        }
        (0, 0)
    }

    /// The lane position `i` reads.
    pub fn lane(&self, i: u64) -> u32 {
        self.locate(i).0 as u32
    }

    fn at(&self, i: u64) -> u64 {
        let (l, offset) = self.locate(i);
        let starts = &self.starts[l];
        let k = starts.partition_point(|&s| s <= offset).saturating_sub(1);
        let Some(&shard) = self.shards[l].get(k) else {
            return 0;
        };
        let size = self.shard_sizes.get(shard as usize).copied().unwrap_or(0);
        let offset = self.within.at(shard, size, offset - starts[k]);
        self.first.get(shard as usize).copied().unwrap_or(0) + offset
    }
}

impl EpochOrder {
    /// The shard-aware order of one epoch for shards of `sizes` samples;
    /// `within`: shuffle the samples of each shard too (a block shuffle).
    pub fn shards(sizes: &[u64], seed: u64, epoch: u64, shuffle: bool, within: bool) -> Self {
        let within = Within { shuffle: (shuffle && within).then_some((seed, epoch)), window: 0 };
        Self::sharded(sizes.into(), seed, epoch, shuffle, within, None)
    }

    /// The shard-aware order of one epoch: shards of `sizes` samples, in
    /// an order of `seed` and `epoch` when `shuffle`, each read in the
    /// order `within`, and with `lanes`, `(lanes, chunk)`, read as that
    /// many lanes taking `chunk` positions in turn.
    pub fn sharded(sizes: Arc<[u64]>, seed: u64, epoch: u64, shuffle: bool, within: Within, lanes: Option<(u32, u64)>) -> Self {
        let perm = Permutation::new(sizes.len() as u64, seed, epoch, shuffle);
        let mut first = Vec::with_capacity(sizes.len());
        let mut total = 0u64;
        for &n in sizes.iter() {
            first.push(total);
            total = total.saturating_add(n);
        }
        if let Some((lanes, chunk)) = lanes {
            return Self::Lanes(Lanes::new(&perm, sizes, first, lanes, chunk, within));
        }
        let mut starts = Vec::with_capacity(sizes.len() + 1);
        let mut at = 0u64;
        for j in 0..sizes.len() as u64 {
            starts.push(at);
            let shard = perm.at(j) as usize;
            at = at.saturating_add(sizes.get(shard).copied().unwrap_or(0));
        }
        starts.push(at);
        Self::Shards { perm, starts, first, within }
    }

    /// The sample at position `i` of the epoch (`i` < number of samples).
    pub fn at(&self, i: u64) -> u64 {
        match self {
            Self::Samples(perm) => perm.at(i),
            Self::Shards { perm, starts, first, within } => {
                // The last shard slot whose start is <= i; empty shards have
                // the same start as the next one and are skipped over.
                let j = starts.partition_point(|&s| s <= i).saturating_sub(1);
                let shard = perm.at(j as u64);
                let start = starts.get(j).copied().unwrap_or(0);
                let size = starts.get(j + 1).copied().unwrap_or(start) - start;
                first.get(shard as usize).copied().unwrap_or(0) + within.at(shard, size, i - start)
            }
            Self::Lanes(lanes) => lanes.at(i),
        }
    }
}

/// Batches of each consumer per lane's turn: a worker keeping to a lane
/// gets tasks of up to this many batches, and an in-order trainer with a
/// window of `lanes * LANE_TURN` batches keeps every lane's worker busy.
pub const LANE_TURN: u64 = 4;

/// Most positions a [`Resumed`] epoch lists as delivered beyond its
/// offset: the ranks of a synchronous job are at most a step apart, so
/// a few batches per rank; this bounds the spec that carries them.
pub const MAX_DELIVERED: usize = 1 << 16;

/// What a saved run had delivered of one epoch: every position of the
/// epoch's order below `offset`, and the positions in `delivered`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resumed {
    /// The epoch.
    pub epoch: u32,
    /// Every position below it was delivered.
    pub offset: u64,
    /// Positions above `offset` also delivered: ascending, each < N.
    pub delivered: Vec<u64>,
}

impl Resumed {
    /// Positions of an epoch of `n` samples still to deliver.
    pub fn remaining(&self, n: u64) -> u64 {
        n.saturating_sub(self.offset).saturating_sub(self.delivered.len() as u64)
    }

    /// The position of the `q`-th remaining one (`q < remaining(n)`).
    pub fn position(&self, q: u64) -> u64 {
        // The answer is offset + q + k, k the number of delivered positions
        // below it: the number of i with delivered[i] - i <= offset + q
        // (delivered[i] - i never decreases, as delivered ascends
        // strictly, and is > offset, so it does not underflow).
        let target = self.offset + q;
        let d = &self.delivered;
        let (mut lo, mut hi) = (0usize, d.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if d[mid] - mid as u64 <= target {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        target + lo as u64
    }

    /// The position a remaining-position index `q` stands for in an epoch
    /// of `n` samples: past the remaining ones, the padding repeats the
    /// epoch from its start (DistributedSampler's wrap-around).
    fn position_or_padding(resumed: Option<&Self>, n: u64, q: u64) -> u64 {
        let remaining = resumed.map_or(n, |r| r.remaining(n));
        if q < remaining {
            resumed.map_or(q, |r| r.position(q))
        } else {
            (q - remaining) % n.max(1)
        }
    }
}

/// A job's split into consumers and batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Samples in the dataset (N).
    pub num_samples: u64,
    /// Samples per batch.
    pub batch_size: u64,
    /// Data-parallel consumers (W).
    pub consumers: u32,
    /// Shuffle each epoch.
    pub shuffle: bool,
    /// Seed of the permutation.
    pub seed: u64,
    /// Truncate instead of padding, and drop an incomplete last batch.
    pub drop_last: bool,
    /// Number of epochs.
    pub epochs: u32,
    /// Samples per shard, in dataset order, for a sharded dataset: the
    /// epoch order then shuffles shards, not samples (see [`EpochOrder`]).
    pub shards: Option<Arc<[u64]>>,
    /// With `shards` and `shuffle`: the samples of each shard are shuffled
    /// too, each shard on its own (a block shuffle: Parquet row groups).
    pub shuffle_within_shards: bool,
    /// With `shuffle_within_shards`: shuffle in windows of this many
    /// samples (a stream's shuffle buffer), 0 for the whole shard.
    pub shuffle_window: u64,
    /// With `shards`: read the epoch as this many lanes (0: no lanes), see
    /// [`Lanes`].
    pub lanes: u32,
    /// A resumed job's partly delivered first epoch (None: the job starts
    /// at epoch 0).
    pub resume: Option<Arc<Resumed>>,
}

impl Plan {
    /// Samples each consumer gets per epoch (`DistributedSampler.num_samples`).
    pub fn samples_per_consumer(&self) -> u64 {
        self.per_consumer(self.num_samples)
    }

    /// Batches each consumer gets per whole epoch (`len(DataLoader)`).
    pub fn batches_per_epoch(&self) -> u64 {
        self.batches_of(self.samples_per_consumer())
    }

    fn per_consumer(&self, samples: u64) -> u64 {
        let w = u64::from(self.consumers.max(1));
        if self.drop_last { samples / w } else { samples.div_ceil(w) }
    }

    fn batches_of(&self, per: u64) -> u64 {
        let b = self.batch_size.max(1);
        if self.drop_last { per / b } else { per.div_ceil(b) }
    }

    /// What a saved run had delivered of `epoch`, for a resumed job.
    pub fn resumed(&self, epoch: u32) -> Option<&Resumed> {
        self.resume.as_deref().filter(|r| r.epoch == epoch)
    }

    /// The epoch the job starts at: 0, or a resumed job's first epoch.
    pub fn first_epoch(&self) -> u32 {
        self.resume.as_ref().map_or(0, |r| r.epoch)
    }

    /// Samples of `epoch` each consumer gets: the whole epoch's share, or
    /// a share of what a resumed epoch has left.
    pub fn epoch_samples_per_consumer(&self, epoch: u32) -> u64 {
        match self.resumed(epoch) {
            Some(r) => self.per_consumer(r.remaining(self.num_samples)),
            None => self.samples_per_consumer(),
        }
    }

    /// Batches each consumer gets in `epoch` (0 before the job's first).
    pub fn epoch_batches(&self, epoch: u32) -> u64 {
        if epoch < self.first_epoch() || epoch >= self.epochs {
            return 0;
        }
        // Never more than a whole epoch's: what is left of one is no more.
        self.batches_of(self.epoch_samples_per_consumer(epoch)).min(self.batches_per_epoch())
    }

    /// Sequence number of the first batch of `epoch` that exists: the
    /// epoch's first, or, for a resumed job's first epoch, the first of its
    /// last `epoch_batches` sequence numbers.
    pub fn epoch_start(&self, epoch: u32) -> u64 {
        let bpe = self.batches_per_epoch();
        let end = u64::from(epoch.min(self.epochs)) * bpe;
        match self.resumed(epoch) {
            Some(_) if epoch < self.epochs => end + bpe - self.epoch_batches(epoch),
            _ => end,
        }
    }

    /// The first batch of the job: 0, or where a resumed job starts.
    pub fn first_seq(&self) -> u64 {
        self.epoch_start(self.first_epoch())
    }

    /// Sequence numbers run below this for every consumer (those below
    /// [`first_seq`](Self::first_seq) do not exist).
    pub fn total_batches(&self) -> u64 {
        self.batches_per_epoch() * u64::from(self.epochs)
    }

    /// `(epoch, batch within epoch)` of a consumer-local sequence number.
    pub fn locate(&self, seq: u64) -> (u32, u64) {
        let per = self.batches_per_epoch().max(1);
        ((seq / per) as u32, seq % per)
    }

    /// The dataset order of one epoch.
    pub fn order(&self, epoch: u32) -> EpochOrder {
        match &self.shards {
            Some(sizes) => {
                let epoch = u64::from(epoch);
                let within = Within {
                    shuffle: (self.shuffle && self.shuffle_within_shards).then_some((self.seed, epoch)),
                    window: self.shuffle_window,
                };
                let lanes = (self.lanes > 0).then(|| (self.lanes, self.lane_chunk()));
                EpochOrder::sharded(sizes.clone(), self.seed, epoch, self.shuffle, within, lanes)
            }
            None => EpochOrder::Samples(Permutation::new(self.num_samples, self.seed, u64::from(epoch), self.shuffle)),
        }
    }

    /// Positions of a lane's turn: [`LANE_TURN`] batches of every consumer
    /// (a consumer's batch `b` takes positions `b * B * W ..`, every
    /// consumer's `b`-th batch the same run, DistributedSampler's split),
    /// so a worker making a turn's batches reads one lane.
    pub fn lane_chunk(&self) -> u64 {
        LANE_TURN * self.batch_size.max(1) * u64::from(self.consumers.max(1))
    }

    /// The lane the batch with sequence number `seq` reads (its first
    /// sample's; a batch at the end of a lane's turn may read the next
    /// lane's too), or None without lanes. `order` is [`Plan::order`] of
    /// the batch's epoch (the caller keeps it: it is built per epoch).
    pub fn lane_of(&self, order: &EpochOrder, seq: u64) -> Option<u32> {
        let EpochOrder::Lanes(lanes) = order else {
            return None;
        };
        let (epoch, batch) = self.locate(seq);
        let positions = self.batch_positions(epoch, batch);
        if positions.is_empty() {
            return None;
        }
        let (position, _) = self.epoch_position(epoch, 0, positions.start);
        Some(lanes.lane(position))
    }

    /// Consumer-local sample positions of batch `batch` of `epoch` (its
    /// index in the epoch's sequence numbers; a resumed epoch's batches are
    /// its last ones, and the ones before hold nothing).
    pub fn batch_positions(&self, epoch: u32, batch: u64) -> Range<u64> {
        let per = self.epoch_samples_per_consumer(epoch);
        let batch = if self.resumed(epoch).is_some() {
            let skipped = self.batches_per_epoch() - self.epoch_batches(epoch);
            match batch.checked_sub(skipped) {
                Some(b) => b,
                None => return per..per,
            }
        } else {
            batch
        };
        let start = batch.saturating_mul(self.batch_size).min(per);
        start..(start + self.batch_size).min(per)
    }

    /// Samples in the batch with sequence number `seq` (of any consumer):
    /// `batch_size`, less for the short last batch of an epoch.
    pub fn batch_len(&self, seq: u64) -> u64 {
        let (epoch, batch) = self.locate(seq);
        let positions = self.batch_positions(epoch, batch);
        positions.end - positions.start
    }

    /// Index into what `epoch` serves (its remaining positions, then the
    /// padding) of `consumer`'s local `position`: DistributedSampler's
    /// rank r takes indices[r::W] of the padded list.
    fn served_index(&self, consumer: u32, position: u64) -> u64 {
        u64::from(consumer) + position * u64::from(self.consumers)
    }

    /// Position in `epoch`'s order of the sample at consumer-local
    /// `position` of `consumer`, and whether it is padding (a repeat).
    pub fn epoch_position(&self, epoch: u32, consumer: u32, position: u64) -> (u64, bool) {
        let resumed = self.resumed(epoch);
        let q = self.served_index(consumer, position);
        let remaining = resumed.map_or(self.num_samples, |r| r.remaining(self.num_samples));
        (Resumed::position_or_padding(resumed, self.num_samples, q), q >= remaining)
    }

    /// Dataset indices of the batch with sequence number `seq` of `consumer`.
    pub fn batch_indices(&self, consumer: u32, seq: u64) -> Vec<u64> {
        let (epoch, batch) = self.locate(seq);
        let order = self.order(epoch);
        let resumed = self.resumed(epoch);
        self.batch_positions(epoch, batch)
            .map(|p| {
                let q = self.served_index(consumer, p);
                order.at(Resumed::position_or_padding(resumed, self.num_samples, q))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn plan(n: u64, b: u64, w: u32, drop_last: bool, shuffle: bool) -> Plan {
        Plan { num_samples: n, batch_size: b, consumers: w, shuffle, seed: 17, drop_last, epochs: 2, shards: None, shuffle_within_shards: false, shuffle_window: 0, lanes: 0, resume: None }
    }

    /// torch's DistributedSampler + DataLoader, written out literally from
    /// torch/utils/data/distributed.py for shuffle=False.
    fn torch_reference(n: u64, b: u64, w: u64, rank: u64, drop_last: bool) -> Vec<Vec<u64>> {
        let mut indices: Vec<u64> = (0..n).collect();
        let num_samples = if drop_last && !n.is_multiple_of(w) {
            ((n as f64 - w as f64) / w as f64).ceil().max(0.0) as u64
        } else {
            n.div_ceil(w)
        };
        let total = num_samples * w;
        if !drop_last {
            let padding = total - n;
            let mut pad = Vec::new();
            while (pad.len() as u64) < padding {
                pad.extend_from_slice(&indices);
            }
            indices.extend_from_slice(&pad[..padding as usize]);
        } else {
            indices.truncate(total as usize);
        }
        let mine: Vec<u64> = indices.iter().copied().skip(rank as usize).step_by(w as usize).collect();
        let mut batches: Vec<Vec<u64>> = mine.chunks(b as usize).map(<[u64]>::to_vec).collect();
        if drop_last && batches.last().is_some_and(|l| (l.len() as u64) < b) {
            batches.pop();
        }
        batches
    }

    #[test]
    fn matches_distributed_sampler_without_shuffle() {
        for &(n, b, w) in &[(10u64, 3u64, 3u32), (10_007, 64, 2), (5, 4, 8), (64, 64, 1), (1, 1, 3), (100, 7, 4)] {
            for drop_last in [false, true] {
                let p = plan(n, b, w, drop_last, false);
                for r in 0..w {
                    let expect = torch_reference(n, b, u64::from(w), u64::from(r), drop_last);
                    assert_eq!(p.batches_per_epoch(), expect.len() as u64, "n={n} b={b} w={w} drop={drop_last}");
                    let got: Vec<Vec<u64>> = (0..p.batches_per_epoch()).map(|s| p.batch_indices(r, s)).collect();
                    assert_eq!(got, expect, "n={n} b={b} w={w} r={r} drop={drop_last}");
                    let lens: Vec<u64> = (0..p.total_batches()).map(|s| p.batch_len(s)).collect();
                    let want: Vec<u64> = (0..p.epochs).flat_map(|_| expect.iter().map(|b| b.len() as u64)).collect();
                    assert_eq!(lens, want, "batch_len n={n} b={b} w={w} drop={drop_last}");
                }
            }
        }
    }

    #[test]
    fn epochs_differ_and_seed_repeats() {
        let p = plan(10_007, 64, 2, false, true);
        let e0 = p.batch_indices(0, 0);
        let e1 = p.batch_indices(0, p.batches_per_epoch());
        assert_ne!(e0, e1);
        assert_eq!(e0, p.batch_indices(0, 0));
        let other_seed = Plan { seed: 18, ..p.clone() };
        assert_ne!(e0, other_seed.batch_indices(0, 0));
    }

    #[test]
    fn shuffled_epoch_covers_dataset_plus_padding() {
        let p = &plan(10_007, 64, 2, false, true);
        let mut all: Vec<u64> = (0..2)
            .flat_map(|r| (0..p.batches_per_epoch()).flat_map(move |s| p.batch_indices(r, s)))
            .collect();
        assert_eq!(all.len(), 10_008);
        all.sort_unstable();
        let mut dedup = all.clone();
        dedup.dedup();
        assert_eq!(dedup, (0..10_007).collect::<Vec<_>>());
    }

    fn sharded(sizes: &[u64], b: u64, w: u32, shuffle: bool) -> Plan {
        Plan { shards: Some(sizes.into()), num_samples: sizes.iter().sum(), ..plan(0, b, w, false, shuffle) }
    }

    #[test]
    fn a_block_shuffle_visits_each_block_once_in_an_order_of_its_own() {
        let sizes = [5u64, 0, 3, 7, 1, 4, 9];
        let p = Plan { shuffle_within_shards: true, ..sharded(&sizes, 4, 1, true) };
        let owner: Vec<usize> = sizes.iter().enumerate().flat_map(|(s, &n)| std::iter::repeat_n(s, n as usize)).collect();
        let mut epochs = Vec::new();
        for epoch in 0..2u64 {
            let seqs = epoch * p.batches_per_epoch()..(epoch + 1) * p.batches_per_epoch();
            let all: Vec<u64> = seqs.flat_map(|s| p.batch_indices(0, s)).collect();
            let mut sorted = all.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..29).collect::<Vec<_>>(), "every sample once in epoch {epoch}");
            // Each block's samples take consecutive positions...
            let mut blocks: Vec<usize> = all.iter().map(|&i| owner[i as usize]).collect();
            blocks.dedup();
            assert_eq!(blocks.len(), 6, "each non-empty block once, in one run: {all:?}");
            // ...in an order that is not the file's.
            assert!(all.windows(2).any(|w| owner[w[0] as usize] == owner[w[1] as usize] && w[1] != w[0] + 1), "{all:?}");
            epochs.push(all);
        }
        assert_ne!(epochs[0], epochs[1], "a new order each epoch");
        // Without shuffle, dataset order: the flag only shuffles.
        let unshuffled = Plan { shuffle_within_shards: true, ..sharded(&sizes, 4, 1, false) };
        let all: Vec<u64> = (0..unshuffled.batches_per_epoch()).flat_map(|s| unshuffled.batch_indices(0, s)).collect();
        assert_eq!(all, (0..29).collect::<Vec<_>>());
    }

    #[test]
    fn unshuffled_shards_keep_dataset_order() {
        let p = sharded(&[5, 0, 3, 7], 4, 1, false);
        let all: Vec<u64> = (0..p.batches_per_epoch()).flat_map(|s| p.batch_indices(0, s)).collect();
        assert_eq!(all, (0..15).collect::<Vec<_>>());
    }

    #[test]
    fn shuffled_shards_are_read_front_to_back_in_a_new_order_each_epoch() {
        let sizes = [5u64, 0, 3, 7, 1, 4, 4, 6];
        let p = sharded(&sizes, 4, 1, true);
        let owner: Vec<usize> = sizes.iter().enumerate().flat_map(|(s, &n)| std::iter::repeat_n(s, n as usize)).collect();
        let shard_of = |i: u64| owner[i as usize];
        let mut orders = Vec::new();
        for epoch in 0..3u64 {
            let seqs = epoch * p.batches_per_epoch()..(epoch + 1) * p.batches_per_epoch();
            let all: Vec<u64> = seqs.flat_map(|s| p.batch_indices(0, s)).collect();
            let mut sorted = all.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..30).collect::<Vec<_>>(), "every sample once in epoch {epoch}");
            // Within a shard, consecutive positions are consecutive samples.
            let mut shards = Vec::new();
            for w in all.windows(2) {
                if shard_of(w[0]) == shard_of(w[1]) {
                    assert_eq!(w[1], w[0] + 1, "epoch {epoch}: {all:?}");
                }
            }
            for &i in &all {
                if shards.last() != Some(&shard_of(i)) {
                    shards.push(shard_of(i));
                }
            }
            assert_eq!(shards.len(), 7, "each non-empty shard visited once: {shards:?}");
            orders.push(shards);
        }
        assert!(orders[0] != orders[1] || orders[1] != orders[2], "shard order changes between epochs");
    }

    fn laned(sizes: &[u64], b: u64, w: u32, lanes: u32, window: u64) -> Plan {
        Plan { lanes, shuffle_within_shards: window > 0, shuffle_window: window, ..sharded(sizes, b, w, true) }
    }

    /// Dataset index -> (shard, offset in it).
    fn owners(sizes: &[u64]) -> Vec<(usize, u64)> {
        sizes.iter().enumerate().flat_map(|(s, &n)| (0..n).map(move |o| (s, o))).collect()
    }

    #[test]
    fn lanes_read_their_shards_front_to_back_and_take_turns() {
        // 7 uneven shards, 3 lanes, 2 consumers of batches of 2: a turn is
        // LANE_TURN batches of each consumer.
        let sizes = [40u64, 3, 17, 0, 25, 9, 31];
        let p = laned(&sizes, 2, 2, 3, 0);
        let owner = owners(&sizes);
        let EpochOrder::Lanes(lanes) = p.order(0) else { panic!("a laned order") };
        let n: u64 = sizes.iter().sum();
        let mut lane_seen: Vec<Vec<u64>> = vec![Vec::new(); 3];
        let mut turns = Vec::new();
        for i in 0..n {
            let (l, offset) = lanes.locate(i);
            lane_seen[l].push(offset);
            if turns.last() != Some(&l) {
                turns.push(l);
            }
        }
        for (l, offsets) in lane_seen.iter().enumerate() {
            assert_eq!(*offsets, (0..offsets.len() as u64).collect::<Vec<_>>(), "lane {l} in order");
        }
        // Balanced lanes, every one of them used, turns of one chunk each
        // while every lane has samples left.
        let mut lens: Vec<usize> = lane_seen.iter().map(Vec::len).collect();
        lens.sort_unstable();
        assert!(lens[0] > 0 && lens[2] - lens[0] <= 40, "{lens:?}");
        assert_eq!(&turns[..3], &[0, 1, 2], "{turns:?}");
        // Within a lane, a shard's samples come in file order, one shard
        // after another.
        let order = p.order(0);
        for l in 0..3 {
            let idx: Vec<u64> = (0..n).filter(|&i| lanes.locate(i).0 == l).map(|i| order.at(i)).collect();
            for w in idx.windows(2) {
                let (a, b) = (owner[w[0] as usize], owner[w[1] as usize]);
                assert!(a.0 != b.0 || b.1 == a.1 + 1, "lane {l}: {idx:?}");
            }
        }
        // The batches of one consumer's turn read one lane.
        let turn_lanes: Vec<Option<u32>> = (0..LANE_TURN).map(|s| p.lane_of(&order, s)).collect();
        assert!(turn_lanes.iter().all(|&l| l == turn_lanes[0]), "{turn_lanes:?}");
        assert_ne!(p.lane_of(&order, 0), p.lane_of(&order, LANE_TURN));
    }

    #[test]
    fn a_shuffle_buffer_moves_samples_within_their_window_only() {
        let sizes = [50u64, 7, 33];
        let p = laned(&sizes, 4, 1, 2, 8);
        let owner = owners(&sizes);
        let order = p.order(1);
        let EpochOrder::Lanes(lanes) = &order else { panic!("a laned order") };
        let n: u64 = sizes.iter().sum();
        let mut moved = false;
        for i in 0..n {
            let (shard, offset) = owner[order.at(i) as usize];
            let (l, lane_offset) = lanes.locate(i);
            // The offset within the shard is in the same window of 8 as
            // the position the lane reads it at.
            let start = lanes.starts[l].iter().rev().find(|&&s| s <= lane_offset).copied().unwrap_or(0);
            let read_at = lane_offset - start;
            assert_eq!(read_at / 8, offset / 8, "shard {shard} offset {offset} read at {read_at}");
            moved |= read_at != offset;
        }
        assert!(moved, "a shuffle buffer shuffles");
    }

    #[test]
    fn lanes_give_every_rank_the_same_batches_and_every_sample_once() {
        let sizes = [40u64, 3, 17, 0, 25, 9, 31];
        for (b, w, lanes, drop_last) in [(4u64, 2u32, 3u32, false), (5, 3, 1, true), (3, 2, 7, false), (8, 1, 2, false)] {
            let p = Plan { drop_last, ..laned(&sizes, b, w, lanes, 4) };
            let mut all = Vec::new();
            for r in 0..w {
                let got: Vec<u64> = (0..p.batches_per_epoch()).flat_map(|s| p.batch_indices(r, s)).collect();
                assert_eq!(got.len() as u64, p.samples_per_consumer() / b * b + if drop_last { 0 } else { p.samples_per_consumer() % b });
                all.extend(got);
            }
            all.sort_unstable();
            all.dedup();
            let n: u64 = sizes.iter().sum();
            if drop_last {
                assert!(all.len() as u64 >= n - u64::from(w) * b, "{b} {w} {lanes}");
            } else {
                assert_eq!(all, (0..n).collect::<Vec<_>>(), "{b} {w} {lanes}");
            }
        }
    }

    /// Fails unless `f` maps `0..n` onto `0..n`, each value once.
    fn bijection(n: u64, f: impl Fn(u64) -> u64) -> Result<(), TestCaseError> {
        let mut seen = vec![false; n as usize];
        for i in 0..n {
            let x = f(i);
            prop_assert!(x < n, "{} out of 0..{}", x, n);
            prop_assert!(!seen[x as usize], "duplicate {}", x);
            seen[x as usize] = true;
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn shard_order_is_a_bijection(sizes in proptest::collection::vec(0u64..20, 1..40), seed: u64, epoch in 0u64..5) {
            let n: u64 = sizes.iter().sum();
            let order = EpochOrder::shards(&sizes, seed, epoch, true, false);
            bijection(n, |i| order.at(i))?;
        }

        #[test]
        fn a_laned_order_is_a_bijection(
            sizes in proptest::collection::vec(0u64..30, 1..20),
            lanes in 1u32..6,
            chunk in 1u64..9,
            window in 0u64..6,
            seed: u64,
        ) {
            let n: u64 = sizes.iter().sum();
            let within = Within { shuffle: (window > 0).then_some((seed, 1)), window };
            let order = EpochOrder::sharded(sizes.into(), seed, 1, true, within, Some((lanes, chunk)));
            bijection(n, |i| order.at(i))?;
        }

        #[test]
        fn permutation_is_a_bijection(n in 0u64..3000, seed: u64, epoch in 0u64..10) {
            let perm = Permutation::new(n, seed, epoch, true);
            bijection(n, |i| perm.at(i))?;
        }

        #[test]
        fn the_network_permutes_a_domain_under_twice_n(n in 2u64..5000, seed: u64, epoch in 0u64..10) {
            // Odd widths included: the unbalanced network must stay a
            // bijection of its whole domain, and that domain under 2n keeps
            // the cycle walk short.
            let perm = Permutation::new(n, seed, epoch, true);
            let domain = 1u64 << (perm.left_bits + perm.right_bits);
            prop_assert!(domain < 2 * n || domain == 4, "domain {} for n {}", domain, n);
            bijection(domain, |x| perm.encrypt(x))?;
        }

        #[test]
        fn every_rank_gets_the_same_number_of_batches(n in 1u64..5000, b in 1u64..100, w in 1u32..9, drop_last: bool) {
            let p = plan(n, b, w, drop_last, true);
            let counts: Vec<usize> = (0..w).map(|r| {
                (0..p.batches_per_epoch()).map(|s| p.batch_indices(r, s).len()).sum()
            }).collect();
            prop_assert!(counts.windows(2).all(|c| c[0] == c[1]));
        }
    }
}
