//! Random crops and flips of training images (`[data.augment]`), drawn afresh for every batch
//! and reproducible: a batch's draws depend only on the seed and the batch's indices, so a live
//! teacher that batches the same indices again sees the same images as the student, and a rerun
//! with the same seed trains on the same ones.

use crate::image::ImageShape;
use crate::rng::SplitMix64;

/// Augmentation of the training images (`[data.augment]`), drawn afresh for every batch:
/// nothing by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Augment {
    /// Zero-pad each side by this many pixels and crop back to the image's size at a random
    /// offset (the CIFAR recipe's "pad 4, crop 32"); 0: no cropping.
    #[serde(default)]
    pub crop: usize,
    /// Mirror left-right with probability ½.
    #[serde(default)]
    pub flip: bool,
}

impl Augment {
    /// Whether any augmentation is on.
    pub fn is_on(&self) -> bool {
        self.crop > 0 || self.flip
    }
}

/// An [`Augment`] with its seed and the value a zero grey pixel normalises to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Augmentation {
    /// What to draw.
    pub spec: Augment,
    /// Seed of the draws (the run's).
    pub seed: u64,
    /// The padding's value: a black pixel, normalised (`(0 − mean) / std`).
    pub fill: f32,
}

impl Augmentation {
    /// The generator of a batch of `indices` (its draws for every image, in order).
    pub fn batch_rng(&self, indices: &[usize]) -> SplitMix64 {
        let mut h = SplitMix64::new(self.seed ^ 0x6175_676d_656e_7421);
        let mut key = h.next_u64();
        for &i in indices {
            key = SplitMix64::new(key ^ i as u64).next_u64();
        }
        SplitMix64::new(key)
    }

    /// Append image `img` (`[channels, side, side]`), cropped and flipped with the next draws of
    /// `rng`, to `out`.
    pub fn apply(&self, img: &[f32], shape: ImageShape, rng: &mut SplitMix64, out: &mut Vec<f32>) {
        let (side, p) = (shape.side, self.spec.crop);
        // Offsets into the padded image: 0..=2p each way (p: the image where it was).
        let (dy, dx) = if p > 0 {
            (rng.below(2 * p + 1), rng.below(2 * p + 1))
        } else {
            (0, 0)
        };
        let flip = self.spec.flip && rng.next_u64() >> 63 == 1;
        for plane in img.chunks_exact(side * side) {
            for y in 0..side {
                let sy = (y + dy).checked_sub(p).filter(|&v| v < side);
                for x in 0..side {
                    let x = if flip { side - 1 - x } else { x };
                    let sx = (x + dx).checked_sub(p).filter(|&v| v < side);
                    out.push(match (sy, sx) {
                        (Some(sy), Some(sx)) => plane[sy * side + sx],
                        _ => self.fill,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(side: usize) -> ImageShape {
        ImageShape { channels: 2, side }
    }

    fn aug(crop: usize, flip: bool) -> Augmentation {
        Augmentation {
            spec: Augment { crop, flip },
            seed: 7,
            fill: -9.0,
        }
    }

    /// Every output is an input pixel moved by one offset (the same for both channels) and
    /// mirrored or not, or the fill: checked against the definition for many draws, which
    /// between them cover every offset and both flips.
    #[test]
    fn crops_and_flips_are_shifts_and_mirrors_of_the_image() {
        let (s, p) = (5usize, 2usize);
        let img: Vec<f32> = (0..2 * s * s).map(|v| v as f32).collect();
        let a = aug(p, true);
        let mut seen = std::collections::HashSet::new();
        for b in 0..200usize {
            let mut rng = a.batch_rng(&[b, b + 1]);
            let mut out = Vec::new();
            a.apply(&img, shape(s), &mut rng, &mut out);
            assert_eq!(out.len(), img.len());
            // Find the (dy, dx, flip) that explains the output.
            let explains = |dy: usize, dx: usize, flip: bool| {
                (0..2).all(|c| {
                    (0..s).all(|y| {
                        (0..s).all(|x| {
                            let xs = if flip { s - 1 - x } else { x };
                            let (sy, sx) = (y + dy, xs + dx);
                            let want = if sy >= p && sy - p < s && sx >= p && sx - p < s {
                                img[c * s * s + (sy - p) * s + sx - p]
                            } else {
                                -9.0
                            };
                            out[c * s * s + y * s + x] == want
                        })
                    })
                })
            };
            let hit = (0..=2 * p)
                .flat_map(|dy| (0..=2 * p).flat_map(move |dx| [(dy, dx, false), (dy, dx, true)]))
                .find(|&(dy, dx, f)| explains(dy, dx, f))
                .expect("a shift and mirror of the image");
            seen.insert(hit);
        }
        assert!(
            seen.len() > 40,
            "draws cover the 50 crops and flips: {}",
            seen.len()
        );
        assert!(
            seen.contains(&(p, p, false)),
            "the image itself is one of them"
        );
    }

    /// Off is the identity; the same indices give the same images, other indices others.
    #[test]
    fn off_is_the_identity_and_draws_depend_only_on_seed_and_indices() {
        let img: Vec<f32> = (0..2 * 36).map(|v| v as f32).collect();
        let mut out = Vec::new();
        let off = aug(0, false);
        off.apply(&img, shape(6), &mut off.batch_rng(&[1]), &mut out);
        assert_eq!(out, img);
        let a = aug(2, true);
        let run = |a: &Augmentation, idx: &[usize]| {
            let mut rng = a.batch_rng(idx);
            let mut out = Vec::new();
            for _ in idx {
                a.apply(&img, shape(6), &mut rng, &mut out);
            }
            out
        };
        assert_eq!(run(&a, &[3, 4, 5]), run(&a, &[3, 4, 5]));
        assert_ne!(run(&a, &[3, 4, 5]), run(&a, &[4, 3, 5]));
        let other = Augmentation { seed: 8, ..a };
        assert_ne!(run(&a, &[3, 4, 5]), run(&other, &[3, 4, 5]));
    }
}
