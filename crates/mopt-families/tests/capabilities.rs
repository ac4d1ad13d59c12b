//! The shipped families list the capabilities their stages need: every kind parses for BERT,
//! `ptq` and `qat` for the Llama, and a ResNet (no vocabulary) and a CNN (no quantizable layers) are refused by the kinds they
//! lack, by name.

use std::path::Path;

use mopt_recipe::{Scope, StageEntry, TrainSpec};
use mopt_stages::kinds::prune::CanPrune;
use mopt_stages::stage::parse_stages;

fn entry(kind: &str) -> StageEntry {
    let source = format!("[[stage]]\nkind = \"{kind}\"\n");
    let scope = Scope::root(Path::new("recipe.toml"), &source).stage(1);
    StageEntry {
        index: 1,
        kind: kind.into(),
        name: kind.into(),
        train: TrainSpec::default(),
        train_overridden: false,
        gate: None,
        settings: Default::default(),
        scope,
    }
}

#[test]
fn bert_has_every_capability_and_the_image_families_lack_theirs_by_name() {
    let registry = mopt_families::builtin();
    let bert = registry
        .family("bert-classifier")
        .expect("BERT is registered under its alias");
    let targets = bert
        .capability::<dyn CanPrune>()
        .expect("BERT prunes")
        .targets();
    assert_eq!(targets, ["heads", "ffn", "hidden", "layers"]);
    for kind in [
        "finetune", "prune", "ptq", "qat", "vocab", "distill", "export",
    ] {
        // (A distill stage without a student is refused, for that reason.)
        if let Err(e) = parse_stages(&registry, &[entry(kind)], bert) {
            assert!(
                kind == "distill" && e.to_string().contains("student"),
                "{e}"
            );
        }
    }
    // The Llama family quantizes and exports through the same kinds.
    let llama = registry.family("llama").expect("registered");
    for kind in ["ptq", "qat", "export"] {
        if let Err(e) = parse_stages(&registry, &[entry(kind)], llama) {
            panic!("llama: {kind}: {e}");
        }
    }
    for (arch, kind, why) in [
        ("resnet", "vocab", "a token-embedding table"),
        ("cnn", "ptq", "a quantizable model"),
        ("llama", "vocab", "a token-embedding table"),
    ] {
        let f = registry.family(arch).expect("registered");
        let err = parse_stages(&registry, &[entry(kind)], f)
            .err()
            .expect("refused");
        let err = err.to_string();
        assert!(err.contains(&format!("kind `{kind}` needs {why}")), "{err}");
    }
}
