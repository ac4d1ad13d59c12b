//! TinyBERT's task-specific data augmentation for text distillation: copies of every training
//! sentence with whole words replaced by their nearest neighbours in the teacher's word-embedding
//! table (cosine), drawn reproducibly from the run's seed. The teacher labels the copies (its
//! cached outputs; a copy's hard label is the teacher's top class), so the student learns the
//! teacher's function on inputs the labelled set never shows.
//!
//! Jiao et al. 2020 (TinyBERT) replace single-piece words by the teacher's masked-LM predictions
//! and other words by GloVe neighbours; a classification teacher has no masked-LM head, so every
//! replacement here comes from the teacher's own table (the distance its inputs live in).

use std::collections::BTreeMap;

use mopt_data::Encoded;
use mopt_data::SplitMix64;

/// How copies are drawn (`augment-copies`, `augment-replace`, `augment-neighbours`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TextAugment {
    /// Copies a sentence (TinyBERT: 20).
    pub copies: usize,
    /// Probability that a whole word is replaced (TinyBERT: 0.4).
    pub replace: f64,
    /// Neighbours a replacement is drawn from, uniformly (TinyBERT: 15).
    pub neighbours: usize,
}

impl Default for TextAugment {
    /// TinyBERT's replacement settings with 4 copies.
    fn default() -> Self {
        Self {
            copies: 4,
            replace: 0.4,
            neighbours: 15,
        }
    }
}

/// The word-embedding table of a teacher, `[vocab, hidden]` row-major.
pub struct WordTable<'a> {
    /// The rows.
    pub rows: &'a [f32],
    /// Row width.
    pub hidden: usize,
}

/// The `k` nearest rows (cosine) of every id of `queries` among the `candidates` (each query
/// excluded from its own list), ties broken by the lower id. Dot products run in a fixed
/// order of eight f32 lanes without fused multiply-adds, so every x86 CPU gets the same
/// neighbours (the augmented data, and with it the run, stay bit-reproducible).
pub fn neighbours(
    table: &WordTable<'_>,
    queries: &[u32],
    candidates: &[u32],
    k: usize,
) -> BTreeMap<u32, Vec<u32>> {
    use rayon::prelude::*;
    let h = table.hidden;
    let unit = |id: u32| -> Vec<f32> {
        let r = &table.rows[id as usize * h..(id as usize + 1) * h];
        let norm = dot(r, r).sqrt().max(1e-12);
        r.iter().map(|x| x / norm).collect()
    };
    let cands: Vec<Vec<f32>> = candidates.par_iter().map(|&c| unit(c)).collect();
    queries
        .par_iter()
        .map(|&q| {
            let u = unit(q);
            let mut scored: Vec<(f32, u32)> = candidates
                .iter()
                .zip(&cands)
                .filter(|(&c, _)| c != q)
                .map(|(&c, v)| (dot(&u, v), c))
                .collect();
            let by = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
            let k = k.min(scored.len());
            if k < scored.len() {
                scored.select_nth_unstable_by(k, by);
                scored.truncate(k);
            }
            scored.sort_by(by);
            (q, scored.into_iter().map(|(_, c)| c).collect())
        })
        .collect()
}

/// `a · b` in a fixed order: eight partial sums, then their sum.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    for (j, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[j] += x * y;
    }
    acc.iter().sum()
}

/// Which token ids are whole words that may be replaced, and with which neighbours.
pub struct Replacements {
    /// Neighbours of each replaceable id.
    pub neighbours: BTreeMap<u32, Vec<u32>>,
    /// Ids that continue a word (`##ing`): a token followed by one is part of a longer word and
    /// stays.
    pub continuation: Vec<bool>,
}

/// `spec.copies` copies of every example of `originals`, after them in order (copy `j` of
/// sentence `i` at `originals.len() + i * copies + j`), each whole word with neighbours replaced
/// with probability `spec.replace` by one of them, uniformly. A copy's draws depend only on
/// `seed`, `i` and `j`. Labels are the originals'; the caller relabels the copies.
pub fn augment(
    originals: &[Encoded],
    words: &Replacements,
    spec: &TextAugment,
    seed: u64,
) -> Vec<Encoded> {
    let mut out = originals.to_vec();
    out.reserve(originals.len() * spec.copies);
    let threshold = (spec.replace * (1u64 << 53) as f64) as u64;
    for (i, e) in originals.iter().enumerate() {
        for j in 0..spec.copies {
            let key = ((i * spec.copies + j) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut rng = SplitMix64::new(seed ^ 0x7469_6e79_6265_7274 ^ key);
            let mut ids = e.ids.clone();
            for t in 0..ids.len() {
                let next_continues = ids
                    .get(t + 1)
                    .is_some_and(|&n| words.continuation.get(n as usize) == Some(&true));
                let Some(list) = words.neighbours.get(&e.ids[t]) else {
                    continue;
                };
                // One draw a replaceable position whatever happens, so that a copy's later
                // positions do not depend on earlier outcomes' side effects.
                let roll = rng.next_u64() >> 11;
                let pick = rng.next_u64();
                if next_continues || list.is_empty() || roll >= threshold {
                    continue;
                }
                ids[t] = list[(pick % list.len() as u64) as usize];
            }
            out.push(Encoded {
                ids,
                label: e.label,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<f32> {
        // 6 ids x 2: 1 and 2 close, 3 and 4 close, 5 far from all.
        vec![0.0, 0.0, 1.0, 0.0, 0.9, 0.1, 0.0, 1.0, 0.1, 0.9, -1.0, -1.0]
    }

    #[test]
    fn nearest_rows_by_cosine_without_the_query() {
        let rows = table();
        let t = WordTable {
            rows: &rows,
            hidden: 2,
        };
        let n = neighbours(&t, &[1, 3], &[1, 2, 3, 4, 5], 2);
        assert_eq!(n[&1], vec![2, 4]);
        assert_eq!(n[&3], vec![4, 2]);
    }

    fn words() -> Replacements {
        let mut neighbours = BTreeMap::new();
        neighbours.insert(1, vec![2]);
        neighbours.insert(3, vec![4]);
        Replacements {
            neighbours,
            continuation: vec![false, false, false, false, false, true],
        }
    }

    #[test]
    fn copies_follow_the_originals_and_replace_only_whole_words() {
        let originals = vec![
            Encoded {
                ids: vec![0, 1, 3, 9],
                label: 1,
            },
            Encoded {
                ids: vec![0, 1, 5, 3, 9],
                label: 0,
            },
        ];
        let spec = TextAugment {
            copies: 3,
            replace: 1.0,
            neighbours: 1,
        };
        let out = augment(&originals, &words(), &spec, 7);
        assert_eq!(out.len(), 2 + 2 * 3);
        assert_eq!(out[..2], originals[..]);
        for c in &out[2..5] {
            assert_eq!(c.ids, vec![0, 2, 4, 9]);
            assert_eq!(c.label, 1);
        }
        // Id 1 is followed by the continuation piece 5: part of a longer word, kept.
        for c in &out[5..] {
            assert_eq!(c.ids, vec![0, 1, 5, 4, 9]);
        }
    }

    #[test]
    fn draws_depend_on_the_seed_only() {
        let originals: Vec<Encoded> = (0..50)
            .map(|i| Encoded {
                ids: vec![0, 1, 3, 1, 3, 1, 3, 9],
                label: i % 2,
            })
            .collect();
        let spec = TextAugment {
            copies: 2,
            replace: 0.5,
            neighbours: 1,
        };
        let a = augment(&originals, &words(), &spec, 7);
        assert_eq!(a, augment(&originals, &words(), &spec, 7));
        let b = augment(&originals, &words(), &spec, 8);
        assert_ne!(a, b);
        let replaced: usize = a[50..]
            .iter()
            .map(|c| c.ids.iter().filter(|&&x| x == 2 || x == 4).count())
            .sum();
        // 100 copies x 6 replaceable words at 0.5: 300 expected.
        assert!((240..360).contains(&replaced), "{replaced}");
    }
}
