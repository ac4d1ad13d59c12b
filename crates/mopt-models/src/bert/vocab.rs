//! Vocabulary pruning of BERT: the word table keeps the rows of the tokens a corpus uses; the
//! tokenizer is unchanged and every id it gives goes through `mopt_vocab_map` (a dropped token
//! reads `[UNK]`'s row). Position and token-type tables are untouched.

use burn::module::Param;
use burn::prelude::*;
use mopt_data::VocabPrunable;

use super::{BertConfig, BertForSequenceClassification};

impl VocabPrunable for BertForSequenceClassification {
    fn input_vocab(c: &BertConfig) -> usize {
        c.input_vocab()
    }

    fn table_rows(c: &BertConfig) -> usize {
        c.vocab_size
    }

    fn vocab_pruned(c: &BertConfig) -> bool {
        c.mopt_vocab_map.is_some()
    }

    fn with_vocab_map(c: &BertConfig, map: Vec<u32>) -> BertConfig {
        BertConfig {
            vocab_size: map.iter().max().map_or(0, |&r| r as usize + 1),
            mopt_vocab_map: Some(map),
            ..c.clone()
        }
    }

    fn keep_vocab(mut self, c: &BertConfig, keep: &[u32], map: Vec<u32>) -> (Self, BertConfig) {
        let e = &mut self.bert.embeddings;
        let table = e.word_embeddings.weight.val();
        let rows: Vec<i64> = keep.iter().map(|&id| id as i64).collect();
        let rows =
            Tensor::<1, Int>::from_data(TensorData::new(rows, [keep.len()]), &table.device());
        e.word_embeddings.weight = Param::from_tensor(table.select(0, rows));
        let config = Self::with_vocab_map(c, map);
        e.vocab_map = super::model::id_rows(&config);
        (self, config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mopt_data::vocab::vocab_map;

    fn logits(m: &BertForSequenceClassification, ids: Vec<i64>, dev: &Device) -> Vec<f32> {
        let n = ids.len();
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, n]), dev);
        m.forward(ids, Tensor::ones([1, n], dev), Tensor::zeros([1, n], dev))
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap()
    }

    #[test]
    fn kept_tokens_read_their_rows_and_dropped_ones_read_unk() {
        let dev = Device::flex();
        dev.seed(3);
        let mut c = BertConfig::tiny(200, 2);
        c.hidden_dropout_prob = 0.0;
        c.attention_probs_dropout_prob = 0.0;
        let full = BertForSequenceClassification::new(&c, &dev);
        // [UNK] = 100, [CLS] = 101, [SEP] = 102; the corpus used 5, 17 and 150.
        let keep = [5, 17, 100, 101, 102, 150];
        let map = vocab_map(200, &keep, 100);
        let (pruned, pc) = full.clone().keep_vocab(&c, &keep, map);
        assert_eq!((pc.vocab_size, pc.input_vocab()), (6, 200));
        assert_eq!(
            pruned.bert.embeddings.word_embeddings.weight.dims(),
            [6, 32]
        );
        // Kept ids: identical logits.
        let kept = vec![101, 5, 150, 17, 102];
        assert_eq!(
            logits(&pruned, kept.clone(), &dev),
            logits(&full, kept, &dev)
        );
        // A dropped id (42) is the full model reading [UNK] there, not the full model's own
        // row for it.
        let dropped = logits(&pruned, vec![101, 5, 42, 102], &dev);
        assert_eq!(dropped, logits(&full, vec![101, 5, 100, 102], &dev));
        assert_ne!(dropped, logits(&full, vec![101, 5, 42, 102], &dev));
    }
}
