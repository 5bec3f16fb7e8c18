//! The random numbers of the image pipeline: a pure function of
//! (seed, epoch, sample index, step index), so a sample gets the same pixels
//! on any worker, with any worker count, in any run, whichever order the
//! samples are produced in.
//!
//! Each random step owns a generator seeded by mixing the four numbers with
//! splitmix64's finalizer, one after the other (a chain, so that swapping two
//! of them changes the result); it then draws a splitmix64 sequence. Steps
//! never share a stream, so adding or removing one random step leaves the
//! draws of the others as they were.

use crate::dataset::SampleKey;

/// splitmix64's increment: the golden ratio in 64-bit fixed point.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output function (Stafford's Mix13): a bijection of u64 in
/// which every input bit flips about half of the output bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The generator of one step of one sample.
#[derive(Debug, Clone)]
pub(crate) struct StepRng {
    /// splitmix64 state: advanced by [`GAMMA`] per draw.
    state: u64,
}

impl StepRng {
    /// The stream of step `step` for the sample `key`.
    pub(crate) fn new(key: SampleKey, step: usize) -> StepRng {
        let mut s = mix(key.seed.wrapping_add(GAMMA));
        for v in [key.epoch, key.index, step as u64] {
            s = mix(s ^ v.wrapping_add(GAMMA));
        }
        StepRng { state: s }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix(self.state)
    }

    /// Uniform in [0, 1), 53 random bits.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub(crate) fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform integer in [0, n], inclusive (Lemire's multiply-shift; the
    /// bias for the image sizes drawn here is below 2^-40).
    pub(crate) fn up_to(&mut self, n: u32) -> u32 {
        ((u128::from(self.next_u64()) * (u128::from(n) + 1)) >> 64) as u32
    }
}
