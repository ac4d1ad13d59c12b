//! The vocabulary-prunable contract: a model reading token ids through an embedding table keeps
//! only the rows of the tokens a corpus uses (TextPruner's vocabulary pruning). The tokenizer is
//! unchanged: the model maps every id it reads to its row in the smaller table, and an id whose
//! row was dropped to `[UNK]`'s row, so any text still tokenizes and classifies.

use mopt_core::Checkpoint;

/// A model whose token-embedding table can lose rows.
pub trait VocabPrunable: Checkpoint {
    /// Token ids the model reads: the tokenizer's vocabulary (the original table's rows).
    fn input_vocab(config: &Self::Config) -> usize;

    /// Rows of the token-embedding table now.
    fn table_rows(config: &Self::Config) -> usize;

    /// Whether the table was pruned already (a second pruning is refused).
    fn vocab_pruned(config: &Self::Config) -> bool;

    /// The config of the model keeping the rows `map` sends ids to ([`vocab_map`]).
    fn with_vocab_map(config: &Self::Config, map: Vec<u32>) -> Self::Config;

    /// The model with only the rows `keep` (sorted input ids) and ids read through `map`
    /// ([`vocab_map`]), and its config.
    fn keep_vocab(self, config: &Self::Config, keep: &[u32], map: Vec<u32>)
        -> (Self, Self::Config);
}

/// The row of every input id `0..input_vocab` in a table keeping the rows `keep` (sorted,
/// unique, containing `unk`): a kept id's rank in `keep`, any other id `unk`'s rank.
pub fn vocab_map(input_vocab: usize, keep: &[u32], unk: u32) -> Vec<u32> {
    debug_assert!(keep.windows(2).all(|w| w[0] < w[1]), "keep is sorted");
    let unk_row = keep.binary_search(&unk).expect("[UNK] is kept") as u32;
    let mut map = vec![unk_row; input_vocab];
    for (row, &id) in keep.iter().enumerate() {
        map[id as usize] = row as u32;
    }
    map
}

/// The ids of `corpus` seen at least `min_count` times, with `always` (special tokens), sorted;
/// ids at or above `input_vocab` are ignored.
pub fn kept_ids<'a>(
    corpus: impl IntoIterator<Item = &'a [u32]>,
    input_vocab: usize,
    min_count: usize,
    always: &[u32],
) -> Vec<u32> {
    let mut counts = vec![0usize; input_vocab];
    for ids in corpus {
        for &id in ids {
            if let Some(c) = counts.get_mut(id as usize) {
                *c += 1;
            }
        }
    }
    for &id in always {
        if let Some(c) = counts.get_mut(id as usize) {
            *c = usize::MAX;
        }
    }
    (0..input_vocab as u32)
        .filter(|&id| counts[id as usize] >= min_count)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_ids_count_the_corpus_and_map_the_rest_to_unk() {
        let corpus: [&[u32]; 3] = [&[2, 7, 7, 9], &[7, 3], &[12, 9]];
        // Vocabulary of 10: 12 is out of range; 1 is [UNK], always kept.
        assert_eq!(kept_ids(corpus, 10, 1, &[1]), [1, 2, 3, 7, 9]);
        assert_eq!(kept_ids(corpus, 10, 2, &[1]), [1, 7, 9]);
        let map = vocab_map(10, &[1, 2, 3, 7, 9], 1);
        assert_eq!(map, [0, 0, 1, 2, 0, 0, 0, 3, 0, 4]);
    }
}
