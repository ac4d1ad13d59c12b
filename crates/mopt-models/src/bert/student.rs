//! Students initialised from a BERT teacher's layers (DistilBERT-style): the teacher's
//! embeddings, the listed encoder layers, its pooler and classifier.

use super::{BertConfig, BertForSequenceClassification};

/// Why a student cannot be initialised from the chosen teacher layers.
pub fn check_layer_init(
    student: &BertConfig,
    teacher: &BertConfig,
    layers: &[usize],
) -> Result<(), String> {
    if layers.len() != student.num_hidden_layers {
        return Err(format!(
            "{} teacher layers listed for a student of {} layers",
            layers.len(),
            student.num_hidden_layers
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (j, &i) in layers.iter().enumerate() {
        if i >= teacher.num_hidden_layers {
            return Err(format!(
                "teacher layer {i} does not exist (the teacher has {} layers, 0-based)",
                teacher.num_hidden_layers
            ));
        }
        if !seen.insert(i) {
            return Err(format!("teacher layer {i} is listed twice"));
        }
        if student.heads(j) != teacher.heads(i) || student.ffn(j) != teacher.ffn(i) {
            return Err(format!(
                "student layer {j} ({} heads, FFN {}) cannot take teacher layer {i} ({} heads, FFN {})",
                student.heads(j),
                student.ffn(j),
                teacher.heads(i),
                teacher.ffn(i)
            ));
        }
    }
    if student.hidden_size != teacher.hidden_size || student.head_size() != teacher.head_size() {
        return Err(format!(
            "student hidden size {} differs from the teacher's {}",
            student.hidden_size, teacher.hidden_size
        ));
    }
    if student.num_labels != teacher.num_labels {
        return Err("student and teacher have different label counts".into());
    }
    Ok(())
}

/// A student made of the teacher's embeddings, the listed encoder layers (0-based), pooler and
/// classifier (DistilBERT-style initialisation), computing what the student's `config` says
/// beyond the weights: its FFN's GELU (`hidden_act`) and its dropout. Call [`check_layer_init`]
/// first.
pub fn from_teacher_layers(
    teacher: &BertForSequenceClassification,
    layers: &[usize],
    config: &BertConfig,
) -> BertForSequenceClassification {
    let mut student = teacher.clone();
    student.bert.encoder.layer = layers
        .iter()
        .map(|&i| teacher.bert.encoder.layer[i].clone())
        .collect();
    // A config that passed `check` names a known GELU.
    let act = config.gelu_kind().unwrap_or_default();
    let (hidden, attention) = (
        config.hidden_dropout_prob,
        config.attention_probs_dropout_prob,
    );
    student.bert.embeddings.dropout.prob = hidden;
    for l in &mut student.bert.encoder.layer {
        l.intermediate.act = act;
        l.attention.self_attn.dropout.prob = attention;
        l.attention.output.dropout.prob = hidden;
        l.output.dropout.prob = hidden;
    }
    student
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::prelude::*;

    #[test]
    fn layer_init_copies_chosen_layers_and_checks_shapes() {
        let mut t = BertConfig::tiny(50, 2);
        t.num_hidden_layers = 3;
        let d = Device::flex();
        let teacher = BertForSequenceClassification::new(&t, &d);
        let mut s = t.clone();
        s.num_hidden_layers = 2;
        check_layer_init(&s, &t, &[0, 2]).unwrap();
        let student = from_teacher_layers(&teacher, &[0, 2], &s);
        assert_eq!(student.bert.encoder.layer.len(), 2);
        let a: Vec<f32> = student.bert.encoder.layer[1]
            .intermediate
            .dense
            .weight
            .val()
            .into_data()
            .try_to_vec()
            .unwrap();
        let b: Vec<f32> = teacher.bert.encoder.layer[2]
            .intermediate
            .dense
            .weight
            .val()
            .into_data()
            .try_to_vec()
            .unwrap();
        assert_eq!(a, b);
        assert!(check_layer_init(&s, &t, &[0, 3])
            .unwrap_err()
            .contains("does not exist"));
        assert!(check_layer_init(&s, &t, &[1, 1])
            .unwrap_err()
            .contains("twice"));
        assert!(check_layer_init(&s, &t, &[0])
            .unwrap_err()
            .contains("1 teacher layers"));
        // The student's own activation and dropout, not the teacher's, in every copied layer
        // (the copies once kept the teacher's exact GELU under a `gelu_new` student config).
        let mut tanh = s.clone();
        tanh.hidden_act = "gelu_new".into();
        tanh.hidden_dropout_prob = 0.25;
        tanh.attention_probs_dropout_prob = 0.05;
        let student = from_teacher_layers(&teacher, &[0, 2], &tanh);
        assert_eq!(student.bert.embeddings.dropout.prob, 0.25);
        for l in &student.bert.encoder.layer {
            assert_eq!(l.intermediate.act, mopt_kernels::GeluKind::Tanh);
            assert_eq!(l.attention.self_attn.dropout.prob, 0.05);
            assert_eq!(l.attention.output.dropout.prob, 0.25);
            assert_eq!(l.output.dropout.prob, 0.25);
        }
        assert_eq!(
            teacher.bert.encoder.layer[0].intermediate.act,
            mopt_kernels::GeluKind::Erf
        );
        s.hidden_size = 16;
        s.num_attention_heads = 2;
        assert!(check_layer_init(&s, &t, &[0, 1]).is_err());
    }
}
