//! The image path through the real binary: a tiny ResNet on scikit-learn's 8×8 digits (1,797 real
//! images, `datasets/fetch.sh --small`), built, fine-tuned, measured and reported by the same
//! runner and stage kinds as text.

mod common;

use std::path::{Path, PathBuf};

use common::{mopt, read_json, stderr};

fn digits() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/data/digits/digits.csv.gz");
    assert!(
        p.is_file(),
        "test data missing ({}): run `datasets/fetch.sh --small` first",
        p.display()
    );
    p
}

/// `dir/<name>`: the shape file `json`.
fn write_shape(dir: &Path, name: &str, json: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, json).unwrap();
    p
}

/// A ResNet of two stages (8 and 16 channels, one block each) for 8×8 images.
fn write_resnet(dir: &Path) -> PathBuf {
    write_shape(
        dir,
        "resnet.json",
        r#"{"channels": 1, "image_size": 8, "stages": [{"width": 8, "blocks": [8]}, {"width": 16, "blocks": [16]}]}"#,
    )
}

/// The distilled students' ResNet: two stages of 4 and 8 channels, one block of 4 each.
fn write_student(dir: &Path) -> PathBuf {
    write_shape(
        dir,
        "student.json",
        r#"{"channels": 1, "image_size": 8, "stages": [{"width": 4, "blocks": [4]}, {"width": 8, "blocks": [4]}]}"#,
    )
}

fn write_recipe(dir: &Path, extra: &str) -> PathBuf {
    let text = format!(
        r#"[run]
name = "digits"
output-dir = "{out}"
seed = 7

[model]
arch = "resnet"
config = "{cfg}"

[data]
format = "pixels-csv"
path = "{data}"
pixel-max = 16
valid-fraction = 0.1
test-fraction = 0.2
{extra}
[train]
epochs = 3
batch-size = 32
lr = 3e-3
weight-decay = 0.0005
warmup-fraction = 0.05

[evaluation]
golden-samples = 64
latency-runs = 3
"#,
        out = dir.join("runs").display(),
        cfg = write_resnet(dir).display(),
        data = digits().display(),
    );
    let p = dir.join("digits.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// A recipe `dir/<name>.toml` whose baseline is the teacher that `teacher` (a digits recipe of
/// [`write_recipe`]) trains into `runs/digits/best`, training `epochs` at `lr`, then `stages`.
fn write_from_teacher(
    dir: &Path,
    name: &str,
    teacher: &Path,
    (epochs, lr): (usize, f64),
    stages: &str,
) -> PathBuf {
    let text = format!(
        r#"[run]
name = "{name}"
output-dir = "{out}"
seed = 7

[teacher]
checkpoint = "{out}/digits/best"
recipe = "{teacher}"

[data]
format = "pixels-csv"
path = "{data}"
pixel-max = 16
valid-fraction = 0.1
test-fraction = 0.2

[train]
epochs = {epochs}
batch-size = 32
lr = {lr:e}

[evaluation]
golden-samples = 64
latency-runs = 0

{stages}"#,
        out = dir.join("runs").display(),
        teacher = teacher.display(),
        data = digits().display(),
    );
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_tiny_resnet_fine_tunes_on_the_digits_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write_recipe(dir.path(), "");
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = dir.path().join("runs/digits");
    let report = read_json(&run.join("report.json"));
    let stages = report["stages"].as_array().unwrap();
    let acc = |i: usize, split: &str| stages[i]["model"][split]["accuracy"].as_f64().unwrap();
    // 1,797 digits split 70/10/20: 1,258 / 180 / 359.
    assert_eq!(stages[1]["model"]["test"]["examples"].as_u64(), Some(359));
    // Random init is near chance (10 classes); three epochs learn the digits.
    assert!(acc(0, "test") < 0.3, "baseline {}", acc(0, "test"));
    assert!(acc(1, "test") > 0.85, "fine-tuned {}", acc(1, "test"));
    assert_eq!(stages[1]["model"]["widths"], serde_json::json!([8, 16]));
    assert_eq!(stages[1]["model"]["blocks"], serde_json::json!([[8], [16]]));
    // 64 golden images of 64 normalised values, with the baseline's 10 logits each.
    let golden = read_json(&run.join("golden.json"));
    assert_eq!(golden["examples"].as_u64(), Some(64));
    assert_eq!(golden["inputs"][0].as_array().unwrap().len(), 64);
    assert_eq!(golden["logits"][63].as_array().unwrap().len(), 10);
    // The deployment files: labels and the normalisation a caller applies.
    let pre = read_json(&run.join("best/preprocess.json"));
    assert_eq!(pre["normalize"]["pixel_max"].as_f64(), Some(16.0));
    assert_eq!(pre["side"].as_u64(), Some(8));
    let labels = read_json(&run.join("best/labels.json"));
    assert_eq!(
        labels["labels"].as_array().map(|l| l.len()),
        Some(10),
        "{labels}"
    );
}

/// `lr-find` sweeps any family with the finetune capability, not BERT's alone: the ResNet's
/// loss over 30 rising learning rates, from the recipe's model built as a run's baseline is.
#[test]
fn lr_find_sweeps_a_resnet() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write_recipe(
        dir.path(),
        "\n[lr-find]\nstart-lr = 1e-5\nend-lr = 1.0\nsteps = 30\n",
    );
    let out = mopt(&["lr-find", recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("suggested lr: "), "{stdout}");
    let run = dir.path().join("runs/digits-lr-find");
    let csv = std::fs::read_to_string(run.join("lr-find.csv")).unwrap();
    let rows: Vec<Vec<f64>> = csv
        .lines()
        .skip(1)
        .map(|r| r.split(',').map(|x| x.parse().unwrap()).collect())
        .collect();
    assert!(rows.len() >= 5 && rows.len() <= 30, "{} rows", rows.len());
    assert!((rows[0][1] - 1e-5).abs() < 1e-15, "{:?}", rows[0]);
    // The first losses are the untrained ResNet's on 10 classes: about ln 10.
    assert!((rows[0][2] - 10f64.ln()).abs() < 0.7, "{:?}", rows[0]);
    assert!(run.join("model/config.json").is_file());
}

#[test]
fn image_recipes_that_cannot_work_fail_before_a_run_folder_exists() {
    let dir = tempfile::tempdir().unwrap();
    let vocab = common::minilm_dir().join("vocab.txt");
    let cases = [
        (
            format!("[tokenizer]\npath = \"{}\"\n", vocab.display()),
            "`pixels-csv` data (images) reads no section besides [data]",
        ),
        (
            "text-column = \"pixels\"\n".to_string(),
            "images have no columns to name",
        ),
        (
            "\n[data.augment]\ncrop = 9\n".to_string(),
            "data.augment.crop",
        ),
    ];
    for (extra, want) in cases {
        let recipe = write_recipe(dir.path(), &extra);
        let out = mopt(&["--check", recipe.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains(want), "{}", stderr(&out));
    }
    // A BERT on images: the family and the data disagree, at `data.format`.
    let recipe = write_recipe(dir.path(), "");
    let text = std::fs::read_to_string(&recipe)
        .unwrap()
        .replace("arch = \"resnet\"", "arch = \"bert\"");
    std::fs::write(&recipe, text).unwrap();
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("`pixels-csv` holds images, and `bert` models read text"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join("runs/digits").exists());
}

#[test]
fn a_resnet_teacher_trained_first_is_distilled_into_a_smaller_resnet_beside_its_twin() {
    let dir = tempfile::tempdir().unwrap();
    let teacher = write_recipe(dir.path(), "");
    let student = write_student(dir.path());
    let stages = format!(
        r#"[[stage]]
kind = "distill"
name = "student"
alpha = 0.5
temperature = 4.0
baseline = true

[stage.student]
arch = "resnet"
config = "{}"
"#,
        student.display()
    );
    let recipe = write_from_teacher(dir.path(), "digits-kd", &teacher, (3, 3e-3), &stages);
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The teacher recipe ran first and left its checkpoint where [teacher] points.
    assert!(dir.path().join("runs/digits/best/model.bpk").is_file());
    let report = read_json(&dir.path().join("runs/digits-kd/report.json"));
    let stages = report["stages"].as_array().unwrap();
    let teacher_acc = stages[0]["model"]["test"]["accuracy"].as_f64().unwrap();
    let student = &stages[1];
    assert!(teacher_acc > 0.85, "teacher {teacher_acc}");
    assert_eq!(student["model"]["widths"], serde_json::json!([4, 8]));
    assert!(
        student["model"]["params"].as_u64() < stages[0]["model"]["params"].as_u64(),
        "the student is smaller"
    );
    let acc = student["model"]["test"]["accuracy"].as_f64().unwrap();
    assert!(acc > 0.5, "distilled student {acc}");
    let twin = &student["references"][0];
    assert!(
        twin["name"].as_str().unwrap().contains("hard-label twin"),
        "{twin}"
    );
    assert!(
        twin["model"]["test"]["accuracy"].as_f64().unwrap() > 0.3,
        "{twin}"
    );
    let notes = student["notes"].to_string();
    assert!(
        notes.contains("teacher's logits") && notes.contains("Hard-label twin"),
        "{notes}"
    );
    // Run again: the teacher's logits come from the disk cache beside the data.
    let again = mopt(&[recipe.to_str().unwrap(), "--force", "--no-reuse"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("teacher logits: reusing"),
        "{}",
        stderr(&again)
    );
    let report = read_json(&dir.path().join("runs/digits-kd/report.json"));
    let again_acc = report["stages"][1]["model"]["test"]["accuracy"]
        .as_f64()
        .unwrap();
    assert!((again_acc - acc).abs() < 0.1, "{again_acc} vs {acc}");
}

/// `[data.augment]`: the teacher trains on cropped and flipped digits, the distillation runs its
/// teacher live on the same augmented batches (no logit cache), a prune stage whose KD would
/// read cached logits is refused at `--check`, and a crop too large for 8×8 images names the
/// key before a run folder exists.
#[test]
fn augmented_digits_train_a_teacher_and_distil_it_with_the_teacher_live() {
    let dir = tempfile::tempdir().unwrap();
    let augment = "\n[data.augment]\ncrop = 1\n";
    let teacher = write_recipe(dir.path(), augment);
    let student = write_student(dir.path());
    let stages = format!(
        "[[stage]]\nkind = \"distill\"\nname = \"student\"\nalpha = 0.5\nbaseline = true\n\n[stage.student]\narch = \"resnet\"\nconfig = \"{}\"\n",
        student.display()
    );
    let recipe = write_from_teacher(dir.path(), "digits-aug", &teacher, (8, 3e-3), &stages);
    let with_augment = |p: &Path| {
        let text = std::fs::read_to_string(p).unwrap().replace(
            "test-fraction = 0.2\n",
            &format!("test-fraction = 0.2\n{augment}"),
        );
        std::fs::write(p, text).unwrap();
    };
    with_augment(&recipe);
    let check = mopt(&["--check", recipe.to_str().unwrap()]);
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        stderr(&check)
    );
    assert!(
        shown.contains("teacher runs live on the augmented batches"),
        "{shown}"
    );
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("the teacher running live"), "{err}");
    assert!(
        !err.contains("teacher pass"),
        "no logit cache is computed: {err}"
    );
    let report = read_json(&dir.path().join("runs/digits-aug/report.json"));
    let stages = report["stages"].as_array().unwrap();
    let acc = |i: usize| stages[i]["model"]["test"]["accuracy"].as_f64().unwrap();
    assert!(
        acc(0) > 0.7,
        "teacher trained on augmented digits: {}",
        acc(0)
    );
    assert!(acc(1) > 0.5, "student distilled live: {}", acc(1));
    // A prune stage's KD reads cached logits: refused, naming the key and the fix.
    let prune = write_from_teacher(
        dir.path(),
        "digits-aug-prune",
        &teacher,
        (1, 1e-3),
        "[[stage]]\nkind = \"prune\"\ntargets = [\"channels\"]\ntarget = 0.25\nstep = 0.25\n",
    );
    with_augment(&prune);
    let out = mopt(&["--check", prune.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("distill") && err.contains("set `distill = false`"),
        "{err}"
    );
    // 3 pixels of padding on 8×8 digits: more than a quarter of the side.
    let big = write_recipe(dir.path(), "\n[data.augment]\ncrop = 3\n");
    let text = std::fs::read_to_string(&big)
        .unwrap()
        .replace("name = \"digits\"", "name = \"digits-big\"");
    std::fs::write(&big, text).unwrap();
    let out = mopt(&[big.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("crop = 3 pads more than a quarter"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join("runs/digits-big").exists());
}

#[test]
fn residual_and_inner_channels_of_a_resnet_are_pruned_in_rounds_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let teacher = write_recipe(dir.path(), "");
    let stages = r#"[[stage]]
kind = "prune"
targets = ["channels", "residual", "blocks"]
criterion = "taylor"
target = 0.5
step = 0.25
taylor-batches = 4
hidden-multiple = 2
distill = true
compare = ["bn-scale"]

[[stage]]
kind = "export"
samples = 64
latency-runs = 3
reference = ["baseline"]
"#;
    let recipe = write_from_teacher(dir.path(), "digits-prune", &teacher, (2, 2e-3), stages);
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = read_json(&dir.path().join("runs/digits-prune/report.json"));
    let stages = report["stages"].as_array().unwrap();
    let pruned = &stages[1]["model"];
    // Half of every stage's residual channels and every block's inner channels, in 2 rounds.
    assert_eq!(pruned["widths"], serde_json::json!([4, 8]), "{pruned}");
    assert_eq!(pruned["blocks"], serde_json::json!([[4], [8]]), "{pruned}");
    let (p0, p1) = (
        stages[0]["model"]["params"].as_u64().unwrap(),
        pruned["params"].as_u64().unwrap(),
    );
    assert!(
        p1 * 3 < p0,
        "about a quarter of the parameters stay: {p1} of {p0}"
    );
    let acc = pruned["test"]["accuracy"].as_f64().unwrap();
    assert!(acc > 0.5, "pruned and fine-tuned {acc}");
    assert_eq!(
        stages[1]["facts"]["rounds"].as_array().map(|r| r.len()),
        Some(2)
    );
    // The same schedule scored by BatchNorm scales (Network Slimming), beside Taylor.
    let bn = &stages[1]["facts"]["compare"][0];
    assert_eq!(bn["criterion"], "bn-scale");
    assert_eq!(bn["rounds"].as_array().map(|r| r.len()), Some(2), "{bn}");
}

/// PTQ (BatchNorm folded, convolutions per output channel, sensitivity with fallback) and QAT
/// of a digits teacher, each exported as QDQ: ONNX Runtime turns the convolutions into
/// `QLinearConv` and the residual sums into `QLinearAdd`, and predicts as mopt's fake-quantized
/// network does.
#[test]
fn a_resnet_is_quantized_by_ptq_and_qat_and_runs_on_integer_kernels_in_onnx_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let teacher = write_recipe(dir.path(), "");
    let export = r#"
[[stage]]
kind = "export"
samples = 64
latency-runs = 0
"#;
    let ptq = format!(
        r#"[[stage]]
kind = "ptq"
calibration-samples = 256
sensitivity = true

[stage.gate]
max-drop = 0.02
on-fail = "retry"
{export}"#
    );
    let recipe = write_from_teacher(dir.path(), "digits-ptq", &teacher, (1, 1e-3), &ptq);
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = read_json(&dir.path().join("runs/digits-ptq/report.json"));
    let stages = report["stages"].as_array().unwrap();
    let facts = &stages[1]["facts"];
    let q = &facts["quantization"];
    // Four convolutions quantized (stem and classifier float by default), minus fallbacks; the
    // second convolutions and the projection write quantized outputs.
    let fallback = facts["fallback"].as_array().unwrap().len();
    assert_eq!(q["layers"].as_array().unwrap().len() + fallback, 5, "{q}");
    assert_eq!(facts["sensitivity"].as_array().unwrap().len(), 5);
    assert!(q["outputs"].as_array().unwrap().iter().all(|p| {
        let p = p.as_str().unwrap();
        p.ends_with(".conv2") || p.ends_with(".shortcut")
    }));
    let base = stages[0]["model"]["test"]["accuracy"].as_f64().unwrap();
    let ptq_acc = stages[1]["model"]["test"]["accuracy"].as_f64().unwrap();
    assert!(ptq_acc > base - 0.05, "PTQ {ptq_acc} vs float {base}");
    let ops = |stage: &serde_json::Value| stage["facts"]["model_card"]["fused_ops"].clone();
    let card = &stages[2]["facts"]["model_card"];
    assert!(
        card["parity"]["agreement"].as_f64().unwrap() >= 0.995,
        "{card}"
    );
    assert!(
        ops(&stages[2])["QLinearConv"].as_u64().unwrap_or(0) >= 1,
        "{}",
        ops(&stages[2])
    );
    if fallback == 0 {
        assert!(
            ops(&stages[2])["QLinearAdd"].as_u64().unwrap_or(0) >= 1,
            "{}",
            ops(&stages[2])
        );
    }

    let qat = format!(
        r#"[[stage]]
kind = "qat"
calibration-samples = 256
{export}"#
    );
    let recipe = write_from_teacher(dir.path(), "digits-qat", &teacher, (1, 1e-3), &qat);
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = read_json(&dir.path().join("runs/digits-qat/report.json"));
    let stages = report["stages"].as_array().unwrap();
    assert!(stages[1]["steps"].as_u64().unwrap() > 0);
    let qat_acc = stages[1]["model"]["test"]["accuracy"].as_f64().unwrap();
    assert!(qat_acc > base - 0.05, "QAT {qat_acc} vs float {base}");
    // Every quantized convolution runs on integers; the first block's sum too (the last one
    // feeds the float pooling).
    assert_eq!(
        ops(&stages[2])["QLinearConv"].as_u64(),
        Some(5),
        "{}",
        ops(&stages[2])
    );
    assert_eq!(
        ops(&stages[2])["QLinearAdd"].as_u64(),
        Some(1),
        "{}",
        ops(&stages[2])
    );
}

/// `--seed` runs a recipe with another seed into `<name>-seed<N>`: two seeds, two folders, two
/// different random inits (their golden logits differ), each recipe copy recording its seed.
#[test]
fn seed_overrides_run_side_by_side_with_their_own_init() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write_recipe(dir.path(), "");
    let mut golden = Vec::new();
    for seed in ["1", "2"] {
        let out = mopt(&[recipe.to_str().unwrap(), "--seed", seed, "--max-steps", "2"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let run = dir.path().join(format!("runs/digits-seed{seed}"));
        let copy = std::fs::read_to_string(run.join("recipe.toml")).unwrap();
        assert!(
            copy.ends_with(&format!("`mopt-train --seed {seed}`\n")),
            "{copy}"
        );
        golden.push(read_json(&run.join("golden.json"))["logits"].clone());
    }
    assert_ne!(golden[0], golden[1]);
    assert!(!dir.path().join("runs/digits").exists());
}

/// `--seeds 1,2` runs the recipe once per seed and summarizes: each stage's accuracy as mean ±
/// std over the runs, and the distilled student against its hard-label twin as a paired
/// difference seed by seed, with a 95% interval.
#[test]
fn seeds_run_side_by_side_and_summarize_with_paired_differences() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write_recipe(dir.path(), "");
    let stages = format!(
        "\n[[stage]]\nkind = \"distill\"\nname = \"student\"\nbaseline = true\n\n[stage.student]\narch = \"resnet\"\nconfig = \"{}\"\n",
        write_student(dir.path()).display()
    );
    let text = std::fs::read_to_string(&recipe).unwrap() + &stages;
    std::fs::write(&recipe, text).unwrap();
    let out = mopt(&[
        recipe.to_str().unwrap(),
        "--seeds",
        "1,2",
        "--max-steps",
        "3",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let summary = read_json(&dir.path().join("runs/digits-seeds/summary.json"));
    assert_eq!(summary["seeds"], serde_json::json!([1, 2]));
    let runs: Vec<serde_json::Value> = [1, 2]
        .iter()
        .map(|s| read_json(&dir.path().join(format!("runs/digits-seed{s}/report.json"))))
        .collect();
    let student = &summary["stages"][1];
    assert_eq!(student["name"], "student");
    let test = |r: &serde_json::Value| {
        r["stages"][1]["model"]["test"]["accuracy"]
            .as_f64()
            .unwrap()
    };
    let twin = |r: &serde_json::Value| {
        r["stages"][1]["references"][0]["model"]["test"]["accuracy"]
            .as_f64()
            .unwrap()
    };
    let mean = (test(&runs[0]) + test(&runs[1])) / 2.0;
    assert!((student["test"]["mean"].as_f64().unwrap() - mean).abs() < 1e-9);
    let std = (test(&runs[0]) - test(&runs[1])).abs() / 2f64.sqrt();
    assert!((student["test"]["std"].as_f64().unwrap() - std).abs() < 1e-9);
    let paired = &student["references"][0];
    assert!(
        paired["name"].as_str().unwrap().contains("twin"),
        "{paired}"
    );
    let diffs = [
        test(&runs[0]) - twin(&runs[0]),
        test(&runs[1]) - twin(&runs[1]),
    ];
    let d = &paired["test_difference"];
    assert!((d["mean"].as_f64().unwrap() - (diffs[0] + diffs[1]) / 2.0).abs() < 1e-9);
    assert_eq!(d["n"], 2);
    let md = std::fs::read_to_string(dir.path().join("runs/digits-seeds/summary.md")).unwrap();
    assert!(
        md.contains("95% interval") && md.contains("| student |"),
        "{md}"
    );
}

/// Feature-map matches on a ResNet student: FitNets' MSE on stage outputs through learned 1×1
/// projections (the widths differ) and attention transfer, beside KD on logits, logged per
/// pair; a match that needs a projection and has none is refused at --check.
#[test]
fn a_resnet_student_distils_from_the_teachers_feature_maps() {
    let dir = tempfile::tempdir().unwrap();
    let teacher = write_recipe(dir.path(), "");
    let student = write_student(dir.path());
    let stages = |projection: bool| {
        format!(
            r#"[[stage]]
kind = "distill"
name = "student"

[stage.student]
arch = "resnet"
config = "{}"

[[stage.match]]
feature = "hidden"
layers = [[1, 1], [2, 2]]
projection = {projection}
weight = 0.1

[[stage.match]]
feature = "attention"
loss = "mse"
layers = "uniform"
weight = 1.0
"#,
            student.display()
        )
    };
    let bad = write_from_teacher(
        dir.path(),
        "digits-fit-bad",
        &teacher,
        (2, 3e-3),
        &stages(false),
    );
    let out = mopt(&[bad.to_str().unwrap(), "--check"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("match.projection") && stderr(&out).contains("has 4 channels"),
        "{}",
        stderr(&out)
    );
    let recipe = write_from_teacher(dir.path(), "digits-fit", &teacher, (4, 3e-3), &stages(true));
    let check = mopt(&[recipe.to_str().unwrap(), "--check"]);
    assert!(check.status.success(), "{}", stderr(&check));
    let plan = String::from_utf8_lossy(&check.stdout);
    assert!(
        plan.contains("MSE student map 1 ~ teacher map 1")
            && plan.contains("attention transfer student map 2 ~ teacher map 2"),
        "{plan}"
    );
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = read_json(&dir.path().join("runs/digits-fit/report.json"));
    let st = &report["stages"][1];
    assert_eq!(st["model"]["widths"], serde_json::json!([4, 8]));
    let acc = st["model"]["test"]["accuracy"].as_f64().unwrap();
    assert!(acc > 0.3, "student {acc}");
    assert!(
        st["notes"].to_string().contains("feature maps"),
        "{}",
        st["notes"]
    );
    // Every matched pair is logged beside the logits terms: two MSE pairs, two attention pairs.
    let metrics =
        std::fs::read_to_string(dir.path().join("runs/digits-fit/01-student/metrics.jsonl"))
            .unwrap();
    for part in ["map1", "map2", "map3", "map4", "soft"] {
        assert!(
            metrics.contains(&format!("\"{part}\"")),
            "{part} in {metrics}"
        );
    }
    assert!(!metrics.contains("\"map5\""));
    // The student's maps move towards the teacher's: every term falls from the first logged
    // step to the last.
    let train: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["split"] == "train")
        .collect();
    let (first, last) = (&train[0], train.last().unwrap());
    for part in ["map1", "map2", "map3", "map4"] {
        let (a, b) = (first[part].as_f64().unwrap(), last[part].as_f64().unwrap());
        assert!(b < a, "{part}: {a} -> {b}");
    }
}

/// The plain CNN family on the digits through the binary: a CNN teacher fine-tuned first, a
/// narrower CNN distilled from its logits and block outputs, half its channels pruned, the
/// result exported to ONNX with parity in ONNX Runtime; quantization is refused at --check.
#[test]
fn a_plain_cnn_is_trained_distilled_pruned_and_exported() {
    let dir = tempfile::tempdir().unwrap();
    let shape = |name: &str, widths: &str| {
        let json = format!(r#"{{"channels": 1, "image_size": 8, "widths": {widths}}}"#);
        write_shape(dir.path(), name, &json)
    };
    let teacher_shape = shape("cnn.json", "[16, 32]");
    let student_shape = shape("cnn-student.json", "[8, 16]");
    let teacher = write_recipe(dir.path(), "");
    let text = std::fs::read_to_string(&teacher)
        .unwrap()
        .replace("arch = \"resnet\"", "arch = \"cnn\"")
        .replace(
            &dir.path().join("resnet.json").display().to_string(),
            &teacher_shape.display().to_string(),
        );
    std::fs::write(&teacher, text).unwrap();
    let stages = format!(
        r#"[[stage]]
kind = "distill"
name = "student"
baseline = true

[stage.student]
arch = "cnn"
config = "{}"

[[stage.match]]
feature = "hidden"
layers = [[0, 0], [1, 1]]
projection = true
weight = 0.1

[[stage]]
kind = "prune"
targets = ["channels"]
criterion = "bn-scale"
target = 0.5
step = 0.5
hidden-multiple = 2
distill = true

[[stage]]
kind = "export"
samples = 64
latency-runs = 2
reference = ["baseline"]
"#,
        student_shape.display()
    );
    let recipe = write_from_teacher(dir.path(), "digits-cnn", &teacher, (3, 3e-3), &stages);
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = read_json(&dir.path().join("runs/digits-cnn/report.json"));
    let stages = report["stages"].as_array().unwrap();
    assert_eq!(stages[0]["model"]["widths"], serde_json::json!([16, 32]));
    assert_eq!(stages[1]["model"]["widths"], serde_json::json!([8, 16]));
    assert_eq!(stages[2]["model"]["widths"], serde_json::json!([4, 8]));
    let teacher_acc = stages[0]["model"]["test"]["accuracy"].as_f64().unwrap();
    assert!(teacher_acc > 0.8, "teacher {teacher_acc}");
    let card = &stages[3]["facts"]["model_card"];
    assert!(
        card["parity"]["max_abs_err"].as_f64().unwrap() < 1e-4,
        "{card}"
    );
    assert!(card["fused_ops"].to_string().contains("MaxPool"), "{card}");
    // Quantization needs a quantizable family: refused before anything runs.
    let ptq = write_from_teacher(
        dir.path(),
        "digits-cnn-ptq",
        &teacher,
        (1, 1e-3),
        "[[stage]]\nkind = \"ptq\"\n",
    );
    let out = mopt(&[ptq.to_str().unwrap(), "--check"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("`cnn` declares no quantizable layers"),
        "{}",
        stderr(&out)
    );
}

/// Checkpoints carry a manifest of their files' sha256: one byte changed in the weights is
/// caught when they are read back, with a message naming the file.
#[test]
fn a_corrupt_checkpoint_is_named_when_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let teacher = write_recipe(dir.path(), "");
    let out = mopt(&[teacher.to_str().unwrap(), "--max-steps", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let best = dir.path().join("runs/digits/best");
    let manifest = read_json(&best.join("manifest.json"));
    assert_eq!(
        manifest["sha256"]["model.bpk"].as_str().map(str::len),
        Some(64)
    );
    let weights = best.join("model.bpk");
    let mut bytes = std::fs::read(&weights).unwrap();
    let i = bytes.len() - 5;
    bytes[i] ^= 0x40;
    std::fs::write(&weights, bytes).unwrap();
    let stages =
        "[[stage]]\nkind = \"export\"\nsamples = 8\nlatency-runs = 0\nreference = \"none\"\n";
    let recipe = write_from_teacher(dir.path(), "digits-read", &teacher, (1, 1e-3), stages);
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("model.bpk is corrupt") && stderr(&out).contains("manifest.json"),
        "{}",
        stderr(&out)
    );
}

/// A stage never hands on a model worse than its hard-label twin on validation: distilling an
/// untrained ResNet (its random logits, `alpha = 0`) into the student loses to the twin trained
/// on the labels, so the twin is handed on, the distilled model is reported beside it, the
/// report says which and why, and the next stage starts from the twin.
#[test]
fn a_twin_better_on_validation_is_handed_on() {
    let dir = tempfile::tempdir().unwrap();
    let student = write_student(dir.path());
    let stages = format!(
        r#"
[[stage]]
kind = "distill"
alpha = 0.0
baseline = true
[stage.student]
arch = "resnet"
config = "{}"

[[stage]]
kind = "finetune"
[stage.train]
epochs = 1
"#,
        student.display()
    );
    let recipe = write_recipe(dir.path(), "").with_extension("toml");
    let text = std::fs::read_to_string(&recipe).unwrap() + &stages;
    std::fs::write(
        &recipe,
        text.replace("latency-runs = 3", "latency-runs = 0"),
    )
    .unwrap();
    let check = mopt(&[recipe.to_str().unwrap(), "--check"]);
    assert!(check.status.success(), "{}", stderr(&check));
    let plan = String::from_utf8_lossy(&check.stdout);
    assert!(
        plan.contains("the better of the two on validation is handed on"),
        "{plan}"
    );
    let out = mopt(&[recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = read_json(&dir.path().join("runs/digits/report.json"));
    let stage = &report["stages"][1];
    let valid = |m: &serde_json::Value| m["valid"]["accuracy"].as_f64().unwrap();
    let refs = stage["references"].as_array().unwrap();
    let (twin, distilled) = (&refs[0], &refs[1]);
    assert_eq!(twin["name"], "distill (hard-label twin)", "{stage}");
    assert_eq!(distilled["name"], "distill (distilled)", "{stage}");
    eprintln!(
        "valid accuracy: twin {:.4}, distilled from a random teacher {:.4}",
        valid(&twin["model"]),
        valid(&distilled["model"])
    );
    assert!(
        valid(&twin["model"]) > valid(&distilled["model"]) + 0.2,
        "{stage}"
    );
    assert_eq!(stage["facts"]["kept"], "hard-label twin", "{stage}");
    assert_eq!(stage["model"]["sha256"], twin["model"]["sha256"], "{stage}");
    assert!(stage["notes"]
        .to_string()
        .contains("Kept the hard-label twin"));
    // The next stage fine-tunes the twin.
    let next = &report["stages"][2];
    assert_eq!(next["input"]["sha256"], twin["model"]["sha256"], "{next}");
}
