//! A weighted mixture of datasets as a pure function of the position in the
//! mixture's stream (the sampler's half of weighted mixtures): which source position
//! `p` draws from and which of that source's samples, in O(K + log D) time
//! and O(K) memory (K sources, D the weights' denominator), so that the
//! coordinator, every worker and the trainer agree without lists, on any
//! number of workers and ranks.
//!
//! - **Stratified blocks.** The stream is cut into blocks of `block`
//!   positions (the global batch). Block b gives source k `floor(w_k L)`
//!   positions plus, for R of the K sources, one more: every block's count
//!   of every source is within 1 of `w_k L`. Which sources get the extra
//!   follows a rotation on the weights' denominator D
//!   (systematic sampling: the extras' offset moves by `a/D` per block, `a`
//!   coprime with D), so over every D consecutive blocks each source gets
//!   exactly its share, and the count of any source's extras before any
//!   block is a floor sum, computed in O(log D).
//! - **Shuffled within the block.** The block's slots are laid out source
//!   by source and then permuted by a seeded permutation of the block, new
//!   for each block: no fixed interleave a model could learn.
//! - **Each source walks its own permutation.** The m-th draw of source k
//!   is sample `perm_{k,pass}(m mod n_k)` of pass `m / n_k`: every sample
//!   once per pass, and a source that runs out starts its next pass with
//!   its own permutation (and its own pass number for its random
//!   transforms).
//! - **Re-weighting.** [`Mixture::reweighted`] continues every source's
//!   walk from where it stands at a block boundary under new weights.

use smallvec::SmallVec;

use crate::sampler::Permutation;

/// One source of a mixture: its size and its weight (integer units; the
/// weights are proportions of their sum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MixSource {
    /// Samples in the source (> 0).
    pub samples: u64,
    /// Its weight in integer units (> 0 for a source that is drawn from).
    pub weight: u64,
}

/// What one position of the mixture's stream draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draw {
    /// Index of the source.
    pub source: usize,
    /// Sample index within the source.
    pub index: u64,
    /// The source's own pass (epoch) this draw belongs to.
    pub pass: u64,
}

/// A mixture that cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MixError {
    /// No source, or no positive weight.
    #[error("a mixture needs at least one source with a weight above 0")]
    Empty,
    /// A source with no samples.
    #[error("source {0} has no samples")]
    EmptySource(usize),
    /// A block of no positions.
    #[error("the block (global batch) size must be > 0")]
    Block,
    /// Weights too large to add up.
    #[error("the weights add up past 2^40 units; give smaller ones")]
    Weights,
    /// Weights whose sum is past what a float holds.
    #[error("the weights add up to more than a float holds; give smaller ones")]
    HugeWeights,
    /// A weight that is negative, infinite or not a number.
    #[error("weights must be finite and >= 0")]
    BadWeight,
    /// A positive weight under a millionth of the weights' sum.
    #[error("a weight above 0 is under a millionth of the weights' sum; give it 0 or more")]
    TinyWeight,
    /// A stage's weights do not match the sources.
    #[error("stage {stage} gives {weights} weights for {sources} sources")]
    StageWeights {
        /// The stage.
        stage: usize,
        /// Weights it gives.
        weights: usize,
        /// Sources of the mixture.
        sources: usize,
    },
    /// A stage that starts at a position it cannot.
    #[error(
        "stage {0} must start after the stage before it, at a multiple of the block (the first at 0)"
    )]
    StageStart(usize),
}

/// Where the mixture's stream starts drawing under its weights: position
/// `start` (a block boundary), with each source's walk at `drawn[k]`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    start: u64,
    drawn: Vec<u64>,
}

/// A weighted mixture's plan (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mixture {
    sources: Vec<MixSource>,
    block: u64,
    seed: u64,
    shuffle: bool,
    /// Sum of the weights.
    denominator: u64,
    /// Positions each source gets in every block.
    base: Vec<u64>,
    /// Where each source's arc of extras starts on `[0, D)`, and its length
    /// (`weight x block mod D`).
    arc_start: Vec<u64>,
    arc_len: Vec<u64>,
    /// The rotation per block, coprime with D, and the seeded first offset.
    stride: u64,
    offset: u64,
    origin: Origin,
}

const WEIGHT_LIMIT: u64 = 1 << 40;

impl Mixture {
    /// The mixture of `sources` in blocks of `block` positions, seeded.
    pub fn new(
        sources: &[MixSource],
        block: u64,
        seed: u64,
        shuffle: bool,
    ) -> Result<Self, MixError> {
        let origin = Origin {
            start: 0,
            drawn: vec![0; sources.len()],
        };
        Self::with_origin(sources, block, seed, shuffle, origin)
    }

    fn with_origin(
        sources: &[MixSource],
        block: u64,
        seed: u64,
        shuffle: bool,
        origin: Origin,
    ) -> Result<Self, MixError> {
        if block == 0 {
            return Err(MixError::Block);
        }
        if let Some(k) = sources.iter().position(|s| s.samples == 0) {
            return Err(MixError::EmptySource(k));
        }
        let denominator = sources
            .iter()
            .try_fold(0u64, |d, s| d.checked_add(s.weight))
            .ok_or(MixError::Weights)?;
        if denominator == 0 {
            return Err(MixError::Empty);
        }
        if denominator > WEIGHT_LIMIT {
            return Err(MixError::Weights);
        }
        let d = u128::from(denominator);
        let mut base = Vec::with_capacity(sources.len());
        let mut arc_start = Vec::with_capacity(sources.len());
        let mut arc_len = Vec::with_capacity(sources.len());
        let mut at: u128 = 0;
        for s in sources {
            let units = u128::from(s.weight) * u128::from(block);
            base.push((units / d) as u64);
            let len = units % d;
            arc_start.push((at % d) as u64);
            arc_len.push(len as u64);
            at += len;
        }
        // The golden-ratio rotation, nudged to be coprime with D so that D
        // consecutive blocks see every offset once.
        let mut stride = ((denominator as f64) * 0.618_033_988_749_895) as u64 % denominator;
        while gcd(stride, denominator) != 1 {
            stride = (stride + 1) % denominator;
        }
        let offset = crate::sampler::mix_seed(seed, 0x6d69_7874) % denominator;
        Ok(Self {
            sources: sources.to_vec(),
            block,
            seed,
            shuffle,
            denominator,
            base,
            arc_start,
            arc_len,
            stride,
            offset,
            origin,
        })
    }

    /// The same mixture under new weights from position `at` on (rounded
    /// down to a block boundary): each source's walk continues where it
    /// stands there, so nothing of a source repeats before its pass ends.
    pub fn reweighted(&self, at: u64, weights: &[u64]) -> Result<Self, MixError> {
        let start = at.max(self.origin.start) / self.block * self.block;
        let drawn = (0..self.sources.len())
            .map(|k| self.drawn_before(k, start))
            .collect();
        let sources: Vec<MixSource> = self
            .sources
            .iter()
            .zip(weights.iter().chain(std::iter::repeat(&0)))
            .map(|(s, &weight)| MixSource { weight, ..*s })
            .collect();
        Self::with_origin(
            &sources,
            self.block,
            self.seed,
            self.shuffle,
            Origin { start, drawn },
        )
    }

    /// Number of sources.
    pub fn sources(&self) -> usize {
        self.sources.len()
    }

    /// Positions per block.
    pub fn block(&self) -> u64 {
        self.block
    }

    /// Whether source `k` gets one more position in block `b` (counted from
    /// the origin).
    fn extra(&self, k: usize, b: u64) -> bool {
        let d = self.denominator;
        // (b x stride + offset) mod D, in u64 where it fits (D <= 2^40:
        // almost always), else in u128 (a division of those is slow).
        let o = match (b % d)
            .checked_mul(self.stride)
            .and_then(|x| x.checked_add(self.offset))
        {
            Some(x) => x % d,
            None => {
                ((u128::from(b) * u128::from(self.stride) + u128::from(self.offset))
                    % u128::from(d)) as u64
            }
        };
        // Offsets stay below D <= 2^40: no overflow below.
        let (lo, len) = (self.arc_start[k], self.arc_len[k]);
        (o + d - lo) % d < len
    }

    /// How many of the first `n` blocks (from the origin) give source `k`
    /// one more position: a floor sum, O(log D).
    fn extras_before(&self, k: usize, n: u64) -> u64 {
        let (lo, len) = (self.arc_start[k], self.arc_len[k]);
        if len == 0 || n == 0 {
            return 0;
        }
        let d = self.denominator;
        let below = |t: u64| self.offsets_below(n, t);
        let hi = lo + len;
        if hi <= d {
            below(hi) - below(lo)
        } else {
            (n - below(lo)) + below(hi - d)
        }
    }

    /// `#{x < n : (stride x + offset) mod D < t}` for `t <= D`.
    fn offsets_below(&self, n: u64, t: u64) -> u64 {
        let d = u128::from(self.denominator);
        let (a, c, t) = (
            u128::from(self.stride),
            u128::from(self.offset),
            u128::from(t),
        );
        // [y mod D < t] = floor(y / D) - floor((y + D - t) / D) + 1.
        let n128 = u128::from(n);
        (floor_sum(n128, d, a, c) + n128 - floor_sum(n128, d, a, c + d - t)) as u64
    }

    /// Positions of block `b` (from the origin) each source gets.
    pub fn quota(&self, b: u64) -> Vec<u64> {
        (0..self.sources.len())
            .map(|k| self.base[k] + u64::from(self.extra(k, b)))
            .collect()
    }

    /// Draws of source `k` before position `p` of the stream.
    pub fn drawn_before(&self, k: usize, p: u64) -> u64 {
        let before = self.origin.drawn.get(k).copied().unwrap_or(0);
        let Some(rel) = p.checked_sub(self.origin.start) else {
            return before;
        };
        let (b, within) = (rel / self.block, rel % self.block);
        let whole = before + b * self.base[k] + self.extras_before(k, b);
        // The part of block b before p: its slots of source k that the
        // block's permutation puts at offsets below `within` (at most a
        // block's worth of steps).
        let quota = self.quota(b);
        let (first, last) = slot_range(&quota, k);
        let perm = self.block_permutation(b);
        whole
            + (0..within)
                .filter(|&o| (first..last).contains(&perm.at(o)))
                .count() as u64
    }

    /// The order of block `b`'s slots: a seeded shuffle, new per block.
    fn block_permutation(&self, b: u64) -> BlockOrder {
        let seed = crate::sampler::mix_seed(self.seed, self.origin.start);
        if !self.shuffle || self.block > TABLE_BLOCK {
            return BlockOrder::Feistel(Permutation::new(self.block, seed, b, self.shuffle));
        }
        // A small block is shuffled whole, once (Fisher-Yates on SplitMix64):
        // a few ns per slot where a Feistel lookup per position costs ~40.
        let mut table: SmallVec<[u32; 64]> = (0..self.block as u32).collect();
        let mut state = crate::sampler::mix_seed(seed, b);
        for i in (1..table.len()).rev() {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let r = crate::sampler::mix_seed(state, 0);
            // Multiply-shift: uniform enough for a shuffle, no division.
            let j = ((u128::from(r) * (i as u128 + 1)) >> 64) as usize;
            table.swap(i, j);
        }
        BlockOrder::Table(table)
    }

    /// What position `p` of the stream draws. Positions before the origin
    /// of a re-weighted mixture are drawn as the origin's first block.
    pub fn at(&self, p: u64) -> Draw {
        let rel = p.saturating_sub(self.origin.start);
        let block = self.block_state(rel / self.block);
        let (k, draw) = block.draw(rel % self.block);
        let pass = draw / self.sources[k].samples;
        let index = self
            .source_permutation(k, pass)
            .at(draw % self.sources[k].samples);
        Draw {
            source: k,
            index,
            pass,
        }
    }

    /// What every position of block `b` (from the origin) needs: where each
    /// source's slots start, its draws before the block, and the block's
    /// permutation.
    fn block_state(&self, b: u64) -> BlockState {
        let k = self.sources.len();
        let mut first = SmallVec::with_capacity(k + 1);
        let mut drawn = SmallVec::with_capacity(k);
        let mut at = 0;
        for s in 0..k {
            first.push(at);
            at += self.base[s] + u64::from(self.extra(s, b));
            drawn.push(self.origin.drawn[s] + b * self.base[s] + self.extras_before(s, b));
        }
        first.push(at);
        BlockState {
            first,
            drawn,
            perm: self.block_permutation(b),
        }
    }

    /// Source `k`'s permutation of its pass `pass`.
    fn source_permutation(&self, k: usize, pass: u64) -> Permutation {
        Permutation::new(
            self.sources[k].samples,
            crate::sampler::mix_seed(self.seed, k as u64 + 1),
            pass,
            self.shuffle,
        )
    }
}

/// Blocks of at most this many positions are shuffled as a table.
const TABLE_BLOCK: u64 = 1024;

/// The order of one block's slots.
#[derive(Debug, Clone)]
enum BlockOrder {
    /// A small block's whole shuffle: slot of each offset.
    Table(SmallVec<[u32; 64]>),
    /// A large block's: computed per offset.
    Feistel(Permutation),
}

impl BlockOrder {
    /// The slot at offset `o` of the block.
    fn at(&self, o: u64) -> u64 {
        match self {
            BlockOrder::Table(t) => t.get(o as usize).map_or(o, |&s| u64::from(s)),
            BlockOrder::Feistel(p) => p.at(o),
        }
    }
}

/// One block's layout, computed once for all its positions.
#[derive(Debug, Clone)]
struct BlockState {
    /// Slot where each source's run starts, and the block's end.
    first: SmallVec<[u64; 8]>,
    /// Each source's draws before the block.
    drawn: SmallVec<[u64; 8]>,
    perm: BlockOrder,
}

impl BlockState {
    /// The source and its draw number at offset `within` of the block.
    fn draw(&self, within: u64) -> (usize, u64) {
        let slot = self.perm.at(within);
        // The last source whose run starts at or before the slot: runs of
        // sources with no slot in this block are empty and passed over.
        let k = self.first.partition_point(|&f| f <= slot) - 1;
        (k, self.drawn[k] + (slot - self.first[k]))
    }
}

/// Draws many positions of a [`MixPlan`], keeping the state of the last
/// block and of each source's current pass: what a batch's reading uses
/// (a position costs a table lookup and its source's permutation, no
/// division, not a block's set-up).
#[derive(Debug)]
pub struct Drawer<'a> {
    plan: &'a MixPlan,
    /// The block last drawn from: its first stream position and state (a
    /// block never straddles two stages: they start on block boundaries).
    block: Option<(u64, BlockState)>,
    /// Per source, the pass last drawn, its first draw number and its
    /// permutation.
    passes: SmallVec<[Option<(u64, u64, Permutation)>; 4]>,
}

impl<'a> Drawer<'a> {
    /// A drawer over `plan` with nothing cached.
    pub fn new(plan: &'a MixPlan) -> Self {
        Self { plan, block: None, passes: smallvec::smallvec![None; plan.sources()] }
    }

    /// What position `p` draws: [`MixPlan::at`], from the cached state
    /// where it holds.
    pub fn at(&mut self, p: u64) -> Draw {
        // Every stage has the same sources (sizes, seeds) and block.
        let first = &self.plan.stages[0];
        let len = first.block;
        let (within, block) = match &mut self.block {
            Some((start, state)) if p >= *start && p - *start < len => (p - *start, state),
            slot => {
                let mixture = &self.plan.stages[self.plan.stage_of(p)];
                let rel = p.saturating_sub(mixture.origin.start);
                let b = rel / len;
                let start = mixture.origin.start + b * len;
                let (_, state) = slot.insert((start, mixture.block_state(b)));
                (rel % len, state)
            }
        };
        let (k, draw) = block.draw(within);
        let n = first.sources[k].samples;
        let (pass, offset, perm) = match &mut self.passes[k] {
            Some((pass, lo, perm)) if draw >= *lo && draw - *lo < n => (*pass, draw - *lo, &*perm),
            slot => {
                let pass = draw / n;
                let (pass, lo, perm) = slot.insert((pass, pass * n, first.source_permutation(k, pass)));
                (*pass, draw - *lo, &*perm)
            }
        };
        Draw { source: k, index: perm.at(offset), pass }
    }
}

/// Integer units of real weights (each a proportion of their sum): every
/// weight in millionths of the sum, rounded, reduced by their common
/// divisor (0.2 / 0.3 / 0.5 become 2 / 3 / 5). The same arithmetic in every
/// process, so every process draws the same stream.
pub fn weight_units(weights: &[f64]) -> Result<Vec<u64>, MixError> {
    if weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
        return Err(MixError::BadWeight);
    }
    let sum: f64 = weights.iter().sum();
    if !sum.is_finite() {
        return Err(MixError::HugeWeights);
    }
    if sum <= 0.0 {
        return Err(MixError::Empty);
    }
    let units: Vec<u64> = weights
        .iter()
        .map(|w| (w / sum * UNITS).round() as u64)
        .collect();
    if weights.iter().zip(&units).any(|(w, u)| *w > 0.0 && *u == 0) {
        return Err(MixError::TinyWeight);
    }
    let common = units.iter().fold(0, |g, &u| gcd(g, u)).max(1);
    Ok(units.into_iter().map(|u| u / common).collect())
}

/// Resolution of [`weight_units`]: millionths of the weights' sum.
const UNITS: f64 = 1e6;

/// A mixture whose weights changed along the stream (a job resumed with
/// new weights, a curriculum): one [`Mixture`] per stage, each continuing
/// every source's walk where the stage before left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixPlan {
    /// Stages in stream order; stage i holds from its origin on.
    stages: Vec<Mixture>,
}

impl MixPlan {
    /// The plan of sources of `sizes` drawn under `stages`: (first stream
    /// position, weights) in ascending positions, the first at 0, each
    /// later one at a multiple of `block`.
    pub fn new(
        sizes: &[u64],
        stages: &[(u64, Vec<f64>)],
        block: u64,
        seed: u64,
        shuffle: bool,
    ) -> Result<Self, MixError> {
        let mut out: Vec<Mixture> = Vec::with_capacity(stages.len());
        for (i, (start, weights)) in stages.iter().enumerate() {
            if weights.len() != sizes.len() {
                return Err(MixError::StageWeights {
                    stage: i,
                    weights: weights.len(),
                    sources: sizes.len(),
                });
            }
            let units = weight_units(weights)?;
            let next = match out.last() {
                None if *start != 0 => return Err(MixError::StageStart(i)),
                None => {
                    let sources: Vec<MixSource> = sizes
                        .iter()
                        .zip(&units)
                        .map(|(&samples, &weight)| MixSource { samples, weight })
                        .collect();
                    Mixture::new(&sources, block, seed, shuffle)?
                }
                Some(before) => {
                    if *start % block != 0 || *start <= before.origin.start {
                        return Err(MixError::StageStart(i));
                    }
                    before.reweighted(*start, &units)?
                }
            };
            out.push(next);
        }
        if out.is_empty() {
            return Err(MixError::Empty);
        }
        Ok(Self { stages: out })
    }

    /// What position `p` of the stream draws, under the stage it falls in.
    pub fn at(&self, p: u64) -> Draw {
        self.stages[self.stage_of(p)].at(p)
    }

    /// The stage position `p` falls in.
    fn stage_of(&self, p: u64) -> usize {
        self.stages
            .partition_point(|m| m.origin.start <= p)
            .saturating_sub(1)
    }

    /// Number of sources.
    pub fn sources(&self) -> usize {
        self.stages[0].sources()
    }
}

/// The slots `[first, last)` of source `k` in a block laid out source by
/// source with `quota`.
fn slot_range(quota: &[u64], k: usize) -> (u64, u64) {
    let first: u64 = quota[..k].iter().sum();
    (first, first + quota[k])
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `sum_{i < n} floor((a i + b) / m)` (AtCoder Library's floor_sum), in
/// O(log m): the count of a rotation's offsets in an interval.
fn floor_sum(n: u128, m: u128, mut a: u128, mut b: u128) -> u128 {
    let mut ans = 0u128;
    let (mut n, mut m) = (n, m);
    loop {
        if a >= m {
            ans += (n * n.saturating_sub(1) / 2) * div_rem(a, m).0;
            a = div_rem(a, m).1;
        }
        if b >= m {
            ans += n * div_rem(b, m).0;
            b = div_rem(b, m).1;
        }
        let y_max = a * n + b;
        if y_max < m {
            return ans;
        }
        (n, b) = div_rem(y_max, m);
        (m, a) = (a, m);
    }
}

/// `(x / y, x % y)`, in u64 when both fit (a u128 division is a slow
/// library call; the operands here almost always fit).
fn div_rem(x: u128, y: u128) -> (u128, u128) {
    match (u64::try_from(x), u64::try_from(y)) {
        (Ok(x), Ok(y)) => (u128::from(x / y), u128::from(x % y)),
        _ => (x / y, x % y),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sources(sizes: &[u64], weights: &[u64]) -> Vec<MixSource> {
        sizes
            .iter()
            .zip(weights)
            .map(|(&samples, &weight)| MixSource { samples, weight })
            .collect()
    }

    #[test]
    fn floor_sum_matches_the_sum() {
        for (n, m, a, b) in [
            (0u128, 7u128, 3u128, 2u128),
            (10, 7, 3, 2),
            (1000, 97, 55, 1001),
            (37, 1, 5, 0),
            (500, 1 << 20, 648_055, 12345),
        ] {
            let brute: u128 = (0..n).map(|i| (a * i + b) / m).sum();
            assert_eq!(floor_sum(n, m, a, b), brute, "n={n} m={m} a={a} b={b}");
        }
    }

    #[test]
    fn three_sources_of_very_different_sizes() {
        // The mixtures design's case: 1,000 / 10,000 / 100,000 samples at 0.2 / 0.3 /
        // 0.5, blocks of 64, over several passes of the small source.
        let mix = Mixture::new(
            &sources(&[1_000, 10_000, 100_000], &[2, 3, 5]),
            64,
            11,
            true,
        )
        .expect("mix");
        let blocks = 200u64; // 12,800 positions: 2,560 of the small source, 2.56 passes
        let mut per_pass: Vec<std::collections::BTreeMap<u64, Vec<u64>>> =
            vec![Default::default(); 3];
        for b in 0..blocks {
            let mut counts = [0u64; 3];
            for p in b * 64..(b + 1) * 64 {
                let d = mix.at(p);
                counts[d.source] += 1;
                per_pass[d.source].entry(d.pass).or_default().push(d.index);
            }
            for (k, w) in [2.0f64, 3.0, 5.0].iter().enumerate() {
                let target = w / 10.0 * 64.0;
                assert!(
                    (counts[k] as f64 - target).abs() < 1.0,
                    "block {b}: source {k} has {} for {target}",
                    counts[k]
                );
            }
        }
        // Every sample of a source once per pass; a finished pass is whole.
        for (k, passes) in per_pass.iter().enumerate() {
            let n = [1_000u64, 10_000, 100_000][k];
            for (pass, indices) in passes {
                let mut sorted = indices.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(
                    sorted.len(),
                    indices.len(),
                    "source {k} pass {pass}: a sample twice"
                );
                if (indices.len() as u64) == n {
                    assert_eq!(sorted, (0..n).collect::<Vec<_>>());
                }
            }
        }
        assert!(
            per_pass[0].len() >= 3,
            "the small source went through passes"
        );
    }

    #[test]
    fn the_default_epoch_ends_inside_the_global_batch_where_the_first_pass_ends() {
        // docs/mixtures.md, "The default epoch": 20,000 / 4,000 windows at
        // 0.7 / 0.3, global batch 64. The default epoch, ceil(20,000 /
        // 0.7) = 28,572 positions, is not a whole number of blocks, and a
        // block's draws are shuffled inside it: the block in which source
        // 0's first pass ends gives this epoch some draws of its second pass
        // and leaves some of its first to the next epoch. Measured here,
        // for several seeds: how many, and that it is only that one block.
        let (n0, block) = (20_000u64, 64u64);
        let epoch = (n0 * 10).div_ceil(7);
        assert_eq!(epoch, 28_572);
        let share = (7 * block).div_ceil(10); // most source-0 draws in one block: 45
        for seed in 0..8 {
            let mix = Mixture::new(&sources(&[n0, 4_000], &[7, 3]), block, seed, true).expect("mix");
            let mut first_pass = std::collections::BTreeSet::new();
            let mut next_pass = Vec::new();
            for p in 0..epoch {
                let d = mix.at(p);
                if d.source != 0 {
                    continue;
                }
                match d.pass {
                    0 => assert!(first_pass.insert(d.index), "seed {seed}: sample {} twice in one pass", d.index),
                    1 => next_pass.push((p, d.index)),
                    other => panic!("seed {seed}: pass {other} in the first epoch"),
                }
            }
            // What the next epoch still draws of the first pass.
            let left: Vec<u64> = (epoch..epoch + block)
                .map(|p| mix.at(p))
                .filter(|d| d.source == 0 && d.pass == 0)
                .map(|d| d.index)
                .collect();
            assert_eq!(first_pass.len() as u64 + left.len() as u64, n0, "seed {seed}: the first pass is whole by the end of that block");
            // How many of the straddling block's source-0 slots fall before
            // the epoch's end is the luck of its permutation: either side
            // holds at most the block's share.
            assert!(next_pass.len() as u64 <= share && left.len() as u64 <= share, "seed {seed}: {} drawn ahead, {} left behind", next_pass.len(), left.len());
            // All of it within the one block that straddles the epoch's end.
            let straddling = epoch / block * block;
            assert!(next_pass.iter().all(|&(p, _)| p >= straddling), "seed {seed}: {next_pass:?}");
            // Each next-pass draw repeats a sample this epoch drew once already.
            let repeats = next_pass.iter().filter(|(_, i)| first_pass.contains(i)).count();
            assert_eq!(repeats, next_pass.len());
            eprintln!("seed {seed}: {} distinct of {n0}, {} drawn twice (first and second pass), {} left to the next epoch", first_pass.len(), repeats, left.len());
        }
        // A whole share of the block (0.75 of 64 = 48) and n_k a multiple
        // of it: the pass ends on a block boundary, the epoch draws it once.
        let mix = Mixture::new(&sources(&[4_800, 1_000], &[3, 1]), block, 3, true).expect("mix");
        let epoch = (4_800u64 * 4).div_ceil(3);
        let mut drawn: Vec<u64> = (0..epoch).map(|p| mix.at(p)).filter(|d| d.source == 0).map(|d| {
            assert_eq!(d.pass, 0);
            d.index
        }).collect();
        drawn.sort_unstable();
        assert_eq!(drawn, (0..4_800).collect::<Vec<_>>());
    }

    #[test]
    fn blocks_are_not_one_fixed_interleave() {
        let mix = Mixture::new(&sources(&[100, 100], &[1, 1]), 16, 3, true).expect("mix");
        let pattern = |b: u64| {
            (b * 16..(b + 1) * 16)
                .map(|p| mix.at(p).source)
                .collect::<Vec<_>>()
        };
        assert_ne!(pattern(0), pattern(1));
        assert_ne!(pattern(1), pattern(2));
    }

    #[test]
    fn reweighting_continues_every_walk() {
        let mix = Mixture::new(&sources(&[50, 70, 90], &[1, 1, 1]), 12, 5, true).expect("mix");
        let at = 12 * 7;
        let next = mix.reweighted(at, &[1, 0, 4]).expect("reweighted");
        let mut seen: Vec<Vec<(u64, u64)>> = vec![Vec::new(); 3];
        for p in 0..at {
            let d = mix.at(p);
            seen[d.source].push((d.pass, d.index));
        }
        for p in at..at + 12 * 30 {
            let d = next.at(p);
            assert_ne!(d.source, 1, "a source of weight 0 is not drawn");
            seen[d.source].push((d.pass, d.index));
        }
        for (k, draws) in seen.iter().enumerate() {
            let mut sorted = draws.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(
                sorted.len(),
                draws.len(),
                "source {k}: a draw repeated across the re-weighting"
            );
            // The draws are the source's walk from its start, in order.
            let n = [50u64, 70, 90][k];
            let walk: Vec<(u64, u64)> = (0..draws.len() as u64)
                .map(|m| {
                    let perm =
                        Permutation::new(n, crate::sampler::mix_seed(5, k as u64 + 1), m / n, true);
                    (m / n, perm.at(m % n))
                })
                .collect();
            let mut walk_sorted = walk.clone();
            walk_sorted.sort_unstable();
            assert_eq!(sorted, walk_sorted, "source {k} continues its own walk");
        }
    }

    #[test]
    fn bad_mixtures_are_refused() {
        assert_eq!(Mixture::new(&[], 8, 0, true), Err(MixError::Empty));
        assert_eq!(
            Mixture::new(&sources(&[10], &[0]), 8, 0, true),
            Err(MixError::Empty)
        );
        assert_eq!(
            Mixture::new(&sources(&[10, 0], &[1, 1]), 8, 0, true),
            Err(MixError::EmptySource(1))
        );
        assert_eq!(
            Mixture::new(&sources(&[10], &[1]), 0, 0, true),
            Err(MixError::Block)
        );
        assert_eq!(
            Mixture::new(&sources(&[10, 10], &[u64::MAX, 2]), 8, 0, true),
            Err(MixError::Weights)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn the_drawer_draws_what_the_plan_names(
            sizes in proptest::collection::vec(1u64..200, 1..4),
            block in 1u64..40,
            seed: u64,
            positions in proptest::collection::vec(0u64..5_000, 1..200),
        ) {
            let k = sizes.len();
            let first: Vec<f64> = (0..k).map(|i| (i + 1) as f64).collect();
            let second: Vec<f64> = (0..k).map(|i| (k - i) as f64).collect();
            let plan = MixPlan::new(&sizes, &[(0, first), (block * 20, second)], block, seed, true).expect("plan");
            let mut drawer = Drawer::new(&plan);
            let mut sorted = positions.clone();
            sorted.sort_unstable();
            // In order (as a batch reads) and in any order, across stages.
            for p in sorted.into_iter().chain(positions) {
                prop_assert_eq!(drawer.at(p), plan.at(p), "position {}", p);
            }
        }

        #[test]
        fn every_block_is_within_one_and_the_walks_are_exact(
            sizes in proptest::collection::vec(1u64..300, 1..5),
            weights in proptest::collection::vec(0u64..50, 5),
            block in 1u64..70,
            seed: u64,
            far in 0u64..1_000_000_000,
        ) {
            let weights: Vec<u64> = weights[..sizes.len()].to_vec();
            prop_assume!(weights.iter().sum::<u64>() > 0);
            let mix = Mixture::new(&sources(&sizes, &weights), block, seed, true).expect("mix");
            let total: u64 = weights.iter().sum();
            let mut draws: Vec<Vec<(u64, u64)>> = vec![Vec::new(); sizes.len()];
            let blocks = 40u64;
            for b in (0..blocks).chain(far..far + 3) {
                let mut counts = vec![0u64; sizes.len()];
                for p in b * block..(b + 1) * block {
                    let d = mix.at(p);
                    prop_assert!(d.index < sizes[d.source]);
                    counts[d.source] += 1;
                    if b < blocks {
                        draws[d.source].push((d.pass, d.index));
                    }
                }
                for k in 0..sizes.len() {
                    let target = weights[k] as f64 * block as f64 / total as f64;
                    prop_assert!((counts[k] as f64 - target).abs() < 1.0, "block {}: source {} has {} for {}", b, k, counts[k], target);
                    prop_assert_eq!(counts[k], mix.quota(b)[k]);
                    // The closed form agrees with counting block by block.
                    if b < blocks {
                        let brute: u64 = (0..b).map(|x| mix.quota(x)[k]).sum();
                        prop_assert_eq!(mix.drawn_before(k, b * block), brute);
                    }
                }
            }
            // Each source walks its own permutation: no draw twice, every
            // sample once per pass.
            for (k, d) in draws.iter().enumerate() {
                let mut sorted = d.clone();
                sorted.sort_unstable();
                sorted.dedup();
                prop_assert_eq!(sorted.len(), d.len(), "source {} drew a sample twice in a pass", k);
            }
        }

        #[test]
        fn over_d_blocks_each_source_gets_exactly_its_share(
            weights in proptest::collection::vec(1u64..12, 2..4),
            block in 1u64..20,
            seed: u64,
        ) {
            let sizes = vec![1000u64; weights.len()];
            let mix = Mixture::new(&sources(&sizes, &weights), block, seed, true).expect("mix");
            let d: u64 = weights.iter().sum();
            for (k, &w) in weights.iter().enumerate() {
                prop_assert_eq!(mix.drawn_before(k, d * block), w * block, "source {}", k);
                prop_assert_eq!(mix.drawn_before(k, 3 * d * block), 3 * w * block);
            }
        }
    }
}
