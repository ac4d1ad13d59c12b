//! Cross-family distillation through the stock `distill` stage: a tiny BERT teacher distilled
//! into the fastText-style family of `examples/fasttext` (its own crate, compiled here from the
//! same source), then pruned, quantized and exported, by the shipped recipe with its paths and
//! sizes made tiny. The student's family builds, measures and exports it; a student of an
//! unknown family, of another label space or with a key its family does not declare is refused
//! by name.

mod common;
#[path = "../examples/fasttext/src/lib.rs"]
mod fasttext;

use std::path::{Path, PathBuf};

use burn::prelude::*;
use common::{minilm_dir, read_json, write_tiny_recipe};
use fasttext::{FastText, FastTextFamily};
use mopt::Registry;
use mopt_core::{Checkpoint, Quantizable};

fn registry() -> Registry {
    mopt_families::builtin().with_family(FastTextFamily)
}

fn run(args: &[&str]) -> u8 {
    let argv = std::iter::once("fasttext").chain(args.iter().copied());
    mopt::cli::run_from(registry(), argv)
}

/// The shipped recipe on the tiny teacher of `teacher_recipe`: its tokenizer and data slice,
/// two epochs a stage, its output folder under `dir`.
fn recipe_in(dir: &Path, teacher_recipe: &Path, student: &str) -> PathBuf {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/fasttext");
    std::fs::copy(shipped.join("fasttext.json"), dir.join("fasttext.json")).unwrap();
    let tiny = std::fs::read_to_string(teacher_recipe).unwrap();
    let data_line = tiny
        .lines()
        .find(|l| l.starts_with("path = ") && l.contains("csv"))
        .unwrap();
    let text = std::fs::read_to_string(shipped.join("distill_fasttext.toml"))
        .unwrap()
        .replace("\"../../checkpoints\"", &format!("{:?}", dir.join("runs")))
        .replace(
            "checkpoint = \"../../checkpoints/finetune-teacher/best\"",
            &format!("checkpoint = {:?}", dir.join("runs/teacher/best")),
        )
        .replace("recipe = \"../../recipes/finetune_teacher.toml\"\n", "")
        .replace(
            "path = \"../../datasets/data/models/all-MiniLM-L6-v2/tokenizer.json\"\nmax-len = 64",
            &format!("path = {:?}\nmax-len = 32", minilm_dir().join("vocab.txt")),
        )
        .replace(
            "path = \"../../datasets/data/rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2\"",
            &format!("{data_line}\nmax-train = 96\nmax-eval = 40"),
        )
        .replace("epochs = 8", "epochs = 2")
        .replace("latency-runs = 30", "latency-runs = 2")
        .replace("samples = 500", "samples = 40")
        .replace("calibration-samples = 512", "calibration-samples = 32")
        .replace(
            "arch = \"fasttext\"\nconfig = \"fasttext.json\"\nhidden = 64",
            student,
        );
    let path = dir.join("distill_fasttext.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_bert_teacher_distils_into_a_family_of_ones_own_through_the_stock_stage() {
    let tmp = tempfile::tempdir().unwrap();
    let teacher = write_tiny_recipe(tmp.path(), "teacher", "");
    assert_eq!(
        run(&[teacher.to_str().unwrap()]),
        0,
        "the tiny teacher trains"
    );
    let student = "arch = \"fasttext\"\nconfig = \"fasttext.json\"\nhidden = 16";
    refusals(tmp.path(), &teacher);
    let recipe = recipe_in(tmp.path(), &teacher, student);
    let r = recipe.to_str().unwrap();

    // The plan: a BERT input, a fastText student and its shapes through the later stages.
    let plan = mopt_stages::Pipeline::load(&recipe, &registry())
        .unwrap()
        .check(&mopt_train::DeviceSpec::Cpu)
        .unwrap();
    assert!(plan.contains("30522 x 64 -> 16 -> 2"), "{plan}");
    assert!(
        plan.contains("30522 x 64 -> 8 -> 2"),
        "half the neurons pruned:\n{plan}"
    );

    assert_eq!(run(&[r]), 0);
    let dir = tmp.path().join("runs/distill-fasttext");
    let rep = read_json(&dir.join("report.json"));
    let stages = rep["stages"].as_array().unwrap();
    let kinds: Vec<&str> = stages.iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["baseline", "distill", "prune", "ptq", "export"]);
    let ckpt = |i: usize| PathBuf::from(stages[i]["model"]["checkpoint"].as_str().unwrap());
    // The baseline is the BERT teacher; the distilled student is a fastText, measured by its
    // own family (its parameter count), beside its hard-label twin.
    assert_eq!(
        read_json(&ckpt(0).join("config.json"))["model_type"],
        "bert"
    );
    assert_eq!(
        read_json(&ckpt(1).join("config.json"))["model_type"],
        "fasttext"
    );
    assert_eq!(
        stages[1]["model"]["params"],
        30522 * 64 + 64 * 16 + 16 + 16 * 2 + 2
    );
    let refs = stages[1]["references"].as_array().unwrap();
    assert!(
        refs.iter()
            .any(|x| x["name"].as_str().unwrap().contains("twin")),
        "{refs:?}"
    );
    // Pruned (KD from the BERT teacher between rounds), quantized, exported.
    let (pruned, _) = FastText::load(&ckpt(2), &Device::flex()).unwrap();
    let hidden = pruned.layers[0].weight.val().dims()[1];
    assert!(hidden == 12 || hidden == 8, "{hidden}");
    let (q, _) = FastText::load(&dir.join("best"), &Device::flex()).unwrap();
    assert!(q.is_quantized(), "the final model is the int8 one");
    assert!(dir.join("04-export/onnx/model.onnx").is_file());
}

/// Students that cannot learn from the teacher at `dir/runs/teacher/best`, refused by name at
/// `--check`, before anything runs.
fn refusals(dir: &Path, teacher: &Path) {
    let cases = [
        (
            "arch = \"nonesuch\"\nconfig = \"fasttext.json\"",
            "stage[1].student.arch",
            "unknown architecture `nonesuch`",
        ),
        (
            "arch = \"fasttext\"\nconfig = \"fasttext.json\"\ndropout = 0.1",
            "stage[1].student.dropout",
            "a `fasttext` model table has no key `dropout`; it takes `arch`, `config`, `embedding-dim`, `hidden`",
        ),
        (
            "arch = \"resnet\"\nconfig = \"fasttext.json\"",
            "stage[1].student.arch",
            "`resnet` models read images, and the stage's input (`bert`) text",
        ),
    ];
    for (student, key, needle) in cases {
        let recipe = recipe_in(dir, teacher, student);
        let err = mopt_stages::Pipeline::load(&recipe, &registry())
            .and_then(|p| p.check(&mopt_train::DeviceSpec::Cpu))
            .expect_err(student)
            .to_string();
        assert!(
            err.contains(key) && err.contains(needle),
            "{student}: {err}"
        );
    }
}
