//! TinyBERT's data augmentation on a BERT distill stage (`augment-copies`): copies of the
//! training sentences with whole words replaced by their neighbours in the teacher's
//! word-embedding table ([`mopt_distill::text::augment`]), labelled by the teacher's cached logits.

use std::time::Instant;

use mopt_core::Tapped;
use mopt_data::{Encoded, TextSplit, TextTokenizer};
use mopt_distill::text::augment::{augment, neighbours, Replacements, TextAugment, WordTable};
use mopt_distill::text::task::TeacherSource;
use mopt_models::bert::{BertConfig, BertForSequenceClassification as Model};
use mopt_stages::kinds::distill::DistillStage;
use mopt_stages::StageError;

/// The training split with its copies, and what the report says about them.
pub struct Augmented {
    /// The originals, then their copies.
    pub examples: Vec<Encoded>,
    /// How many originals lead the list.
    pub originals: usize,
    /// How they were drawn.
    pub spec: TextAugment,
    /// Distinct words of the training split that can be replaced.
    pub words: usize,
    /// Seconds spent finding neighbours and drawing copies.
    pub seconds: f64,
}

/// The copies the stage asks for (`None` without `augment-copies`), from the teacher's table.
pub fn copies(
    stage: &DistillStage,
    (teacher, teacher_config): (&Model, &BertConfig),
    originals: &[Encoded],
    tokenizer: &TextTokenizer,
    seed: u64,
) -> Result<Option<Augmented>, StageError> {
    let Some(spec) = stage.augment else {
        return Ok(None);
    };
    if teacher_config.mopt_vocab_map.is_some() {
        return Err(stage
            .scope
            .err(
                "augment-copies",
                "the teacher's vocabulary was pruned: its table's rows are not token ids",
                "distil from the teacher before vocabulary pruning, or remove the augment-* keys",
            )
            .into());
    }
    let start = Instant::now();
    let rows = teacher
        .word_embeddings()
        .ok_or_else(|| StageError::Unsupported("the teacher has no word-embedding table".into()))?
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .map_err(|e| StageError::Unsupported(format!("the teacher's word table: {e:?}")))?;
    let words = vocabulary(tokenizer, teacher_config.vocab_size);
    let mut queries: Vec<u32> = originals
        .iter()
        .flat_map(|e| e.ids.iter().copied())
        .filter(|&id| words.replaceable.get(id as usize) == Some(&true))
        .collect();
    queries.sort_unstable();
    queries.dedup();
    let table = WordTable {
        rows: &rows,
        hidden: teacher_config.hidden_size,
    };
    let replacements = Replacements {
        neighbours: neighbours(&table, &queries, &words.candidates, spec.neighbours),
        continuation: words.continuation,
    };
    let examples = augment(originals, &replacements, &spec, seed);
    let seconds = start.elapsed().as_secs_f64();
    eprintln!(
        "augmentation: {} copies of {} sentences ({} distinct replaceable words; {seconds:.1}s)",
        examples.len() - originals.len(),
        originals.len(),
        queries.len()
    );
    Ok(Some(Augmented {
        examples,
        originals: originals.len(),
        spec,
        words: queries.len(),
        seconds,
    }))
}

/// Which vocabulary entries are words (replaceable, and replacements) and which continue one.
struct Vocabulary {
    replaceable: Vec<bool>,
    candidates: Vec<u32>,
    continuation: Vec<bool>,
}

/// Words: two or more letters, not a special token, not a `##` continuation piece (numbers and
/// punctuation stay as they are).
fn vocabulary(tokenizer: &TextTokenizer, size: usize) -> Vocabulary {
    let special = tokenizer.special_ids();
    let mut v = Vocabulary {
        replaceable: vec![false; size],
        candidates: Vec::new(),
        continuation: vec![false; size],
    };
    for id in 0..size as u32 {
        let Some(token) = tokenizer.token(id) else {
            continue;
        };
        if token.starts_with("##") {
            v.continuation[id as usize] = true;
        } else if token.chars().count() >= 2
            && token.chars().all(char::is_alphabetic)
            && !special.contains(&id)
        {
            v.replaceable[id as usize] = true;
            v.candidates.push(id);
        }
    }
    v
}

/// The student's training split: the copies relabelled by the teacher (`source`), and the
/// report's line on them (what was drawn, how often the teacher's label of a copy differs from
/// its sentence's).
pub fn labelled(
    mut a: Augmented,
    source: &TeacherSource<Model>,
    pad_id: u32,
) -> (TextSplit, String) {
    let flipped = relabel(&mut a, source);
    let spec = a.spec;
    let copies = a.examples.len() - a.originals;
    let note = format!(
        "Augmentation (TinyBERT): {copies} copies of the {} training sentences ({} each), each word replaced with probability {} by one of its {} nearest words in the teacher's table ({} distinct words replaceable; {:.1} s); the teacher labels the copies: {flipped} ({:.1}%) get another class than their sentence. The twin trains on the originals repeated {}x (the same steps).",
        a.originals,
        spec.copies,
        spec.replace,
        spec.neighbours,
        a.words,
        a.seconds,
        100.0 * flipped as f64 / copies.max(1) as f64,
        1 + spec.copies
    );
    let split = TextSplit {
        examples: a.examples,
        pad_id,
    };
    (split, note)
}

/// Give every copy the teacher's top class as its hard label (the cached logits, row by row);
/// returns how many copies the teacher labels otherwise than their original.
fn relabel(a: &mut Augmented, source: &TeacherSource<Model>) -> usize {
    let TeacherSource::Cache(cache) = source else {
        return 0;
    };
    let (n, per) = (a.originals, a.spec.copies);
    let mut flipped = 0;
    for i in n..a.examples.len() {
        let logits = cache.logits(i);
        let top = (0..logits.len())
            .max_by(|&x, &y| logits[x].total_cmp(&logits[y]).then(y.cmp(&x)))
            .unwrap_or(0);
        let original = a.examples[(i - n) / per].label;
        flipped += usize::from(top != original);
        a.examples[i].label = top;
    }
    flipped
}
