//! `DistributedSampler`: each rank's share of a data set's indices (PyTorch's
//! `torch.utils.data.DistributedSampler`).
//!
//! The indices (shuffled with `seed + epoch` when asked) are padded by repeating the first ones
//! to a multiple of the rank count (or, with `drop_last`, the tail is dropped), then rank `r`
//! takes every `world`-th index starting at `r`. Every rank gets the same number of samples,
//! and together the ranks cover the data set. The permutation comes from ferrofx's generator,
//! so it differs from PyTorch's `randperm` for the same seed.
//!
//! ```
//! use ferrofx_dist::DistributedSampler;
//! let s0 = DistributedSampler::new(10, 3, 0).shuffle(false);
//! assert_eq!(s0.indices(0), vec![0, 3, 6, 9]);
//! let s2 = DistributedSampler::new(10, 3, 2).shuffle(false);
//! assert_eq!(s2.indices(0), vec![2, 5, 8, 1]); // padded with index 1
//! ```

/// Each rank's share of the indices `0..len`. See the module docs.
#[derive(Debug, Clone)]
pub struct DistributedSampler {
    len: usize,
    world: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
}

impl DistributedSampler {
    /// The share of rank `rank` among `world` ranks of a data set of `len` samples (shuffled,
    /// seed 0, padded: PyTorch's defaults). `world` is at least 1 and `rank` is taken modulo it.
    pub fn new(len: usize, world: usize, rank: usize) -> DistributedSampler {
        let world = world.max(1);
        DistributedSampler { len, world, rank: rank % world, shuffle: true, seed: 0, drop_last: false }
    }

    /// Shuffle each epoch (with `seed + epoch`).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// The shuffling seed; every rank must use the same one.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Drop the tail that does not divide evenly instead of padding.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Samples per rank.
    pub fn num_samples(&self) -> usize {
        if self.drop_last && !self.len.is_multiple_of(self.world) {
            (self.len - self.len % self.world) / self.world
        } else {
            self.len.div_ceil(self.world)
        }
    }

    /// This rank's indices for `epoch`.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            // Fisher-Yates with a SplitMix64 stream seeded by seed + epoch: the same on every
            // rank
            let mut state = self.seed.wrapping_add(epoch);
            let mut next = || {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            };
            for i in (1..all.len()).rev() {
                let j = (next() % (i as u64 + 1)) as usize;
                all.swap(i, j);
            }
        }
        let total = self.num_samples() * self.world;
        if total > all.len() && !all.is_empty() {
            let pad: Vec<usize> = all.iter().copied().cycle().take(total - all.len()).collect();
            all.extend(pad);
        } else {
            all.truncate(total);
        }
        all.into_iter().skip(self.rank).step_by(self.world).collect()
    }
}
