//! The UCI "Optical Recognition of Handwritten Digits" test set (E. Alpaydin, C. Kaynak;
//! CC BY 4.0): 1797 images of 8×8 pixels with values 0..=16, and their labels 0..=9. The file is
//! embedded in the binary, so nothing is read from disk at run time.

use ferrofx_core::{Error, Result, Tensor};
use flate2::read::GzDecoder;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::io::Read;

static DIGITS_CSV_GZ: &[u8] = include_bytes!("../../data/digits.csv.gz");

/// Number of images in the data set.
pub const NUM_SAMPLES: usize = 1797;
/// Pixels per image (8×8).
pub const NUM_PIXELS: usize = 64;
/// Number of classes.
pub const NUM_CLASSES: usize = 10;

/// One split of the digits data: images as `[n, 1, 8, 8]` f32 scaled to `[0, 1]` (pixel / 16)
/// and labels as `[n]` i64.
#[derive(Debug, Clone)]
pub struct Split {
    /// `[n, 1, 8, 8]` f32 in `[0, 1]`.
    pub images: Tensor,
    /// `[n]` i64 in `0..10`.
    pub labels: Tensor,
}

impl Split {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.shape()[0]
    }
    /// `true` when there is no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The digits data set, parsed from the embedded file.
///
/// ```
/// let d = ferrofx_nn::datasets::Digits::load().unwrap();
/// let (train, test) = d.split(0.2, 0).unwrap();
/// assert_eq!(train.len() + test.len(), 1797);
/// assert_eq!(test.images.shape(), &[360, 1, 8, 8]);
/// ```
#[derive(Debug, Clone)]
pub struct Digits {
    pixels: Vec<f32>,
    labels: Vec<i64>,
}

impl Digits {
    /// Decompresses and parses the embedded CSV (64 pixel columns, then the label).
    pub fn load() -> Result<Digits> {
        let mut text = String::new();
        GzDecoder::new(DIGITS_CSV_GZ)
            .read_to_string(&mut text)
            .map_err(|e| Error::io("digits", format!("cannot decompress the embedded data: {e}")))?;
        Digits::parse(&text)
    }

    /// Parses CSV text in the digits layout (for tests and for other copies of the data).
    pub fn parse(text: &str) -> Result<Digits> {
        let mut pixels = Vec::with_capacity(NUM_SAMPLES * NUM_PIXELS);
        let mut labels = Vec::with_capacity(NUM_SAMPLES);
        for (ln, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let fields: Vec<&str> = line.trim().split(',').collect();
            if fields.len() != NUM_PIXELS + 1 {
                return Err(Error::io(
                    "digits",
                    format!(
                        "line {}: expected {} comma-separated values, found {}",
                        ln + 1,
                        NUM_PIXELS + 1,
                        fields.len()
                    ),
                ));
            }
            for (i, f) in fields.iter().enumerate() {
                let v: i64 = f.trim().parse().map_err(|_| {
                    Error::io("digits", format!("line {}, column {}: '{f}' is not an integer", ln + 1, i + 1))
                })?;
                if i < NUM_PIXELS {
                    if !(0..=16).contains(&v) {
                        return Err(Error::io("digits", format!("line {}: pixel {v} outside 0..=16", ln + 1)));
                    }
                    pixels.push(v as f32 / 16.0);
                } else {
                    if !(0..NUM_CLASSES as i64).contains(&v) {
                        return Err(Error::io("digits", format!("line {}: label {v} outside 0..=9", ln + 1)));
                    }
                    labels.push(v);
                }
            }
        }
        Ok(Digits { pixels, labels })
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// `true` when empty.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// All samples as one split.
    pub fn all(&self) -> Result<Split> {
        self.subset(&(0..self.len()).collect::<Vec<_>>())
    }

    /// The samples at `indices`.
    pub fn subset(&self, indices: &[usize]) -> Result<Split> {
        let mut px = Vec::with_capacity(indices.len() * NUM_PIXELS);
        let mut lb = Vec::with_capacity(indices.len());
        for &i in indices {
            if i >= self.len() {
                return Err(Error::index(
                    "digits",
                    format!("sample index {i} out of range for {} samples", self.len()),
                ));
            }
            px.extend_from_slice(&self.pixels[i * NUM_PIXELS..(i + 1) * NUM_PIXELS]);
            lb.push(self.labels[i]);
        }
        Ok(Split {
            images: Tensor::from_vec(px, &[indices.len(), 1, 8, 8])?,
            labels: Tensor::from_vec(lb, &[indices.len()])?,
        })
    }

    /// A deterministic shuffled train/test split: the same `seed` always gives the same split.
    pub fn split(&self, test_fraction: f64, seed: u64) -> Result<(Split, Split)> {
        if !(0.0..1.0).contains(&test_fraction) {
            return Err(Error::argument("digits", format!("test_fraction must be in [0, 1), got {test_fraction}")));
        }
        let mut idx: Vec<usize> = (0..self.len()).collect();
        idx.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
        let n_test = (self.len() as f64 * test_fraction).ceil() as usize; // as scikit-learn
        let (test, train) = idx.split_at(n_test);
        Ok((self.subset(train)?, self.subset(test)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_data_is_complete_and_balanced() {
        let d = Digits::load().unwrap();
        assert_eq!(d.len(), NUM_SAMPLES);
        let mut counts = [0usize; 10];
        for &l in &d.labels {
            counts[l as usize] += 1;
        }
        // The UCI test set has between 174 and 183 samples per class.
        assert!(counts.iter().all(|&c| (174..=183).contains(&c)), "{counts:?}");
    }

    #[test]
    fn split_is_deterministic_and_disjoint() {
        let d = Digits::load().unwrap();
        let (a_train, a_test) = d.split(0.2, 7).unwrap();
        let (b_train, b_test) = d.split(0.2, 7).unwrap();
        assert_eq!(a_test.labels.to_vec::<i64>().unwrap(), b_test.labels.to_vec::<i64>().unwrap());
        assert_eq!(a_train.len(), 1437);
        assert_eq!(b_train.len(), 1437);
        let (_, c_test) = d.split(0.2, 8).unwrap();
        assert_ne!(a_test.labels.to_vec::<i64>().unwrap(), c_test.labels.to_vec::<i64>().unwrap());
    }

    #[test]
    fn parse_rejects_bad_rows() {
        let e = Digits::parse("1,2,3\n").unwrap_err();
        assert!(e.to_string().contains("line 1: expected 65 comma-separated values, found 3"), "{e}");
        let mut row = vec!["0"; 64];
        row.push("12");
        let e = Digits::parse(&row.join(",")).unwrap_err();
        assert!(e.to_string().contains("label 12 outside 0..=9"), "{e}");
    }
}
