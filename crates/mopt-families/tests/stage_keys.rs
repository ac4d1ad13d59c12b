//! Every `[[stage]]` key of every shipped stage kind swept over every shipped family: each is
//! accepted (parsed and planned, as `--check` does) where it applies and refused where it does
//! not, naming the stage's key (`stage[1].augment-copies`); a kind a family cannot run is
//! refused by `kind`. No family ignores a key in silence. (`checkpoint`'s keys name files and
//! read no family's; its own tests cover them.)

use std::path::{Path, PathBuf};

use mopt_data::TokenizerSpec;
use mopt_recipe::{DataSource, DataSpec, ModelSpec, RecipeError, Scope, StageEntry};
use mopt_stages::stage::{parse_stages, PlanContext};
use mopt_stages::StageError;

const BERT: &str = r#"{"vocab_size": 50, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 16, "max_position_embeddings": 64, "type_vocab_size": 2}"#;
const LLAMA: &str = r#"{"vocab_size": 50, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": true}"#;
const CNN: &str = r#"{"channels": 1, "image_size": 8, "widths": [8, 16]}"#;
const RESNET: &str = r#"{"channels": 1, "image_size": 8, "stages": [
    {"width": 8, "blocks": [8]}, {"width": 16, "blocks": [16]}]}"#;

const FAMILIES: [&str; 4] = ["bert", "resnet", "cnn", "llama"];

/// Who accepts a key: every family that runs the kind, or these.
#[derive(Clone, Copy)]
enum Takers {
    All,
    Only(&'static [&'static str]),
}

/// One swept key: the kind, the TOML written into the stage (the key and what it needs), the
/// key whose name a refusal must carry, and who takes it.
struct Case {
    kind: &'static str,
    toml: &'static str,
    key: &'static str,
    takers: Takers,
    /// Another key a refusal may name (what the family refuses first).
    or: Option<&'static str>,
}

const fn case(kind: &'static str, key: &'static str, toml: &'static str, takers: Takers) -> Case {
    Case {
        kind,
        toml,
        key,
        takers,
        or: None,
    }
}

impl Case {
    const fn or(mut self, key: &'static str) -> Self {
        self.or = Some(key);
        self
    }
}

use Takers::{All, Only};

/// The families that run a kind at all (the others refuse it by `kind`).
fn runs(kind: &str, family: &str) -> bool {
    match kind {
        "vocab" => family == "bert",
        "ptq" | "qat" => family != "cnn",
        _ => true,
    }
}

fn cases() -> Vec<Case> {
    const BERT_ONLY: Takers = Only(&["bert"]);
    const IMAGES: Takers = Only(&["resnet", "cnn"]);
    const LOGITS_CACHE: Takers = Only(&["resnet", "cnn", "llama"]);
    const NOT_LLAMA: Takers = Only(&["bert", "resnet", "cnn"]);
    vec![
        case("finetune", "no-such-key", "no-such-key = 1", Only(&[])),
        // distill: the objective's keys apply to every family's logits.
        case("distill", "enabled", "enabled = true", All),
        case("distill", "alpha", "alpha = { from = 0.7, to = 0.3 }", All),
        case("distill", "temperature", "temperature = 2.0", All),
        case("distill", "soft-loss", "soft-loss = \"mse\"", All),
        case("distill", "teacher-cache", "teacher-cache = false", All),
        case("distill", "baseline", "baseline = true", All),
        case("distill", "teacher-top-k", "teacher-top-k = 8", LOGITS_CACHE),
        case("distill", "augment-copies", "augment-copies = 2", BERT_ONLY),
        case(
            "distill",
            "augment-replace",
            "augment-copies = 2\naugment-replace = 0.3",
            BERT_ONLY,
        ),
        case(
            "distill",
            "augment-neighbours",
            "augment-copies = 2\naugment-neighbours = 5",
            BERT_ONLY,
        ),
        case("distill", "no-such-key", "no-such-key = 1", Only(&[])),
        // The student's table is its family's.
        case("distill", "student.dropout", "student.dropout = 0.2", BERT_ONLY),
        case(
            "distill",
            "student.init-from-teacher-layers",
            "student.init-from-teacher-layers = [0, 1]",
            BERT_ONLY,
        ),
        // Intermediate matches: where a family exposes taps.
        case(
            "distill",
            "match",
            "match = [{ feature = \"hidden\", layers = [[1, 1]], projection = true }]",
            NOT_LLAMA,
        ),
        case(
            "distill",
            "match.weight",
            "match = [{ feature = \"hidden\", layers = [[1, 1]], weight = 0.5 }]",
            NOT_LLAMA,
        ),
        case(
            "distill",
            "match.until-epoch",
            "match = [{ feature = \"hidden\", layers = [[1, 1]], until-epoch = 1 }]",
            NOT_LLAMA,
        ),
        case(
            "distill",
            "match.feature",
            "match = [{ feature = \"embeddings\" }]",
            BERT_ONLY,
        ),
        case(
            "distill",
            "match.heads",
            "match = [{ feature = \"attention\", layers = [[1, 1]], heads = \"mean\" }]",
            BERT_ONLY,
        ),
        case(
            "distill",
            "match.tokens",
            "match = [{ feature = \"hidden\", layers = [[1, 1]], tokens = \"cls\" }]",
            BERT_ONLY,
        ),
        // Keys nothing would read: the teacher's terms without a teacher, a cache beside a
        // teacher that runs live, heads where there are none, a width where none is compared.
        case("distill", "alpha", "enabled = false\nalpha = 0.5", Only(&[])),
        case(
            "distill",
            "match",
            "enabled = false\nmatch = [{ feature = \"hidden\", layers = [[1, 1]] }]",
            Only(&[]),
        ),
        case(
            "distill",
            "teacher-cache",
            "teacher-cache = true\nmatch = [{ feature = \"hidden\", layers = [[1, 1]], projection = true }]",
            BERT_ONLY,
        )
        .or("match"),
        case(
            "distill",
            "match.heads",
            "match = [{ feature = \"hidden\", layers = [[1, 1]], heads = \"mean\" }]",
            Only(&[]),
        ),
        case(
            "distill",
            "match.projection",
            "match = [{ feature = \"attention\", layers = [[1, 1]], projection = true }]",
            Only(&[]),
        ),
        case("prune", "alpha", "distill = false\nalpha = 0.5", Only(&[])),
        case("prune", "ignore-layers", "ignore-layers = [5]", Only(&[])),
        case(
            "prune",
            "taylor-batches",
            "criterion = \"l1\"\ntaylor-batches = 2",
            Only(&[]),
        ),
        case("ptq", "momentum", "observer = \"min-max\"\nmomentum = 0.1", Only(&[])),
        // prune (targets: every group kind of the family).
        case("prune", "criterion", "criterion = \"l1\"", All),
        case("prune", "criterion", "criterion = \"bn-scale\"", IMAGES),
        case(
            "prune",
            "criterion",
            "criterion = \"activation-mean\"",
            Only(&["llama"]),
        ),
        case("prune", "reduce", "reduce = \"mean\"", All),
        case("prune", "ranking", "ranking = \"global\"", All),
        case("prune", "target", "target = 0.3", All),
        case("prune", "step", "step = 0.25", All),
        case("prune", "taylor-batches", "taylor-batches = 2", All),
        case("prune", "seed", "seed = 7", All),
        case("prune", "compare", "compare = [\"l1\"]", All),
        case("prune", "distill", "distill = false", All),
        case("prune", "alpha", "alpha = 0.3", All),
        case("prune", "temperature", "temperature = 2.0", All),
        case("prune", "teacher-top-k", "teacher-top-k = 8", All),
        case("prune", "baseline", "baseline = true", All),
        case("prune", "ratios", "ratios = { \"*\" = 0.3 }", All),
        case("prune", "ignore-layers", "ignore-layers = [0]", Only(&["bert", "llama"])),
        case("prune", "min-heads", "min-heads = 1", Only(&["bert", "llama"])),
        case("prune", "ffn-multiple", "ffn-multiple = 4", Only(&["bert", "llama"])),
        case("prune", "hidden-multiple", "hidden-multiple = 2", All),
        case("prune", "no-such-key", "no-such-key = 1", Only(&[])),
        // vocab: BERT's token table only.
        case("vocab", "min-count", "min-count = 2", All),
        // ptq and qat (the kinds a family runs).
        case("ptq", "weight-bits", "weight-bits = 8", All),
        case(
            "ptq",
            "weight-granularity",
            "weight-granularity = \"per-tensor\"",
            All,
        ),
        case("ptq", "activation-bits", "activation-bits = 8", All),
        case("ptq", "activation-symmetric", "activation-symmetric = true", All),
        case("ptq", "observer", "observer = \"min-max\"", All),
        case(
            "ptq",
            "percentile",
            "observer = \"percentile\"\npercentile = 99.9",
            All,
        ),
        case(
            "ptq",
            "momentum",
            "observer = \"moving-average\"\nmomentum = 0.1",
            All,
        ),
        case("ptq", "calibration-samples", "calibration-samples = 8", All),
        case("ptq", "include", "include = [\"*\"]", All),
        case("ptq", "exclude", "exclude = [\"*1*\"]", All),
        case("ptq", "sensitivity", "sensitivity = true", All),
        case("ptq", "max-fallback", "max-fallback = 2", All),
        case("ptq", "embeddings", "embeddings = true", BERT_ONLY),
        case("ptq", "smooth", "smooth = 0.5", Only(&["llama"])),
        case("ptq", "learned-scales", "learned-scales = true", Only(&[])),
        case("qat", "learned-scales", "learned-scales = true", All),
        case("qat", "distill", "distill = true", All),
        case("qat", "alpha", "alpha = 0.3", All),
        case("qat", "temperature", "temperature = 2.0", All),
        case("qat", "teacher-top-k", "teacher-top-k = 8", All),
        case("qat", "sensitivity", "sensitivity = true", Only(&[])),
        // export
        case("export", "samples", "samples = 8", All),
        case("export", "tolerance", "tolerance = 1e-3", All),
        case("export", "latency-runs", "latency-runs = 0", All),
        case("export", "reference", "reference = \"none\"", All),
        case("export", "convert", "convert = [\"hf\"]", BERT_ONLY),
        case("export", "convert", "convert = [\"gguf\"]", Only(&["llama"])),
        case("export", "no-such-key", "no-such-key = 1", Only(&[])),
    ]
}

/// A family's run as planning sees it: its baseline shape and the context of its data.
struct Fixture {
    arch: &'static str,
    config: PathBuf,
    tokenizer: Option<TokenizerSpec>,
    data: DataSpec,
    labels: Vec<String>,
}

fn fixture(dir: &Path, arch: &'static str) -> Fixture {
    let (text, format, classes) = match arch {
        "bert" => (BERT, "csv", 2),
        "llama" => (LLAMA, "text-files", 50),
        "cnn" => (CNN, "pixels-csv", 10),
        _ => (RESNET, "pixels-csv", 10),
    };
    let config = dir.join(format!("{arch}.json"));
    std::fs::write(&config, text).unwrap();
    let tokenizer = matches!(arch, "bert" | "llama").then(|| TokenizerSpec {
        path: dir.join("tokenizer.json"),
        max_len: 16,
        lowercase: false,
    });
    let mut keys = toml::Table::new();
    if format == "csv" {
        keys.insert("text-column".into(), "text".into());
        keys.insert("label-column".into(), "label".into());
    }
    let data = DataSpec {
        format: format.into(),
        source: DataSource::Single {
            path: dir.join("data"),
            valid_fraction: 0.1,
            test_fraction: 0.1,
        },
        split_seed_written: Some(0),
        max_train: None,
        max_eval: None,
        cache_dir: None,
        keys,
        written: Default::default(),
        scope: Scope::root(Path::new("recipe.toml"), "[data]\n").nested("data"),
    };
    Fixture {
        arch,
        config,
        tokenizer,
        data,
        labels: (0..classes).map(|i| i.to_string()).collect(),
    }
}

/// `extra` merged into `base`, tables key by key.
fn merge(base: &mut toml::Table, extra: toml::Table) {
    for (k, v) in extra {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(e)) => merge(b, e),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Parse and plan one stage of `kind` (what every stage of the kind needs, then `toml`) for
/// the fixture's family, trained for 2 epochs.
fn plan(f: &Fixture, kind: &str, toml: &str) -> Result<(), StageError> {
    let registry = mopt_families::builtin();
    let family = registry.family(f.arch).expect("a shipped family");
    let mut settings = toml::Table::new();
    match kind {
        "distill" => {
            let mut student = toml::Table::new();
            student.insert("config".into(), f.config.display().to_string().into());
            settings.insert("student".into(), student.into());
        }
        "prune" => {
            let targets = family
                .capability::<dyn mopt_stages::kinds::prune::CanPrune>()
                .expect("prunes")
                .targets();
            settings.insert("targets".into(), targets.into());
        }
        _ => {}
    }
    merge(
        &mut settings,
        toml::from_str(toml).unwrap_or_else(|e| panic!("{kind}: {toml}: {e}")),
    );
    let source = format!(
        "[[stage]]\nkind = \"{kind}\"\n{}",
        toml::to_string(&settings).unwrap()
    );
    let entry = StageEntry {
        index: 1,
        kind: kind.into(),
        name: kind.into(),
        train: mopt_recipe::TrainSpec {
            epochs: 2,
            ..Default::default()
        },
        train_overridden: false,
        gate: None,
        settings,
        scope: Scope::root(Path::new("recipe.toml"), &source).stage(1),
    };
    let stage = parse_stages(&registry, std::slice::from_ref(&entry), family)?.remove(0);
    let model_scope = Scope::root(Path::new("recipe.toml"), "[model]\n").nested("model");
    let model = ModelSpec::builder(&f.config).build(&model_scope).unwrap();
    let input = family.model_shape(&model, f.tokenizer.as_ref(), &model_scope, &f.labels, 50)?;
    let cx = PlanContext {
        family,
        registry: &registry,
        tokenizer: f.tokenizer.clone(),
        data: &f.data,
        vocab: if f.tokenizer.is_some() { 50 } else { 0 },
        train_examples: 64,
        mean_tokens: 12.0,
        mean_tokens_sq: 160.0,
        earlier: vec!["baseline".into()],
    };
    stage.plan(&entry, &input, &cx).map(|_| ())
}

/// The names a refusal of `key` may carry: the key, the table it sits in (a family without
/// taps refuses `match` whole), and for TinyBERT's augmentation `augment-copies`, which turns
/// it on.
fn names_for(key: &str) -> Vec<String> {
    let mut names = vec![format!("stage[1].{key}")];
    if let Some((table, _)) = key.split_once('.') {
        names.push(format!("stage[1].{table}"));
    }
    if key.starts_with("augment-") {
        names.push("stage[1].augment-copies".into());
    }
    names
}

/// The key a refusal names, or the error when it names none.
fn refused_key(e: StageError) -> Result<String, String> {
    match e {
        StageError::Train(mopt_train::TrainError::Recipe(RecipeError::Invalid(i))) => Ok(i.key),
        other => Err(other.to_string()),
    }
}

#[test]
fn every_stage_key_is_taken_where_it_applies_and_refused_by_name_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures: Vec<Fixture> = FAMILIES.iter().map(|a| fixture(dir.path(), a)).collect();
    let mut wrong = Vec::new();
    let (mut taken, mut refused) = (0, 0);
    // Every kind a family runs plans bare.
    for f in &fixtures {
        for kind in [
            "finetune", "distill", "prune", "vocab", "ptq", "qat", "export",
        ] {
            let got = plan(f, kind, "");
            match (runs(kind, f.arch), got) {
                (true, Err(e)) => wrong.push(format!("{}: bare {kind}: {e}", f.arch)),
                (false, Ok(())) => wrong.push(format!("{}: ran {kind}", f.arch)),
                _ => {}
            }
        }
    }
    for c in cases() {
        for f in &fixtures {
            let applies = runs(c.kind, f.arch)
                && match c.takers {
                    All => true,
                    Only(list) => list.contains(&f.arch),
                };
            let mut names = match runs(c.kind, f.arch) {
                true => names_for(c.key),
                false => names_for("kind"),
            };
            names.extend(c.or.map(|k| format!("stage[1].{k}")));
            let at = format!("{} {}: `{}`", f.arch, c.kind, c.toml.replace('\n', "; "));
            match (applies, plan(f, c.kind, c.toml)) {
                (true, Ok(())) => taken += 1,
                (true, Err(e)) => wrong.push(format!("{at}: refused: {e}")),
                (false, Ok(())) => wrong.push(format!("{at}: taken, not its key")),
                (false, Err(e)) => match refused_key(e) {
                    Ok(k) if names.contains(&k) => refused += 1,
                    Ok(k) => wrong.push(format!("{at}: refused naming `{k}`, not {names:?}")),
                    Err(e) => wrong.push(format!("{at}: refused naming no key: {e}")),
                },
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    eprintln!("stage keys: {taken} taken, {refused} refused by name");
    assert!(
        taken > 150 && refused > 60,
        "{taken} taken, {refused} refused"
    );
}
