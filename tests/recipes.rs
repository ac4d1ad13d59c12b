//! Recipe validation: typed results for good recipes, precise errors for bad ones.

mod common;

use mopt_recipe::{parse, BestMetric, DataSource};

fn good(dir: &std::path::Path) -> (std::path::PathBuf, String) {
    let p = common::write_tiny_recipe(dir, "r", "");
    let s = std::fs::read_to_string(&p).unwrap();
    (p, s)
}

fn line_of(src: &str, needle: &str) -> usize {
    src.lines().position(|l| l.starts_with(needle)).unwrap() + 1
}

#[test]
fn good_recipe_validates_into_typed_values() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, s) = good(tmp.path());
    let r = parse(&p, &s).unwrap();
    assert_eq!(r.run.name, "r");
    assert_eq!(r.run.run_dir(), tmp.path().join("runs/r"));
    assert_eq!(r.data.format, "rotten-tomatoes");
    assert!(
        matches!(r.data.source, DataSource::Single { valid_fraction, test_fraction, .. } if valid_fraction == 0.1 && test_fraction == 0.1)
    );
    assert_eq!(r.train.best_metric, BestMetric::Accuracy);
    assert_eq!(r.train.grad_clip_norm, Some(1.0));
    assert_eq!(r.train.eval_batch_size, 32);
    assert_eq!(mopt_stages::data::text::tokenizer(&r).unwrap().max_len, 32);
}

#[test]
fn relative_paths_resolve_against_the_recipe_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, s) = good(tmp.path());
    let s = s.replace(
        &tmp.path().join("tiny-config.json").display().to_string(),
        "tiny-config.json",
    );
    let r = parse(&p, &s).unwrap();
    assert_eq!(
        r.model.as_ref().unwrap().config,
        tmp.path().join("tiny-config.json")
    );
}

#[test]
fn errors_name_file_line_key_and_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, s) = good(tmp.path());
    // Through the registry, as a run checks a recipe: the data format's keys are its own.
    let check = |src: String, key: &str, line: usize, what: &str| {
        let msg = pipeline_err(&p, &src);
        assert!(
            msg.contains(&format!("tiny.toml:{line}:")),
            "line {line} in: {msg}"
        );
        assert!(msg.contains(key), "key {key} in: {msg}");
        assert!(msg.contains(what), "`{what}` in: {msg}");
        assert!(msg.contains("fix:"), "a fix in: {msg}");
    };
    let bad = s.replace("lr = 1e-3", "lr = 0.0");
    check(
        bad.clone(),
        "train.lr",
        line_of(&bad, "lr ="),
        "not in (0, 1]",
    );
    let bad = s.replace("epochs = 2", "epochs = 0");
    check(
        bad.clone(),
        "train.epochs",
        line_of(&bad, "epochs ="),
        "at least 1",
    );
    let bad = s.replace("log-every = 2", "log-every = 2\nbest-metric = \"bleu\"");
    check(
        bad.clone(),
        "train.best-metric",
        line_of(&bad, "best-metric"),
        "unknown metric `bleu`",
    );
    let bad = s.replace("seed = 7", "seed = 7\ncolour = \"red\"");
    check(
        bad.clone(),
        "colour",
        line_of(&bad, "colour"),
        "unknown field",
    );
    let bad = s.replace("seed = 7", "seed = \"seven\"");
    check(
        bad.clone(),
        "invalid type",
        line_of(&bad, "seed"),
        "expected u64",
    );
    let bad = s.replace("max-train = 96", "max-train = 96\nvalid-fraction = 1.5");
    check(
        bad.clone(),
        "data.valid-fraction",
        line_of(&bad, "valid-fraction"),
        "outside [0, 1)",
    );
    let bad = s.replace("name = \"r\"", "name = \"a/b\"");
    check(
        bad.clone(),
        "run.name",
        line_of(&bad, "name ="),
        "not a usable run-folder name",
    );
    // A section no one reads: named, with the sections the data format reads.
    let bad = s.replace("[train]", "[training]");
    check(
        bad.clone(),
        "training",
        line_of(&bad, "[training]"),
        "not a section of this recipe",
    );
    // csv data needs its columns.
    let bad = s.replace("format = \"rotten-tomatoes\"", "format = \"csv\"");
    check(
        bad.clone(),
        "data.text-column",
        line_of(&bad, "[data]"),
        "required for csv",
    );
}

#[test]
fn shipped_recipes_validate() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "toml") {
            let s = std::fs::read_to_string(&p).unwrap();
            let r = parse(&p, &s).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            for st in r.stages.iter().filter(|st| st.kind == "distill") {
                // Every shipped distillation recipe reports its hard-label twin.
                assert_eq!(
                    st.settings.get("baseline"),
                    Some(&toml::Value::Boolean(true)),
                    "{}: baseline = true expected",
                    p.display()
                );
            }
            mopt_stages::Pipeline::from_recipe(r, &mopt_families::builtin())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            n += 1;
        }
    }
    assert!(n >= 3, "found {n} recipes in {}", dir.display());
}

/// The error of loading `src` as a pipeline (recipe and stage kinds).
fn pipeline_err(p: &std::path::Path, src: &str) -> String {
    let e = match parse(p, src) {
        Err(e) => return e.to_string(),
        Ok(r) => match mopt_stages::Pipeline::from_recipe(r, &mopt_families::builtin()) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted:\n{src}"),
        },
    };
    e
}

#[test]
fn stages_default_merge_their_training_and_get_unique_names() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, s) = good(tmp.path());
    // No [[stage]]: one finetune stage with the shared [train].
    let r = parse(&p, &s).unwrap();
    assert_eq!(r.stages.len(), 1);
    assert_eq!(r.stages[0].kind, "finetune");
    assert_eq!(r.stages[0].train.lr, 1e-3);
    let src = format!("{s}\n[[stage]]\nkind = \"finetune\"\n\n[[stage]]\nkind = \"finetune\"\n[stage.train]\nlr = 1e-4\n[stage.gate]\nmax-drop = 0.02\nagainst = \"previous\"\n");
    let r = parse(&p, &src).unwrap();
    let names: Vec<String> = r.stages.iter().map(|st| st.dir_name()).collect();
    assert_eq!(names, ["01-finetune", "02-finetune-2"]);
    assert_eq!((r.stages[0].train.lr, r.stages[1].train.lr), (1e-3, 1e-4));
    assert_eq!(
        r.stages[1].train.epochs, 2,
        "keys not overridden come from [train]"
    );
    assert!(r.stages[1].train_overridden && !r.stages[0].train_overridden);
    let g = r.stages[1].gate.as_ref().unwrap();
    assert_eq!(g.max_worse, Some(0.02));
    assert_eq!(g.against, mopt_recipe::GateReference::Previous);
    assert_eq!(
        g.to_toml(),
        "{ metric = \"accuracy\", max-drop = 0.02, against = \"previous\", on-fail = \"rollback\" }"
    );
    // A lower-is-better metric: its tolerance is a rise, and best-metric may name it too.
    let src = format!("{s}\n[[stage]]\nkind = \"finetune\"\n[stage.train]\nbest-metric = \"perplexity\"\n[stage.gate]\nmetric = \"perplexity\"\nmax-relative-rise = 0.3\n");
    let r = parse(&p, &src).unwrap();
    let g = r.stages[0].gate.as_ref().unwrap();
    assert_eq!(g.metric, mopt_recipe::Metric::Perplexity);
    assert_eq!((g.max_worse, g.max_relative_worse), (None, Some(0.3)));
    assert_eq!(r.stages[0].train.best_metric, BestMetric::Perplexity);
    assert_eq!(
        g.to_toml(),
        "{ metric = \"perplexity\", max-relative-rise = 0.3, against = \"baseline\", on-fail = \"rollback\" }"
    );
}

#[test]
fn stage_errors_name_the_stage_its_line_and_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, s) = good(tmp.path());
    let cases: [(&str, &str, &[&str]); 13] = [
        (
            "[[stage]]\nkind = \"sparsify\"\n",
            "kind = \"sparsify\"",
            &["`stage[1].kind`", "unknown stage kind `sparsify`", "`finetune`", "`distill`", "`prune`", "`export`"],
        ),
        (
            "[[stage]]\nkind = \"finetune\"\nalpha = 0.5\n",
            "alpha = 0.5",
            &["`stage[1].alpha`", "unknown field `alpha`", "fix:"],
        ),
        (
            "[[stage]]\nkind = \"finetune\"\n[stage.train]\nlr = 1e-4\n\n[[stage]]\nkind = \"finetune\"\n[stage.train]\nlr = -1.0\n",
            "lr = -1.0",
            &["`stage[2].train.lr`", "not in (0, 1]"],
        ),
        (
            "[[stage]]\nkind = \"finetune\"\n[stage.gate]\nagainst = \"baseline\"\n",
            "[stage.gate]",
            &["`stage[1].gate.max-drop`", "needs a tolerance"],
        ),
        (
            "[[stage]]\nkind = \"finetune\"\n[stage.gate]\nmax-drop = 0.01\non-fail = \"retry\"\n",
            "on-fail = \"retry\"",
            &["`stage[1].gate.on-fail`", "has no gentler retry", "rollback"],
        ),
        (
            "[[stage]]\nkind = \"finetune\"\n[stage.gate]\nmetric = \"perplexity\"\nmax-drop = 0.5\n",
            "max-drop = 0.5",
            &["`stage[1].gate.max-drop`", "perplexity is lower better: a gate on it limits its rise", "write `max-rise` instead"],
        ),
        (
            "[[stage]]\nkind = \"finetune\"\n[stage.gate]\nmax-relative-rise = 0.1\n",
            "max-relative-rise = 0.1",
            &["`stage[1].gate.max-relative-rise`", "accuracy is higher better", "write `max-relative-drop` instead"],
        ),
        (
            "[[stage]]\nkind = \"finetune\"\n[stage.gate]\nmetric = \"bleu\"\nmax-drop = 0.5\n",
            "metric = \"bleu\"",
            &["`stage[1].gate.metric`", "unknown gate metric `bleu`", "`perplexity`"],
        ),
        (
            "[[stage]]\nkind = \"export\"\nsamples = 0\n",
            "samples = 0",
            &["`stage[1].samples`", "at least 1"],
        ),
        (
            "[[stage]]\nkind = \"prune\"\ntarget = 1.5\n",
            "target = 1.5",
            &["`stage[1].target`", "outside (0, 1)"],
        ),
        (
            "[[stage]]\nkind = \"prune\"\nranking = \"global\"\n[stage.ratios]\n\"encoder.layer.0.*\" = 0.3\n",
            "[stage.ratios]",
            &["`stage[1].ratios`", "need ranking = \"local\""],
        ),
        (
            "[[stage]]\nkind = \"prune\"\ncriterion = \"magic\"\n",
            "criterion = \"magic\"",
            &["`stage[1].criterion`", "unknown criterion `magic`", "`taylor`", "`random`"],
        ),
        (
            "[[stage]]\nkind = \"distill\"\n",
            "[[stage]]",
            &["`stage[1].student`", "needs its student", "[stage.student]"],
        ),
    ];
    for (stages, line_of_needle, needles) in cases {
        let src = format!("{s}\n{stages}");
        let msg = pipeline_err(&p, &src);
        // The line is the needle's last occurrence (the second stage's, where there are two).
        let want = src
            .lines()
            .enumerate()
            .filter(|(_, l)| l.starts_with(line_of_needle))
            .map(|(i, _)| i + 1)
            .last()
            .unwrap();
        assert!(
            msg.contains(&format!("tiny.toml:{want}:")),
            "line {want} in: {msg}"
        );
        for n in needles {
            assert!(msg.contains(n), "`{n}` in: {msg}");
        }
    }
    // The pre-stages form is refused with the way to migrate.
    let msg = pipeline_err(&p, &format!("{s}\n[distill]\nalpha = 0.5\n"));
    assert!(
        msg.contains("is now a stage") && msg.contains("kind = \"distill\""),
        "{msg}"
    );
    let msg = pipeline_err(&p, &format!("{s}\n[report]\nlatency-runs = 3\n"));
    assert!(msg.contains("[evaluation]"), "{msg}");
}
