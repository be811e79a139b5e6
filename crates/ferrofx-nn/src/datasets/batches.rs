//! Mini-batch iteration over a [`Split`](super::Split), optionally shuffled per epoch.

use super::Split;
use ferrofx_core::{Result, Tensor};
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// An iterator of `(images, labels)` mini-batches.
///
/// ```
/// use ferrofx_nn::datasets::{Batches, Digits};
/// let (train, _) = Digits::load().unwrap().split(0.2, 0).unwrap();
/// let batches: Vec<_> = Batches::new(&train, 512, Some(1)).collect::<Result<_, _>>().unwrap();
/// assert_eq!(batches.len(), 3); // 1437 = 512 + 512 + 413
/// assert_eq!(batches[2].0.shape(), &[413, 1, 8, 8]);
/// ```
pub struct Batches {
    images: Vec<f32>,
    labels: Vec<i64>,
    order: Vec<usize>,
    pos: usize,
    batch_size: usize,
    sample_shape: Vec<usize>,
}

impl Batches {
    /// Batches of `batch_size` (at least 1) over `split`, shuffled with `shuffle_seed` if given.
    pub fn new(split: &Split, batch_size: usize, shuffle_seed: Option<u64>) -> Self {
        let images = split.images.to_vec::<f32>().unwrap_or_default();
        let labels = split.labels.to_vec::<i64>().unwrap_or_default();
        let mut order: Vec<usize> = (0..labels.len()).collect();
        if let Some(seed) = shuffle_seed {
            order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
        }
        let sample_shape = split.images.shape()[1..].to_vec();
        Batches { images, labels, order, pos: 0, batch_size: batch_size.max(1), sample_shape }
    }
}

impl Iterator for Batches {
    type Item = Result<(Tensor, Tensor)>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.order.len() {
            return None;
        }
        let end = (self.pos + self.batch_size).min(self.order.len());
        let per: usize = self.sample_shape.iter().product();
        let mut x = Vec::with_capacity((end - self.pos) * per);
        let mut y = Vec::with_capacity(end - self.pos);
        for &i in &self.order[self.pos..end] {
            x.extend_from_slice(&self.images[i * per..(i + 1) * per]);
            y.push(self.labels[i]);
        }
        let n = end - self.pos;
        self.pos = end;
        let mut shape = vec![n];
        shape.extend_from_slice(&self.sample_shape);
        Some(Tensor::from_vec(x, &shape).and_then(|x| Ok((x, Tensor::from_vec(y, &[n])?))))
    }
}
