//! Distillation end to end through the real binary, the teacher cache, and the recipe errors.

mod common;

use std::path::{Path, PathBuf};

use burn::prelude::*;
use common::{mopt, read_json, stderr, write_tiny_recipe};
use mopt_data::LabelMap;
use mopt_data::{Batcher, Encoded};
use mopt_distill::matching::{MatchPlan, TeacherNeeds};
use mopt_distill::spec::DistillSpec;
use mopt_distill::text::pipeline::{teacher_source, with_word_table, TeacherOutputs};
use mopt_distill::text::task::ExtraTerm;
use mopt_distill::text::task::{DistillTask, TeacherSource};
use mopt_distill::DistillModel;
use mopt_families::bert::distill::init_student;
use mopt_models::bert::{weights, BertConfig, BertForSequenceClassification};
use mopt_stages::kinds::distill::DistillStage;
use mopt_train::trainer::Task;
use std::sync::Arc;

/// A tiny teacher recipe (2 layers) plus a distillation recipe (teacher -> distill stage) whose
/// student takes teacher layer 1. `distill_extra` goes at the end of the stage (matches),
/// `student_model` under `[stage.student]`.
fn write_pair(dir: &Path, distill_extra: &str, student_model: &str) -> PathBuf {
    let teacher = write_tiny_recipe(dir, "teacher", "");
    std::fs::rename(&teacher, dir.join("teacher.toml")).unwrap();
    let base = std::fs::read_to_string(dir.join("teacher.toml")).unwrap();
    let cfg = dir.join("tiny-config.json");
    let model = format!("[model]\nconfig = \"{}\"\n", cfg.display());
    assert!(base.contains(&model));
    let body = base
        .replace("name = \"teacher\"", "name = \"student\"")
        .replace(&model, "");
    let student = student_model.replace("[model.overrides]", "[stage.student.overrides]");
    let text = format!(
        "{body}\n[teacher]\ncheckpoint = \"runs/teacher/best\"\nrecipe = \"teacher.toml\"\n\n[evaluation]\nlatency-warmup = 1\nlatency-runs = 3\nlatency-seq-len = 16\n\n[[stage]]\nkind = \"distill\"\nalpha = 0.5\ntemperature = 2.0\nbaseline = true\n\n[stage.student]\nconfig = \"{}\"\n{student}\n{distill_extra}\n",
        cfg.display()
    );
    let p = dir.join("distill.toml");
    std::fs::write(&p, text).unwrap();
    p
}

const LAYER_INIT: &str = "init-from-teacher-layers = [1]\n[model.overrides]\nnum-hidden-layers = 1";

const MATCHES: &str = r#"
[[stage.match]]
feature = "hidden"
layers = "uniform"

[[stage.match]]
feature = "attention"
layers = [[1, 2]]
"#;

#[test]
fn tiny_distillation_trains_teacher_then_student_and_reuses_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_pair(tmp.path(), MATCHES, LAYER_INIT);
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = tmp.path().join("runs/student");
    let r = read_json(&run.join("report.json"));
    let (teacher, student) = (&r["stages"][0], &r["stages"][1]);
    assert!(
        teacher["decision"]["reason"]
            .as_str()
            .unwrap()
            .contains("fine-tuned in this run"),
        "{teacher}"
    );
    assert!(tmp.path().join("runs/teacher/best/model.bpk").is_file());
    assert_eq!(student["facts"]["teacher_cache"]["hit"], false);
    assert_eq!(student["facts"]["teacher_cache"]["teacher_forwards"], 96);
    assert_eq!(student["model"]["layers"], 1);
    assert_eq!(teacher["model"]["layers"], 2);
    assert!(student["model"]["params"].as_u64() < teacher["model"]["params"].as_u64());
    let (sv, tv) = (
        student["model"]["valid"]["accuracy"].as_f64().unwrap(),
        teacher["model"]["valid"]["accuracy"].as_f64().unwrap(),
    );
    assert!((student["delta_valid_vs_baseline"].as_f64().unwrap() - (sv - tv)).abs() < 1e-9);
    let twin = &student["references"][0];
    assert!(twin["name"].as_str().unwrap().contains("twin"), "{student}");
    assert!(twin["model"]["test"]["accuracy"].is_number());
    assert_eq!(student["model"]["latency"].as_array().unwrap().len(), 2);
    assert_eq!(student["model"]["latency"][1]["batch"], 32);
    assert!(run.join("01-distill/twin/best/model.bpk").is_file());
    let md = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(
        md.contains("hard-label twin") && md.contains("| 1 | distill | distill | kept |"),
        "{md}"
    );
    // A twin copied from the teacher's layers is called what it is, next to its difference.
    assert!(
        md.contains("both start from the teacher's own layers"),
        "{md}"
    );
    // Every loss component is logged on its own.
    let metrics = std::fs::read_to_string(run.join("01-distill/metrics.jsonl")).unwrap();
    let train: serde_json::Value = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["split"] == "train")
        .unwrap();
    for k in [
        "ce",
        "soft",
        "alpha",
        "temperature",
        "hidden_mse_0",
        "attention_kl_1",
    ] {
        assert!(train[k].is_number(), "train line lacks {k}: {train}");
    }
    assert_eq!(train["temperature"], 2.0);
    // The student checkpoint holds no projection: it reloads as a plain classifier.
    let (student, cfg) =
        mopt_models::bert::weights::load_checkpoint(&run.join("best"), &Device::flex()).unwrap();
    assert_eq!(cfg.num_hidden_layers, 1);
    assert_eq!(student.bert.encoder.layer.len(), 1);

    // Second run: the teacher is reused and the cache is read back: no teacher forwards.
    let again = mopt(&[recipe.to_str().unwrap(), "--force"]);
    assert!(again.status.success(), "{}", stderr(&again));
    let r2 = read_json(&run.join("report.json"));
    assert!(
        !r2["stages"][0]["decision"]["reason"]
            .as_str()
            .unwrap()
            .contains("fine-tuned in this run"),
        "{}",
        r2["stages"][0]
    );
    assert_eq!(r2["stages"][1]["facts"]["teacher_cache"]["hit"], true);
    assert_eq!(
        r2["stages"][1]["facts"]["teacher_cache"]["teacher_forwards"],
        0
    );
    assert_eq!(
        r2["stages"][1]["model"]["test"], r["stages"][1]["model"]["test"],
        "same seed, same cached teacher: same result"
    );

    // Other data: the cache is invalidated.
    let text = std::fs::read_to_string(&recipe)
        .unwrap()
        .replace("max-train = 96", "max-train = 80");
    std::fs::write(&recipe, text).unwrap();
    let third = mopt(&[recipe.to_str().unwrap(), "--force", "--max-steps", "2"]);
    assert!(third.status.success(), "{}", stderr(&third));
    let r3 = read_json(&run.join("report.json"));
    assert_eq!(r3["stages"][1]["facts"]["teacher_cache"]["hit"], false);
    assert_eq!(
        r3["stages"][1]["facts"]["teacher_cache"]["teacher_forwards"],
        80
    );
}

#[test]
fn cached_and_live_teachers_give_the_same_objective_and_projections_get_gradients() {
    let tmp = tempfile::tempdir().unwrap();
    // A narrower student (hidden 16) so the hidden match needs a projection.
    let student = "[model.overrides]\nnum-hidden-layers = 1\nhidden-size = 16\nnum-attention-heads = 2\nintermediate-size = 32";
    // The [CLS]-only match is on in epoch 1 only (TinyBERT-style two stages).
    let matches = "[[stage.match]]\nfeature = \"hidden\"\nlayers = [[1, 2]]\nprojection = true\n\n[[stage.match]]\nfeature = \"attention-scores\"\nlayers = [[1, 1]]\nheads = \"mean\"\n\n[[stage.match]]\nfeature = \"hidden\"\ntokens = \"cls\"\nlayers = [[1, 2]]\nprojection = true\nuntil-epoch = 1\n\n[[stage.match]]\nfeature = \"word-embeddings\"\nprojection = true\nrows = 64\nweight = 0.5\n";
    let recipe_path = write_pair(tmp.path(), matches, student);
    // Train the teacher through the binary (the distillation itself is driven from Rust here).
    let teacher = mopt(&[tmp.path().join("teacher.toml").to_str().unwrap()]);
    assert!(teacher.status.success(), "{}", stderr(&teacher));
    let recipe = mopt_recipe::load(&recipe_path).unwrap();
    let stage = DistillStage::from_entry(&recipe.stages[0]).unwrap();
    let device = Device::flex();
    let ad = device.clone().autodiff();
    let t = recipe.teacher.as_ref().unwrap();
    let (teacher, teacher_config) = weights::load_checkpoint(&t.checkpoint, &device).unwrap();
    let labels = LabelMap::load(&t.checkpoint.join("labels.json")).unwrap();
    let registry = mopt_families::builtin();
    let format = registry.data_format(&recipe).unwrap();
    let prepared = mopt_stages::data::text::prepare(format, &recipe, Some(labels)).unwrap();
    let (config, plan) = mopt_families::bert::distill::student_config(
        &stage,
        &teacher_config,
        &prepared.data.labels,
        &mopt_stages::data::text::tokenizer(&recipe).unwrap(),
        prepared.tokenizer.vocab_size(),
    )
    .unwrap();
    assert_eq!(plan.projections, vec![(16, 32), (16, 32), (16, 32)]);
    let model = DistillModel::new(
        init_student(&stage.student, 7, &config, &t.checkpoint, &ad).unwrap(),
        &plan.projections,
        &ad,
    );
    let outputs = TeacherOutputs {
        teacher_dir: &t.checkpoint,
        teacher: &teacher,
        data: &recipe.data,
        train: &prepared.data.train,
        pad_id: 0,
        batch_size: 32,
    };
    let (cached, summary) = teacher_source(&outputs, &stage.spec, &plan, &device).unwrap();
    assert!(summary.enabled && !summary.hit);
    let live = TeacherSource::Live {
        teacher: Box::new(teacher.clone()),
        examples: prepared.data.train.clone(),
        batcher: Batcher::new(0),
        device: device.clone(),
    };
    let indices = [3usize, 17, 40, 41, 90];
    let items: Vec<&Encoded> = indices.iter().map(|&i| &prepared.data.train[i]).collect();
    let batch = Batcher::new(0).batch(&items, &ad);
    let mut a = with_word_table(
        DistillTask::new(stage.spec.clone(), plan.clone(), cached, &ad),
        &plan,
        &teacher,
        &ad,
    );
    let b = with_word_table(
        DistillTask::new(stage.spec.clone(), plan.clone(), live, &ad),
        &plan,
        &teacher,
        &ad,
    );
    // Dropout off, so both forward passes of the student are identical and only the teacher's
    // source differs (gradients still flow: the module stays on the autodiff device).
    let quiet = {
        let mut m = model;
        m.student.dropout.prob = 0.0;
        for l in m.student.bert.encoder.layer.iter_mut() {
            l.attention.self_attn.dropout.prob = 0.0;
            l.attention.output.dropout.prob = 0.0;
            l.output.dropout.prob = 0.0;
        }
        m.student.bert.embeddings.dropout.prob = 0.0;
        m
    };
    let (la, pa) = a.objective(&quiet, &batch, &indices, 0.3);
    let (lb, pb) = b.objective(&quiet, &batch, &indices, 0.3);
    let (va, vb): (f32, f32) = (la.clone().into_scalar(), lb.into_scalar());
    assert!(
        (va - vb).abs() < 1e-4 * va.abs().max(1.0),
        "cached {va} vs live {vb}: {pa:?} / {pb:?}"
    );
    for ((na, xa), (nb, xb)) in pa.iter().zip(&pb) {
        assert_eq!(na, nb);
        assert!(
            (xa - xb).abs() < 1e-4 * xa.abs().max(1.0),
            "{na}: cached {xa} vs live {xb}"
        );
    }
    // The learned projection receives gradients from the hidden-state match.
    let grads = la.backward();
    let g = quiet.projections[0]
        .weight
        .val()
        .grad(&grads)
        .expect("projection gradient");
    let norm: f32 = g.powf_scalar(2.0).sum().into_scalar();
    assert!(norm > 0.0, "projection gradient is zero");
    let names: Vec<&str> = pa.iter().map(|(n, _)| *n).collect();
    assert!(names.contains(&"hidden_cls_mse_2"), "{names:?}");
    // The vocabulary-wide table match trains the student's word embeddings and its projection.
    for g in [
        quiet.projections[2].weight.val().grad(&grads),
        quiet
            .student
            .bert
            .embeddings
            .word_embeddings
            .weight
            .val()
            .grad(&grads),
    ] {
        let norm: f32 = g.expect("gradient").powf_scalar(2.0).sum().into_scalar();
        assert!(norm > 0.0, "word-embedding match gradient is zero");
    }
    let word = pa
        .iter()
        .find(|(n, _)| *n == "word_embeddings_mse_3")
        .map(|(_, v)| *v)
        .expect("word-embedding match logged");
    // A random table through a random projection (whose bias alone is ~7x the teacher's rows
    // here) is far from the teacher's: well above 0, finite.
    assert!(word.is_finite() && word > 0.5, "{word}");

    // Epoch 2: the [CLS] match is over; the other two stay, and the loss is their sum plus the
    // logit terms.
    a.begin_epoch(2);
    let (l2, p2) = a.objective(&quiet, &batch, &indices, 0.6);
    let get = |n: &str| p2.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
    assert_eq!(get("hidden_cls_mse_2"), None, "{p2:?}");
    let (ce, soft, alpha) = (
        get("ce").unwrap(),
        get("soft").unwrap(),
        get("alpha").unwrap(),
    );
    let want = alpha * ce
        + (1.0 - alpha) * soft
        + get("hidden_mse_0").unwrap()
        + get("attention_scores_mse_1").unwrap()
        + get("word_embeddings_mse_3").unwrap();
    let got: f32 = l2.into_scalar();
    assert!(
        (got as f64 - want).abs() < 1e-4 * want.max(1.0),
        "{got} vs {want}"
    );
}

#[test]
fn distillation_recipe_errors_are_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, &str, &[&str])> =
        vec![
        (
            "[[stage.match]]\nfeature = \"hidden\"\nlayers = [[5, 1]]",
            LAYER_INIT,
            &["stage[1].match.layers", "out of range"],
        ),
        (
            "[[stage.match]]\nfeature = \"hidden\"\nlayers = \"uniform\"",
            "[model.overrides]\nnum-hidden-layers = 1\nhidden-size = 16\nnum-attention-heads = 2",
            &[
                "stage[1].match.projection",
                "width 16 differs from teacher width 32",
                "projection = true",
            ],
        ),
        (
            "[[stage.match]]\nfeature = \"attention\"\nlayers = [[1, 1]]",
            "[model.overrides]\nnum-hidden-layers = 1\nhidden-size = 16\nnum-attention-heads = 2",
            &["stage[1].match.heads", "2 heads", "heads = \\\"mean\\\""],
        ),
        (
            "",
            "[model.overrides]\nvocab-size = 1000",
            &["[overrides] has no key `vocab-size`"],
        ),
        (
            "[[stage.match]]\nfeature = \"attention\"\ntokens = \"cls\"\nlayers = [[1, 2]]",
            LAYER_INIT,
            &["stage[1].match.tokens", "hidden-state matches only"],
        ),
        (
            "[[stage.match]]\nfeature = \"hidden\"\nlayers = [[1, 2]]\nuntil-epoch = 2",
            LAYER_INIT,
            &["stage[1].match.until-epoch", "[train] epochs = 2"],
        ),
        (
            "[[stage.match]]\nfeature = \"word-embeddings\"\nlayers = [[1, 2]]",
            LAYER_INIT,
            &["stage[1].match.layers", "take no layer map"],
        ),
        (
            "[[stage.match]]\nfeature = \"hidden\"",
            LAYER_INIT,
            &["stage[1].match.layers", "`layers` is missing", "uniform"],
        ),
        (
            "[[stage.match]]\nfeature = \"hidden\"\nlayers = [[1, 2]]\nrows = 100",
            LAYER_INIT,
            &["stage[1].match.rows", "word-embedding matches only"],
        ),
        (
            "[[stage.match]]\nfeature = \"word-embeddings\"",
            "[model.overrides]\nnum-hidden-layers = 1\nhidden-size = 16\nnum-attention-heads = 2",
            &["stage[1].match.projection", "width 16 differs", "projection = true"],
        ),
    ];
    for (i, (matches, student, needles)) in cases.into_iter().enumerate() {
        let dir = tmp.path().join(format!("case{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let recipe = write_pair(&dir, matches, student);
        let out = mopt(&[recipe.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "case {i}: {}", stderr(&out));
        for n in needles {
            assert!(
                stderr(&out).contains(&n.replace("\\\"", "\"")),
                "case {i} lacks `{n}`:\n{}",
                stderr(&out)
            );
        }
        assert!(
            !dir.join("runs/student").exists(),
            "case {i}: nothing written for a bad recipe"
        );
    }
    // A student with another vocabulary than the teacher.
    let dir = tmp.path().join("vocab");
    std::fs::create_dir_all(&dir).unwrap();
    let recipe = write_pair(&dir, "", "");
    let cfg = dir.join("tiny-config.json");
    let student_cfg = dir.join("student-config.json");
    std::fs::write(
        &student_cfg,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("30522", "40000"),
    )
    .unwrap();
    let text = std::fs::read_to_string(&recipe).unwrap();
    let text = text.replacen(
        &format!("config = \"{}\"", cfg.display()),
        &format!("config = \"{}\"", student_cfg.display()),
        1,
    );
    std::fs::write(&recipe, text).unwrap();
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("vocabulary") && stderr(&out).contains("stage[1].student.config"),
        "{}",
        stderr(&out)
    );
    // alpha and temperature are checked when the recipe is read.
    for (from, to, key) in [
        ("alpha = 0.5", "alpha = 1.5", "stage[1].alpha"),
        (
            "temperature = 2.0",
            "temperature = 0.0",
            "stage[1].temperature",
        ),
        (
            "alpha = 0.5",
            "alpha = { from = 0.2, to = -0.1 }",
            "stage[1].alpha",
        ),
        // No logit kept; and BERT's distillation reads its own cache, not top-k rows.
        (
            "alpha = 0.5",
            "alpha = 0.5\nteacher-top-k = 0",
            "stage[1].teacher-top-k",
        ),
        (
            "alpha = 0.5",
            "alpha = 0.5\nteacher-top-k = 16",
            "stage[1].teacher-top-k",
        ),
    ] {
        let text = std::fs::read_to_string(&recipe).unwrap().replace(from, to);
        let p = dir.join("bad.toml");
        std::fs::write(&p, text).unwrap();
        let out = mopt(&[p.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{to}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(key) && stderr(&out).contains("bad.toml:"),
            "{to}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn distilled_student_and_teacher_export_through_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_pair(tmp.path(), MATCHES, LAYER_INIT);
    let text = std::fs::read_to_string(&recipe)
        .unwrap()
        .replace("baseline = true", "baseline = false");
    std::fs::write(&recipe, text).unwrap();
    // The teacher's own recipe first (a smoke teacher inside the student's run would not be
    // the [teacher] checkpoint that `export` exports beside the student).
    let teacher = mopt(&[
        tmp.path().join("teacher.toml").to_str().unwrap(),
        "--max-steps",
        "2",
    ]);
    assert!(teacher.status.success(), "{}", stderr(&teacher));
    let out = mopt(&[recipe.to_str().unwrap(), "--max-steps", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let exp = mopt(&[
        "export",
        recipe.to_str().unwrap(),
        "--samples",
        "30",
        "--latency-runs",
        "2",
    ]);
    assert!(exp.status.success(), "{}", stderr(&exp));
    let dir = tmp.path().join("runs/student/export");
    for f in [
        "model.onnx",
        "model-card.json",
        "vocab.txt",
        "labels.json",
        "teacher/model.onnx",
        "export-report.json",
    ] {
        assert!(dir.join(f).is_file(), "missing {f}");
    }
    let card = read_json(&dir.join("model-card.json"));
    assert_eq!(card["parity"]["samples"], 30);
    assert!(card["parity"]["max_abs_err"].as_f64().unwrap() < 1e-4);
    assert!(card["accuracy_at_export"].as_f64().is_some());
    assert_eq!(card["layers"], 1);
    let report = read_json(&dir.join("export-report.json"));
    assert_eq!(report["latency"].as_array().unwrap().len(), 2);
    assert_eq!(report["latency"][1]["model"], "teacher");
    assert!(
        report["latency"][0]["latency"][1]["p50_ms"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    // A second export is refused without --force.
    let again = mopt(&[
        "export",
        recipe.to_str().unwrap(),
        "--samples",
        "5",
        "--latency-runs",
        "0",
    ]);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    assert!(stderr(&again).contains("--force"));
}

#[test]
fn max_steps_applies_to_a_teacher_trained_on_the_way_and_keeps_it_inside_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_pair(tmp.path(), "", LAYER_INIT);
    let text = std::fs::read_to_string(&recipe)
        .unwrap()
        .replace("baseline = true", "baseline = false");
    std::fs::write(&recipe, text).unwrap();
    let out = mopt(&[recipe.to_str().unwrap(), "--max-steps", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The smoke teacher is not the shared [teacher] checkpoint a later full run would reuse.
    assert!(!tmp.path().join("runs/teacher").exists());
    let inner = tmp.path().join("runs/student/00-baseline/teacher-run");
    let teacher_report = read_json(&inner.join("01-finetune/report.json"));
    assert_eq!(
        teacher_report["steps"], 2,
        "the teacher stopped at --max-steps too"
    );
    let r = read_json(&tmp.path().join("runs/student/report.json"));
    assert!(
        r["stages"][0]["decision"]["reason"]
            .as_str()
            .unwrap()
            .contains("--max-steps 2 (smoke run"),
        "{}",
        r["stages"][0]
    );
    assert_eq!(r["stages"][1]["steps"], 2);
    // Paths in messages read as written, without `dir/../`.
    assert!(!stderr(&out).contains("/../"), "{}", stderr(&out));
}

#[test]
fn an_extra_term_reads_the_computed_outputs_and_adds_to_the_loss() {
    let dev = Device::flex();
    let c = BertConfig {
        hidden_dropout_prob: 0.0,
        attention_probs_dropout_prob: 0.0,
        ..BertConfig::tiny(50, 3)
    };
    dev.seed(1);
    let model = DistillModel::new(BertForSequenceClassification::new(&c, &dev), &[], &dev);
    let items = [
        Encoded {
            ids: vec![1, 5, 7, 2],
            label: 0,
        },
        Encoded {
            ids: vec![1, 9, 2],
            label: 2,
        },
    ];
    let b = Batcher::new(0).batch(&items.iter().collect::<Vec<_>>(), &dev);
    let spec = DistillSpec {
        enabled: false,
        ..DistillSpec::default()
    };
    let plan = MatchPlan {
        matches: Vec::new(),
        projections: Vec::new(),
        needs: TeacherNeeds::default(),
    };
    let plain = DistillTask::<BertForSequenceClassification>::new(
        spec.clone(),
        plan.clone(),
        TeacherSource::None,
        &dev,
    );
    let (base, _) = plain.objective(&model, &b, &[0, 1], 0.0);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let term: ExtraTerm = Arc::new(move |out, _b| {
        log.lock().unwrap().push(out.logits.dims());
        let mean: Tensor<1> = out.logits.clone().mean();
        (mean.mul_scalar(0.0).add_scalar(2.5), vec![("extra", 2.5)])
    });
    let with =
        DistillTask::<BertForSequenceClassification>::new(spec, plan, TeacherSource::None, &dev)
            .with_extra(Some(term));
    let (loss, parts) = with.objective(&model, &b, &[0, 1], 0.0);
    let (a, z): (f32, f32) = (base.into_scalar(), loss.into_scalar());
    assert!((z - a - 2.5).abs() < 1e-5, "{a} + 2.5 != {z}");
    assert!(parts.contains(&("extra", 2.5)));
    // The term read the logits of this forward pass: no second student forward.
    assert_eq!(*seen.lock().unwrap(), vec![[2, 3]]);
}

/// TinyBERT's augmentation: copies of every sentence that the cached teacher labels, and a twin
/// that trains on the originals for the student's steps; its keys' errors name them.
#[test]
fn augmentation_copies_are_labelled_by_the_teacher_and_the_twin_gets_their_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_pair(tmp.path(), "", LAYER_INIT);
    let text = std::fs::read_to_string(&recipe).unwrap();
    let with =
        |keys: &str| text.replace("baseline = true\n", &format!("baseline = true\n{keys}\n"));
    std::fs::write(&recipe, with("augment-copies = 2\naugment-neighbours = 5")).unwrap();
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = tmp.path().join("runs/student");
    let r = read_json(&run.join("report.json"));
    let student = &r["stages"][1];
    // 96 sentences and 2 copies each: the teacher ran on 288, the student's epochs are 288
    // examples (18 steps of 16, 2 epochs), and the twin's, on the originals thrice, as many.
    assert_eq!(student["facts"]["teacher_cache"]["teacher_forwards"], 288);
    assert_eq!(student["steps"], 36, "{student}");
    assert_eq!(student["facts"]["twin_steps"], 36, "{student}");
    let notes = student["notes"].to_string();
    assert!(
        notes.contains("192 copies of the 96 training sentences (2 each)")
            && notes.contains("5 nearest words"),
        "{notes}"
    );
    // The same seed draws the same copies: the cache is found again, the student is the same.
    let again = mopt(&[recipe.to_str().unwrap(), "--force"]);
    assert!(again.status.success(), "{}", stderr(&again));
    let r2 = read_json(&run.join("report.json"));
    assert_eq!(r2["stages"][1]["facts"]["teacher_cache"]["hit"], true);
    assert_eq!(r2["stages"][1]["model"]["test"], student["model"]["test"]);
    for (keys, expect) in [
        (
            "augment-replace = 0.3",
            &["stage[1].augment-replace", "without `augment-copies`"][..],
        ),
        (
            "augment-copies = 0",
            &["stage[1].augment-copies", "use 1 to 100"],
        ),
        (
            "augment-copies = 2\naugment-replace = 1.5",
            &["stage[1].augment-replace", "not a probability"],
        ),
        (
            "augment-copies = 2\nteacher-cache = false",
            &["stage[1].teacher-cache", "labelled by the cached teacher"],
        ),
    ] {
        std::fs::write(&recipe, with(keys)).unwrap();
        let out = mopt(&[recipe.to_str().unwrap(), "--check"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{keys}: {err}");
        for e in expect {
            assert!(err.contains(e), "{keys}: `{e}` not in {err}");
        }
    }
}

/// A distill stage reused from another run of the output folder brings its hard-label twin
/// along (measured again), so that a seeds summary can pair every seed's student with its twin.
#[test]
fn a_reused_distill_stage_keeps_its_twin() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_pair(tmp.path(), "", LAYER_INIT);
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&recipe).unwrap();
    let again = tmp.path().join("again.toml");
    std::fs::write(
        &again,
        text.replace("name = \"student\"", "name = \"again\""),
    )
    .unwrap();
    let out = mopt(&[again.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (a, b) = (
        read_json(&tmp.path().join("runs/student/report.json")),
        read_json(&tmp.path().join("runs/again/report.json")),
    );
    let reused = &b["stages"][1];
    assert!(reused["facts"]["reused_from"].is_string(), "{reused}");
    let (twin_a, twin_b) = (&a["stages"][1]["references"][0], &reused["references"][0]);
    assert!(
        twin_b["name"].as_str().unwrap().contains("twin"),
        "{reused}"
    );
    assert_eq!(twin_a["model"]["test"], twin_b["model"]["test"]);
}
