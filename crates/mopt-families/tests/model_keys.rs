//! Every `[model]` key of every shipped family swept over every shipped family: its owner
//! accepts it, every other family refuses it naming the section, the key and the keys it
//! takes; no family ignores a key in silence. The tokenizer's length limit is the model's.

use std::path::{Path, PathBuf};

use mopt_data::TokenizerSpec;
use mopt_recipe::{ModelSpec, RecipeError, Scope};
use mopt_stages::StageError;

const BERT_CONFIG: &str = r#"{"vocab_size": 50, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 16, "max_position_embeddings": 64, "type_vocab_size": 2}"#;

fn llama_config(positions: usize) -> String {
    format!(
        r#"{{"vocab_size": 50, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "max_position_embeddings": {positions}, "rms_norm_eps": 1e-5, "tie_word_embeddings": true}}"#
    )
}

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/models")
}

/// Each family, the config file its `[model]` reads, its labels.
fn families(dir: &Path) -> Vec<(&'static str, PathBuf, Vec<String>)> {
    std::fs::write(dir.join("bert.json"), BERT_CONFIG).unwrap();
    std::fs::write(dir.join("llama.json"), llama_config(4096)).unwrap();
    let classes = |n: usize| (0..n).map(|i| i.to_string()).collect::<Vec<_>>();
    vec![
        ("bert", dir.join("bert.json"), classes(2)),
        (
            "resnet",
            models_dir().join("resnet-fmnist.json"),
            classes(10),
        ),
        ("cnn", models_dir().join("cnn-fmnist.json"), classes(10)),
        ("llama", dir.join("llama.json"), classes(50)),
    ]
}

/// Every key a shipped family declares in its `[model]`, with a value it accepts, and the
/// family that declares it.
fn owned_keys() -> Vec<(&'static str, toml::Value, &'static str)> {
    let list = |v: &[i64]| toml::Value::from(v.to_vec());
    vec![
        ("weights", "w.safetensors".into(), "bert"),
        ("allow-fresh-head", true.into(), "bert"),
        ("dropout", 0.2.into(), "bert"),
        ("overrides.num-hidden-layers", 1.into(), "bert"),
        ("overrides.hidden-size", 8.into(), "bert"),
        ("overrides.num-attention-heads", 2.into(), "bert"),
        ("overrides.intermediate-size", 12.into(), "bert"),
        ("overrides.layer-heads", list(&[2, 1]), "bert"),
        ("overrides.layer-intermediate-sizes", list(&[16, 8]), "bert"),
        ("overrides.hidden-act", "gelu-tanh".into(), "bert"),
        ("no-such-key", 1.into(), "nobody"),
    ]
}

fn scope(dir: &Path) -> Scope {
    Scope::root(&dir.join("recipe.toml"), "[model]\nconfig = \"x\"\n").nested("model")
}

fn tokenizer(dir: &Path, max_len: usize) -> TokenizerSpec {
    TokenizerSpec {
        path: dir.join("tokenizer.json"),
        max_len,
        lowercase: true,
    }
}

fn shape_of(
    arch: &str,
    m: &ModelSpec,
    tok: Option<&TokenizerSpec>,
    labels: &[String],
) -> Result<(), StageError> {
    let registry = mopt_families::builtin();
    let family = registry.family(arch).expect("a shipped family");
    let tok = (arch == "bert" || arch == "llama").then_some(tok).flatten();
    family.model_shape(m, tok, &m.scope, labels, 50).map(|_| ())
}

fn invalid(e: StageError) -> mopt_recipe::Invalid {
    match e {
        StageError::Train(mopt_train::TrainError::Recipe(RecipeError::Invalid(i))) => *i,
        other => panic!("not a recipe error: {other}"),
    }
}

#[test]
fn every_model_key_is_accepted_by_its_family_and_refused_by_name_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("w.safetensors"), "").unwrap();
    let tok = tokenizer(dir.path(), 16);
    let mut refused = 0;
    for (arch, config, labels) in families(dir.path()) {
        let base = || ModelSpec::builder(&config);
        shape_of(
            arch,
            &base().build(&scope(dir.path())).unwrap(),
            Some(&tok),
            &labels,
        )
        .unwrap_or_else(|e| panic!("{arch}: the bare table: {e}"));
        for (key, value, owner) in owned_keys() {
            let m = base().set(key, value).build(&scope(dir.path())).unwrap();
            let got = shape_of(arch, &m, Some(&tok), &labels);
            if owner == arch {
                got.unwrap_or_else(|e| panic!("{arch} refused its own key {key}: {e}"));
                continue;
            }
            let e = invalid(got.expect_err(&format!("{arch} accepted `{key}`, not its key")));
            // A family without the sub-table refuses the table (`overrides`) itself.
            let named = match key.split_once('.') {
                Some((table, _)) => table,
                None => key,
            };
            assert_eq!(e.key, format!("model.{named}"), "{arch}: {key}");
            let says =
                format!("a `{arch}` model table has no key `{named}`; it takes `arch`, `config`");
            assert!(e.message.starts_with(&says), "{arch}: {key}: {}", e.message);
            refused += 1;
        }
    }
    // Three families refuse BERT's ten keys, and all four the unknown one.
    assert_eq!(refused, 3 * 10 + 4);
}

/// A baseline `[model]` has no teacher: BERT refuses `init-from-teacher-layers` there by name.
#[test]
fn a_baseline_bert_refuses_teacher_layers() {
    let dir = tempfile::tempdir().unwrap();
    let (_, config, labels) = families(dir.path()).remove(0);
    let m = ModelSpec::builder(config)
        .set("init-from-teacher-layers", vec![0])
        .build(&scope(dir.path()))
        .unwrap();
    let e = invalid(shape_of("bert", &m, Some(&tokenizer(dir.path(), 16)), &labels).unwrap_err());
    assert_eq!(e.key, "model.init-from-teacher-layers");
    assert!(e.message.contains("no teacher"), "{}", e.message);
}

/// `[tokenizer] max-len` is bounded by the model: BERT's position table, a Llama's context.
#[test]
fn the_tokenizer_length_limit_is_the_models() {
    let dir = tempfile::tempdir().unwrap();
    let fams = families(dir.path());
    let build = |config: &Path| {
        ModelSpec::builder(config)
            .build(&scope(dir.path()))
            .unwrap()
    };
    let (_, bert, bert_labels) = &fams[0];
    let (_, llama, llama_labels) = &fams[3];
    // BERT: 64 positions in this config.
    shape_of(
        "bert",
        &build(bert),
        Some(&tokenizer(dir.path(), 64)),
        bert_labels,
    )
    .unwrap();
    let e = invalid(
        shape_of(
            "bert",
            &build(bert),
            Some(&tokenizer(dir.path(), 65)),
            bert_labels,
        )
        .unwrap_err(),
    );
    assert_eq!(e.key, "tokenizer.max-len");
    assert!(
        e.message.contains("65 exceeds the model's 64 positions"),
        "{}",
        e.message
    );
    // A Llama of 4096 positions reads 2048-token windows (past BERT's 512), not 8192.
    shape_of(
        "llama",
        &build(llama),
        Some(&tokenizer(dir.path(), 2048)),
        llama_labels,
    )
    .unwrap();
    let e = invalid(
        shape_of(
            "llama",
            &build(llama),
            Some(&tokenizer(dir.path(), 8192)),
            llama_labels,
        )
        .unwrap_err(),
    );
    assert_eq!(e.key, "tokenizer.max-len");
    assert!(
        e.message
            .contains("8192 exceeds the model's context of 4096"),
        "{}",
        e.message
    );
}

/// A `prune` stage of `family` targeting every group kind it has, with `extra` keys.
fn parse_prune(
    family: &str,
    extra: &[(&str, toml::Value)],
    targets: Option<Vec<&str>>,
) -> Result<(), RecipeError> {
    let registry = mopt_families::builtin();
    let f = registry.family(family).expect("a shipped family");
    let all = f
        .capability::<dyn mopt_stages::kinds::prune::CanPrune>()
        .expect("prunes")
        .targets();
    let mut settings = toml::Table::new();
    let targets: Vec<&str> = targets.unwrap_or(all);
    settings.insert("targets".into(), targets.into());
    for (k, v) in extra {
        settings.insert(k.to_string(), v.clone());
    }
    let source = "[[stage]]\nkind = \"prune\"\n";
    let entry = mopt_recipe::StageEntry {
        index: 1,
        kind: "prune".into(),
        name: "prune".into(),
        train: Default::default(),
        train_overridden: false,
        gate: None,
        settings,
        scope: Scope::root(Path::new("recipe.toml"), source).stage(1),
    };
    mopt_stages::stage::parse_stages(&registry, &[entry], f).map(|_| ())
}

/// Pruning limits are the group kinds': each is taken where a targeted group kind declares it
/// and refused by name elsewhere, with the limits the family's groups take.
#[test]
fn every_prune_limit_is_its_group_kinds() {
    let declared = [
        (
            "bert",
            &["min-heads", "ffn-multiple", "hidden-multiple"][..],
        ),
        ("llama", &["min-heads", "ffn-multiple", "hidden-multiple"]),
        ("resnet", &["hidden-multiple"]),
        ("cnn", &["hidden-multiple"]),
    ];
    let mut refused = 0;
    for (family, takes) in declared {
        parse_prune(family, &[], None).unwrap_or_else(|e| panic!("{family}: {e}"));
        for key in ["min-heads", "ffn-multiple", "hidden-multiple"] {
            let got = parse_prune(family, &[(key, 2.into())], None);
            if takes.contains(&key) {
                got.unwrap_or_else(|e| panic!("{family} refused its limit {key}: {e}"));
                continue;
            }
            let RecipeError::Invalid(e) = got.expect_err(&format!("{family} took {key}")) else {
                panic!("not a recipe error")
            };
            assert_eq!(e.key, format!("stage[1].{key}"), "{family}");
            assert!(
                e.message.contains(&format!("unknown field `{key}`")),
                "{}",
                e.message
            );
            for own in takes {
                assert!(e.hint.contains(&format!("`{own}`")), "{family}: {}", e.hint);
            }
            refused += 1;
        }
        // A limit whose group the stage does not target is refused, naming the group (the
        // CNN's one group kind reads it).
        if family == "cnn" {
            continue;
        }
        let RecipeError::Invalid(e) = parse_prune(
            family,
            &[("hidden-multiple", 4.into())],
            Some(vec![if family == "resnet" {
                "blocks"
            } else {
                "layers"
            }]),
        )
        .expect_err("a limit of an untargeted group") else {
            panic!("not a recipe error")
        };
        assert!(
            e.message.contains("limits the `")
                && e.message.contains("which this stage does not target"),
            "{family}: {}",
            e.message
        );
    }
    // Zero is no limit.
    assert!(parse_prune("bert", &[("min-heads", 0.into())], None).is_err());
    // The two image families refuse BERT's and the Llama's two other limits.
    assert_eq!(refused, 4);
}
