//! The bad-input corpus: broken recipes, data files, models and device names fed to the real
//! binary. Every case must exit 2 (the input is wrong, found before or while reading it), name
//! the culprit (file, key or column) in its message, and leave no run folder behind.

mod common;

use std::path::Path;

use common::{minilm_dir, mopt, stderr, write_tiny_recipe};

/// Turns the good recipe (and its folder) into a broken one; returns the recipe text.
type Edit = Box<dyn Fn(&Path, &str) -> String + Sync>;

/// One bad input: `edit` turns the good tiny recipe (and its folder) into the broken one and
/// returns the recipe text; the message must contain every needle.
struct Case {
    name: &'static str,
    edit: Edit,
    needles: &'static [&'static str],
    args: &'static [&'static str],
}

fn replace(from: &'static str, to: &'static str) -> Edit {
    Box::new(move |_, good| {
        assert!(good.contains(from), "fixture lacks {from}");
        good.replacen(from, to, 1)
    })
}

/// `extra` appended; `{cfg}` in it names the tiny model's config.
fn append(extra: &'static str) -> Edit {
    Box::new(move |dir, good| {
        let cfg = dir.join("tiny-config.json").display().to_string();
        format!("{good}\n{}\n", extra.replace("{cfg}", &cfg))
    })
}

/// `good` with its `[data]` section replaced by `section`.
fn with_data(good: &str, section: &str) -> String {
    let start = good.find("[data]").unwrap();
    let end = good.find("[train]").unwrap();
    format!("{}{section}\n\n{}", &good[..start], &good[end..])
}

/// The recipe reading `[data]` through `section` (`{path}` in it: a file written with `body`).
fn data_file(name: &'static str, body: &'static [u8], section: &'static str) -> Edit {
    Box::new(move |dir, good| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        with_data(good, &section.replace("{path}", &p.display().to_string()))
    })
}

/// The recipe's `[model] config` replaced by a file holding `json`.
fn config(json: &'static str) -> Edit {
    Box::new(move |dir, good| {
        let p = dir.join("bad-config.json");
        std::fs::write(&p, json).unwrap();
        let cfg = dir.join("tiny-config.json").display().to_string();
        good.replacen(&cfg, &p.display().to_string(), 1)
    })
}

const CSV: &str =
    "[data]\nformat = \"csv\"\npath = \"{path}\"\ntext-column = \"text\"\nlabel-column = \"label\"";
const JSONL: &str = "[data]\nformat = \"jsonl\"\npath = \"{path}\"\ntext-column = \"text\"\nlabel-column = \"label\"";

/// 40 sentences of two classes, in csv.
fn good_rows() -> String {
    let mut s = String::from("text,label\n");
    for i in 0..40 {
        let (t, l) = if i % 2 == 0 {
            ("a fine film", "pos")
        } else {
            ("a dull film", "neg")
        };
        s.push_str(&format!("{t} number {i},{l}\n"));
    }
    s
}

fn cases() -> Vec<Case> {
    let c = |name, edit, needles| Case {
        name,
        edit,
        needles,
        args: &[],
    };
    vec![
        // The recipe: syntax, keys, types, ranges.
        c("malformed TOML", replace("[train]", "[train"), &["tiny.toml", "line"]),
        c("unknown key", replace("log-every = 2", "log-every = 2\nlearning-rate = 3"), &["learning-rate", "tiny.toml"]),
        c("unknown section", append("[trainer]\nepochs = 1"), &["trainer", "tiny.toml"]),
        c("wrong type: epochs", replace("epochs = 2", "epochs = \"two\""), &["train.epochs", "tiny.toml"]),
        c("wrong type: batch size", replace("batch-size = 16", "batch-size = 16.5"), &["batch-size", "tiny.toml"]),
        c("negative lr", replace("lr = 1e-3", "lr = -1.0"), &["train.lr", "tiny.toml"]),
        c("zero epochs", replace("epochs = 2", "epochs = 0"), &["epochs", "tiny.toml"]),
        c("zero batch size", replace("batch-size = 16", "batch-size = 0"), &["batch-size", "tiny.toml"]),
        c("zero state-every", replace("log-every = 2", "log-every = 2\nstate-every = 0"), &["train.state-every", "tiny.toml"]),
        c("max-len too long", replace("max-len = 32", "max-len = 1000"), &["tokenizer.max-len", "1000 exceeds the model's 128 positions"]),
        c("unknown data format", replace("format = \"rotten-tomatoes\"", "format = \"parquet\""), &["data.format", "parquet"]),
        c("missing data file", replace("rotten_tomatoes_corpus_full.csv.bz2", "nope.csv.bz2"), &["data.path", "nope.csv.bz2"]),
        c("empty run name", replace("name = \"bad\"", "name = \"\""), &["run.name", "tiny.toml"]),
        c("negative seed", replace("seed = 7", "seed = -1"), &["seed", "tiny.toml"]),
        c("one seed in seeds", replace("seed = 7", "seeds = [7]"), &["run.seeds", "two seeds"]),
        c("a seed listed twice", replace("seed = 7", "seeds = [7, 1, 7]"), &["run.seeds", "twice"]),
        c("augment on text", replace("max-eval = 40", "max-eval = 40\n[data.augment]\nflip = true"), &["data.augment", "only images"]),
        c("augment unknown key", replace("max-eval = 40", "max-eval = 40\n[data.augment]\nrotate = 15"), &["rotate", "tiny.toml"]),
        c("valid fraction 1.5", replace("max-eval = 40", "max-eval = 40\nvalid-fraction = 1.5"), &["valid-fraction", "tiny.toml"]),
        // Stages: kinds, names, gates, and every kind's own ranges.
        c("unknown stage kind", append("[[stage]]\nkind = \"sparsify\""), &["sparsify", "finetune"]),
        c("duplicate stage names", append("[[stage]]\nkind = \"finetune\"\nname = \"a\"\n[[stage]]\nkind = \"finetune\"\nname = \"a\""), &["`a`", "name"]),
        c("unknown gate metric", append("[[stage]]\nkind = \"finetune\"\n[stage.gate]\nmetric = \"bleu\"\nmax-drop = 0.01"), &["bleu", "metric"]),
        c("negative gate drop", append("[[stage]]\nkind = \"finetune\"\n[stage.gate]\nmax-drop = -0.1"), &["max-drop"]),
        c("retry on finetune", append("[[stage]]\nkind = \"finetune\"\n[stage.gate]\nmax-drop = 0.01\non-fail = \"retry\""), &["retry", "finetune"]),
        c("unknown stage key", append("[[stage]]\nkind = \"finetune\"\nturbo = true"), &["turbo"]),
        c("prune target 1.5", append("[[stage]]\nkind = \"prune\"\ntargets = [\"heads\"]\ntarget = 1.5"), &["target"]),
        c("prune unknown group", append("[[stage]]\nkind = \"prune\"\ntargets = [\"neurons\"]\ntarget = 0.5"), &["neurons"]),
        c("prune unknown criterion", append("[[stage]]\nkind = \"prune\"\ntargets = [\"heads\"]\ntarget = 0.5\ncriterion = \"magic\""), &["magic", "criterion"]),
        c("prune min-heads above the model's", append("[[stage]]\nkind = \"prune\"\ntargets = [\"heads\"]\ntarget = 0.5\nmin-heads = 8"), &["min-heads", "4"]),
        c("ptq 3-bit weights", append("[[stage]]\nkind = \"ptq\"\nweight-bits = 3"), &["weight-bits"]),
        c("ptq weight bits by name", append("[[stage]]\nkind = \"ptq\"\nweight-bits = \"eight\""), &["weight-bits", "eight", "auto"]),
        c("vocab twice", append("[[stage]]\nkind = \"vocab\"\n[[stage]]\nkind = \"vocab\""), &["vocabulary", "once"]),
        c("vocab min-count 0", append("[[stage]]\nkind = \"vocab\"\nmin-count = 0"), &["min-count"]),
        c("vocab trains", append("[[stage]]\nkind = \"vocab\"\n[stage.train]\nepochs = 1"), &["train", "vocab"]),
        c("ptq smooth above 1", append("[[stage]]\nkind = \"ptq\"\nsmooth = 1.5"), &["smooth", "1.5", "between 0 and 1"]),
        c("ptq smooth 0", append("[[stage]]\nkind = \"ptq\"\nsmooth = 0.0"), &["smooth", "(0, 1]"]),
        c("ptq smooth without groups", append("[[stage]]\nkind = \"ptq\"\nsmooth = 0.5"), &["smooth", "SmoothQuant", "smoothing_group"]),
        c("ptq unknown observer", append("[[stage]]\nkind = \"ptq\"\nobserver = \"max\""), &["observer", "max"]),
        c("ptq percentile 120", append("[[stage]]\nkind = \"ptq\"\nobserver = \"percentile\"\npercentile = 120.0"), &["percentile"]),
        c("qat no calibration", append("[[stage]]\nkind = \"qat\"\ncalibration-samples = 0"), &["calibration-samples"]),
        c("distill temperature 0", append("[[stage]]\nkind = \"distill\"\ntemperature = 0.0\n[stage.student]\nconfig = \"{cfg}\"\ninit-from-teacher-layers = [0]"), &["temperature"]),
        c("distill impossible layer map", append("[[stage]]\nkind = \"distill\"\n[stage.student]\nconfig = \"{cfg}\"\ninit-from-teacher-layers = [0, 5]"), &["init-from-teacher-layers", "5"]),
        c("export negative tolerance", append("[[stage]]\nkind = \"export\"\ntolerance = -1.0"), &["tolerance"]),
        // Data files.
        c("empty csv", data_file("d.csv", b"", CSV), &["d.csv"]),
        c("header-only csv", data_file("d.csv", b"text,label\n", CSV), &["d.csv"]),
        c("missing column", data_file("d.csv", b"sentence,label\nok,pos\nbad,neg\n", CSV), &["d.csv", "text"]),
        c("one class", data_file("d.csv", b"text,label\na,pos\nb,pos\nc,pos\nd,pos\ne,pos\nf,pos\ng,pos\nh,pos\ni,pos\nj,pos\n", CSV), &["d.csv", "class"]),
        c("unterminated quote", data_file("d.csv", b"text,label\n\"a fine film,pos\nb,neg\nc,pos\nd,neg\n", CSV), &["d.csv"]),
        c("non-UTF-8", data_file("d.csv", b"text,label\na \xff\xfe film,pos\nb,neg\nc,pos\nd,neg\n", CSV), &["d.csv"]),
        c("truncated jsonl", data_file("d.jsonl", b"{\"text\": \"a\", \"label\": \"pos\"}\n{\"text\": \"b\", \"label\": \"neg\"}\n{\"text\": \"c\", \"la", JSONL), &["d.jsonl", "line 3"]),
        c("a folder where the data file belongs", Box::new(|dir, good| {
            let d = dir.join("data-dir");
            std::fs::create_dir_all(&d).unwrap();
            with_data(good, &CSV.replace("{path}", &d.display().to_string()))
        }), &["data-dir"]),
        c("unknown label in a later split", Box::new(|dir, good| {
            let (train, test) = (dir.join("train.csv"), dir.join("test.csv"));
            std::fs::write(&train, good_rows()).unwrap();
            std::fs::write(&test, "text,label\nan odd film,neutral\na fine film,pos\n").unwrap();
            let section = format!(
                "[data]\nformat = \"csv\"\ntrain = \"{}\"\ntest = \"{}\"\ntext-column = \"text\"\nlabel-column = \"label\"",
                train.display(), test.display()
            );
            with_data(good, &section)
        }), &["test.csv", "neutral"]),
        // Models and weights.
        c("hidden size not divisible by heads", config(r#"{"vocab_size": 30522, "hidden_size": 30, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 128, "type_vocab_size": 2}"#), &["bad-config.json", "30"]),
        c("malformed config", config("{\"hidden_size\": 32,"), &["bad-config.json"]),
        c("truncated safetensors", Box::new(|dir, good| {
            let p = dir.join("cut.safetensors");
            let bytes = std::fs::read(minilm_dir().join("model.safetensors")).unwrap();
            std::fs::write(&p, &bytes[..4096]).unwrap();
            let cfg = minilm_dir().join("config.json");
            let tiny = dir.join("tiny-config.json").display().to_string();
            good.replacen(&tiny, &format!("{}\"\nweights = \"{}", cfg.display(), p.display()), 1)
        }), &["cut.safetensors"]),
        c("weights that disagree with the config", Box::new(|_, good| {
            // MiniLM's weights (hidden 384) with the tiny config (hidden 32).
            let w = minilm_dir().join("model.safetensors");
            good.replacen("[tokenizer]", &format!("weights = \"{}\"\n\n[tokenizer]", w.display()), 1)
        }), &["model.safetensors", "shape"]),
        c("missing vocabulary", Box::new(|_, good| {
            let v = minilm_dir().join("vocab.txt").display().to_string();
            good.replacen(&v, "/nonexistent/vocab.txt", 1)
        }), &["vocab.txt"]),
        c("corrupt tokenizer.json", Box::new(|dir, good| {
            let p = dir.join("tokenizer.json");
            std::fs::write(&p, "{\"model\": [").unwrap();
            let v = minilm_dir().join("vocab.txt").display().to_string();
            good.replacen(&v, &p.display().to_string(), 1)
        }), &["tokenizer.json"]),
        // Devices.
        Case {
            name: "a GPU without its feature",
            edit: Box::new(|_, good| good.to_string()),
            needles: &["cuda", "feature"],
            args: &["--device", "cuda"],
        },
        Case {
            name: "an unknown device",
            edit: Box::new(|_, good| good.to_string()),
            needles: &["tpu"],
            args: &["--device", "tpu"],
        },
    ]
}

#[test]
fn every_bad_input_exits_2_names_the_culprit_and_leaves_nothing() {
    let cases = cases();
    assert!(cases.len() >= 40, "the corpus has {} cases", cases.len());
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .chunks(cases.len().div_ceil(4))
            .map(|chunk| scope.spawn(move || chunk.iter().filter_map(run_case).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// `None` when the case behaves; otherwise what went wrong.
fn run_case(case: &Case) -> Option<String> {
    let tmp = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(write_tiny_recipe(tmp.path(), "bad", "")).unwrap();
    let text = (case.edit)(tmp.path(), &good);
    let recipe = tmp.path().join("tiny.toml");
    std::fs::write(&recipe, text).unwrap();
    let mut args = vec![recipe.to_str().unwrap()];
    args.extend(case.args);
    let out = mopt(&args);
    let err = stderr(&out);
    let mut wrong = Vec::new();
    if out.status.code() != Some(2) {
        wrong.push(format!("exit {:?}", out.status.code()));
    }
    for n in case.needles {
        if !err.to_lowercase().contains(&n.to_lowercase()) {
            wrong.push(format!("message lacks `{n}`"));
        }
    }
    let runs = tmp.path().join("runs");
    let left = std::fs::read_dir(&runs).map(|d| d.count()).unwrap_or(0);
    if left > 0 {
        wrong.push(format!("{left} entries left in {}", runs.display()));
    }
    (!wrong.is_empty()).then(|| {
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        format!("- {}: {} | stderr: {}", case.name, wrong.join("; "), last)
    })
}

/// A changed recipe on `--resume` is refused with exit 2 and leaves the run as it was; an
/// output folder that cannot be made (a file in its path) is named, and nothing is left.
#[test]
fn a_changed_recipe_on_resume_and_an_unwritable_output_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = write_tiny_recipe(tmp.path(), "done", "");
    let out = mopt(&[recipe.to_str().unwrap(), "--max-steps", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let run = tmp.path().join("runs/done");
    let kept = std::fs::read_to_string(run.join("recipe.toml")).unwrap();
    let listing = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = listing(&run);
    let changed = kept.replacen("lr = 1e-3", "lr = 2e-3", 1);
    std::fs::write(&recipe, &changed).unwrap();
    let out = mopt(&[recipe.to_str().unwrap(), "--resume"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("recipe changed"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(run.join("recipe.toml")).unwrap(),
        kept
    );
    assert_eq!(listing(&run), before, "the run is left as it was");

    // `output-dir` runs through a regular file: the folder cannot be made.
    let blocker = tmp.path().join("blocker");
    std::fs::write(&blocker, "a file, not a folder").unwrap();
    let text = kept.replacen(
        &tmp.path().join("runs").display().to_string(),
        &blocker.join("runs").display().to_string(),
        1,
    );
    std::fs::write(&recipe, text).unwrap();
    let out = mopt(&[recipe.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(matches!(out.status.code(), Some(1 | 2)), "{err}");
    assert!(err.contains("blocker"), "names the path: {err}");
    assert!(
        std::fs::metadata(&blocker).unwrap().is_file(),
        "the file is untouched"
    );
}
