//! A Llama scores continuations ([`CanScore`]): the pair encoded as lm-evaluation-harness
//! encodes it (the context's trailing spaces moved to the continuation; the continuation's
//! tokens are those of `context + continuation` past the context's own tokens; an empty context
//! reads the end-of-text token), a document's choices right-padded into one batch (a causal
//! model's positions never read the padding after them), the head applied to the continuation's
//! positions only.

use std::path::Path;

use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use mopt_gguf::GgufTokenizer;
use mopt_models::llama::LlamaForCausalLM as Model;
use mopt_stages::zero_shot::{CanScore, Scored, Scorer};
use mopt_stages::StageError;

use crate::llama::gguf_error;

/// Loads a Llama checkpoint folder (its `tokenizer.gguf`) or a GGUF file to score with.
pub struct LlamaScore;

impl CanScore for LlamaScore {
    fn scorer(&self, source: &Path) -> Result<Box<dyn Scorer>, StageError> {
        let device = Device::flex();
        let (model, config, tok) = crate::llama::load_source(source, &device)?;
        Ok(Box::new(LlamaScorer {
            model,
            tok,
            context: config.max_position_embeddings,
            device,
        }))
    }
}

/// A loaded Llama and its tokenizer.
pub struct LlamaScorer {
    model: Model,
    tok: GgufTokenizer,
    /// The model's context: longer inputs keep their last positions.
    context: usize,
    device: Device,
}

/// One request's input ids and its continuation's ids (the last ones of the input plus one).
struct Row {
    input: Vec<u32>,
    continuation: Vec<u32>,
}

/// lm-eval's encoding of a pair for a model of `context` positions: the input ids and the
/// continuation's ids.
fn encode(
    tok: &GgufTokenizer,
    window: usize,
    (context, continuation): (&str, &str),
) -> Result<Row, StageError> {
    let spaces = context.len() - context.trim_end_matches(' ').len();
    let (context, moved) = context.split_at(context.len() - spaces);
    let continuation = format!("{moved}{continuation}");
    let encode = |t: &str| tok.encode(t).map_err(gguf_error);
    let (mut ctx, cont) = match context.is_empty() {
        true => (Vec::new(), encode(&continuation)?),
        false => {
            let whole = encode(&format!("{context}{continuation}"))?;
            let ctx = encode(context)?;
            let cont = whole.get(ctx.len()..).unwrap_or_default().to_vec();
            (ctx, cont)
        }
    };
    if ctx.is_empty() {
        let eot = tok.eos_id().ok_or_else(|| {
            StageError::Unsupported(
                "an empty context reads the tokenizer's end-of-text token, and this GGUF names none"
                    .into(),
            )
        })?;
        ctx.push(eot);
    }
    if cont.is_empty() {
        return Err(StageError::Unsupported(format!(
            "the continuation {continuation:?} encodes to no token of its own after {context:?}"
        )));
    }
    let mut input = [ctx, cont.clone()].concat();
    input.pop();
    let keep = input.len().min(window);
    if cont.len() > keep {
        return Err(StageError::Unsupported(format!(
            "the continuation {continuation:?} is {} tokens, longer than the model's context of {window}",
            cont.len()
        )));
    }
    Ok(Row {
        input: input[input.len() - keep..].to_vec(),
        continuation: cont,
    })
}

/// The summed log-probability of each row's continuation, the rows right-padded into one batch.
fn score_rows(model: &Model, rows: &[Row], device: &Device) -> Result<Vec<Scored>, StageError> {
    let len = rows.iter().map(|r| r.input.len()).max().unwrap_or(1);
    let mut ids = Vec::with_capacity(rows.len() * len);
    for r in rows {
        ids.extend(r.input.iter().map(|&i| i64::from(i)));
        ids.extend(std::iter::repeat_n(0i64, len - r.input.len()));
    }
    let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [rows.len(), len]), device);
    let hidden = model.model.forward(ids, None);
    let d = hidden.dims()[2];
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            let (n, k) = (r.input.len(), r.continuation.len());
            // Position p predicts input token p + 1: the continuation's come from the last k.
            let h = hidden.clone().slice([i..i + 1, n - k..n, 0..d]);
            let logp = log_softmax(model.head(h), 2);
            let v: Vec<f32> = logp
                .into_data()
                .convert::<f32>()
                .try_to_vec::<f32>()
                .map_err(|e| {
                    StageError::Unsupported(format!("log-probabilities unreadable: {e:?}"))
                })?;
            let vocab = v.len() / k;
            let logprob = r
                .continuation
                .iter()
                .enumerate()
                .map(|(j, &t)| f64::from(v[j * vocab + t as usize]))
                .sum();
            Ok(Scored { logprob, tokens: k })
        })
        .collect()
}

impl Scorer for LlamaScorer {
    fn score(&self, requests: &[(&str, &str)]) -> Result<Vec<Scored>, StageError> {
        let rows = requests
            .iter()
            .map(|&pair| encode(&self.tok, self.context, pair))
            .collect::<Result<Vec<_>, _>>()?;
        score_rows(&self.model, &rows, &self.device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mopt_gguf::Gguf;
    use mopt_models::llama::LlamaConfig;

    /// The batched score, the head on the continuation's positions only, equals the full
    /// forward's log-softmax of each row alone; the padding after a short row changes nothing.
    #[test]
    fn batched_scores_equal_the_full_forward_of_each_row() {
        let device = Device::flex();
        let c = LlamaConfig::tiny(40);
        let model = Model::new(&c, &device);
        let rows = vec![
            Row {
                input: vec![3, 7, 9, 2],
                continuation: vec![9, 2, 5],
            },
            Row {
                input: vec![1, 4],
                continuation: vec![4, 8],
            },
        ];
        let full = |r: &Row| -> f64 {
            let ids: Vec<i64> = r.input.iter().map(|&i| i64::from(i)).collect();
            let t = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, r.input.len()]), &device);
            let lp: Vec<f32> = log_softmax(model.forward(t), 2)
                .into_data()
                .try_to_vec::<f32>()
                .unwrap();
            let (n, k) = (r.input.len(), r.continuation.len());
            r.continuation
                .iter()
                .enumerate()
                .map(|(j, &tok)| f64::from(lp[(n - k + j) * 40 + tok as usize]))
                .sum()
        };
        let got = score_rows(&model, &rows, &device).unwrap();
        for (r, g) in rows.iter().zip(&got) {
            assert!(
                (full(r) - g.logprob).abs() < 1e-4,
                "{} vs {}",
                full(r),
                g.logprob
            );
            assert_eq!(g.tokens, r.continuation.len());
        }
        let alone = score_rows(&model, &rows[1..], &device).unwrap();
        assert!((alone[0].logprob - got[1].logprob).abs() < 1e-4);
    }

    /// lm-eval's pair encoding with SmolLM2's tokenizer (the GGUF `datasets/fetch.sh --small`
    /// fetches).
    #[test]
    fn pairs_encode_as_lm_eval_encodes_them() {
        let gguf = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../datasets/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
        let tok = GgufTokenizer::from_gguf(&Gguf::open(&gguf).unwrap()).unwrap();
        let text = |ids: &[u32]| tok.decode(ids).unwrap();
        let r = encode(
            &tok,
            64,
            ("Question: Which is newest?\nAnswer:", " cellular telephone"),
        )
        .unwrap();
        assert_eq!(text(&r.continuation), " cellular telephone");
        let ctx = tok.encode("Question: Which is newest?\nAnswer:").unwrap();
        assert_eq!(r.input[..ctx.len()], ctx[..]);
        assert_eq!(r.input.len() + 1, ctx.len() + r.continuation.len());
        // A context's trailing space moves to the continuation.
        let r = encode(&tok, 64, ("Answer: ", "yes")).unwrap();
        assert_eq!(text(&r.continuation), " yes");
        // An empty context reads the end-of-text token.
        let r = encode(&tok, 64, ("", "Hello")).unwrap();
        assert_eq!(r.input[0], tok.eos_id().unwrap());
        // A long input keeps its last positions; a continuation longer than the context is named.
        let long = "word ".repeat(100);
        let r = encode(&tok, 16, (&long, " end")).unwrap();
        assert_eq!(r.input.len(), 16);
        let e = encode(&tok, 2, ("a", &" end".repeat(5)))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("longer than the model's context of 2"), "{e}");
    }
}
