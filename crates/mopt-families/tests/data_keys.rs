//! Every `[data]` key over every shipped data format, and `[tokenizer]` over text and images,
//! checked as a run checks a recipe (parsed, then its data format's keys and sections through the
//! registry): each key is taken where the format reads it and refused where it does not, naming
//! the key (`data.x`); no format ignores a key in silence.

use std::path::Path;

use mopt_recipe::RecipeError;

/// Each format with the keys naming its files, and the keys it takes (beyond those).
type Format = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    Vec<&'static str>,
);

fn formats() -> Vec<Format> {
    let path = vec![("path", "data.csv")];
    let files = vec![("train", "train.x"), ("test", "test.x")];
    let split = [
        "valid-fraction",
        "split-seed",
        "max-train",
        "max-eval",
        "labels",
        "cache-dir",
    ];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        split.iter().chain(extra).copied().collect()
    };
    let text = ["text-column", "label-column"];
    let images = ["pixel-max", "augment"];
    vec![
        ("rotten-tomatoes", path.clone(), with(&["test-fraction"])),
        (
            "orange-tab",
            files.clone(),
            with(&[text[0], text[1], "valid"]),
        ),
        (
            "csv",
            path.clone(),
            with(&[text[0], text[1], "test-fraction"]),
        ),
        (
            "tsv",
            path.clone(),
            with(&[text[0], text[1], "test-fraction"]),
        ),
        (
            "jsonl",
            path.clone(),
            with(&[text[0], text[1], "test-fraction"]),
        ),
        ("idx", files, with(&[images[0], images[1], "valid"])),
        (
            "pixels-csv",
            path,
            with(&[images[0], images[1], "test-fraction"]),
        ),
        (
            "text-files",
            vec![
                ("train", "works"),
                ("valid", "valid.txt"),
                ("test", "test.txt"),
            ],
            vec!["max-train", "max-eval", "cache-dir", "valid"],
        ),
    ]
}

/// Every `[data]` key with a value some format takes.
fn keys() -> Vec<(&'static str, toml::Value)> {
    let mut augment = toml::Table::new();
    augment.insert("flip".into(), true.into());
    vec![
        ("text-column", "t".into()),
        ("label-column", "l".into()),
        ("valid-fraction", 0.2.into()),
        ("test-fraction", 0.2.into()),
        ("split-seed", 7.into()),
        ("max-train", 10.into()),
        ("max-eval", 5.into()),
        ("labels", vec!["a", "b"].into()),
        ("pixel-max", 16.0.into()),
        ("augment", augment.into()),
        ("cache-dir", "caches".into()),
        ("valid", "valid.x".into()),
    ]
}

/// A recipe in `dir` with `[data]` = `data` (and `[tokenizer]` = `tokenizer`).
fn parse(
    dir: &Path,
    data: &toml::Table,
    tokenizer: Option<toml::Table>,
) -> Result<(), RecipeError> {
    let mut recipe = toml::Table::new();
    let mut run = toml::Table::new();
    run.insert("name".into(), "sweep".into());
    recipe.insert("run".into(), run.into());
    let format = data["format"].as_str().unwrap_or_default();
    let arch = match format {
        "idx" | "pixels-csv" => "resnet",
        "text-files" => "llama",
        _ => "bert",
    };
    let mut model = toml::Table::new();
    model.insert("arch".into(), arch.into());
    model.insert("config".into(), "config.json".into());
    recipe.insert("model".into(), model.into());
    if let Some(t) = tokenizer {
        recipe.insert("tokenizer".into(), t.into());
    }
    recipe.insert("data".into(), data.clone().into());
    let source = toml::to_string(&recipe).unwrap();
    let recipe = mopt_recipe::parse(&dir.join("recipe.toml"), &source)?;
    mopt_families::builtin().recipe_family(&recipe).map(|_| ())
}

fn tokenizer(file: &str) -> toml::Table {
    let mut t = toml::Table::new();
    t.insert("path".into(), file.into());
    t
}

fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "vocab.txt",
        "data.csv",
        "train.x",
        "test.x",
        "valid.x",
        "valid.txt",
        "test.txt",
    ] {
        std::fs::write(dir.path().join(f), "").unwrap();
    }
    std::fs::create_dir(dir.path().join("works")).unwrap();
    dir
}

#[test]
fn every_data_key_is_taken_where_its_format_reads_it_and_refused_by_name_elsewhere() {
    let dir = scratch();
    let (mut taken, mut refused) = (0, 0);
    for (format, files, takes) in formats() {
        let image = format == "idx" || format == "pixels-csv";
        let tok = (!image).then(|| tokenizer("tokenizer.json"));
        let mut base = toml::Table::new();
        base.insert("format".into(), format.into());
        for (k, v) in &files {
            base.insert(k.to_string(), (*v).into());
        }
        if matches!(format, "csv" | "tsv" | "jsonl") {
            base.insert("text-column".into(), "text".into());
            base.insert("label-column".into(), "label".into());
        }
        parse(dir.path(), &base, tok.clone()).unwrap_or_else(|e| panic!("{format}: {e}"));
        for (key, value) in keys() {
            let mut data = base.clone();
            if format == "text-files" && key == "valid" {
                // Its base names `valid`: the key is taken (read) there.
                taken += 1;
                continue;
            }
            data.insert(key.into(), value);
            let got = parse(dir.path(), &data, tok.clone());
            if takes.contains(&key) {
                got.unwrap_or_else(|e| panic!("{format} refused `{key}`: {e}"));
                taken += 1;
                continue;
            }
            match got {
                Err(RecipeError::Invalid(e)) => {
                    assert_eq!(e.key, format!("data.{key}"), "{format}: {}", e.message);
                    refused += 1;
                }
                Err(other) => panic!("{format}: `{key}`: {other}"),
                Ok(()) => panic!("{format} took `{key}`, which it does not read"),
            }
        }
    }
    assert_eq!(taken + refused, 8 * 12);
    // Rotten Tomatoes 7, Orange 9, csv/tsv/jsonl 9 each, IDX 9, pixels 9, text files 4.
    assert_eq!(taken, 7 + 9 + 3 * 9 + 9 + 9 + 4);
}

#[test]
fn the_tokenizer_is_texts_and_lowercase_is_a_vocabularys() {
    let dir = scratch();
    let data = |format: &str| {
        let mut t = toml::Table::new();
        t.insert("format".into(), format.into());
        t.insert("path".into(), "data.csv".into());
        t
    };
    let (text, pixels) = (data("rotten-tomatoes"), data("pixels-csv"));
    let key = |r: Result<(), RecipeError>| match r {
        Err(RecipeError::Invalid(e)) => e.key,
        other => panic!("not refused by key: {other:?}"),
    };
    assert_eq!(key(parse(dir.path(), &text, None)), "tokenizer");
    let vocab = Some(tokenizer("vocab.txt"));
    assert_eq!(key(parse(dir.path(), &pixels, vocab)), "tokenizer");
    let mut lower = tokenizer("vocab.txt");
    lower.insert("lowercase".into(), false.into());
    parse(dir.path(), &text, Some(lower)).unwrap();
    let mut lower = tokenizer("tokenizer.json");
    lower.insert("lowercase".into(), false.into());
    assert_eq!(
        key(parse(dir.path(), &text, Some(lower))),
        "tokenizer.lowercase"
    );
    let mut short = tokenizer("tokenizer.json");
    short.insert("max-len".into(), 2.into());
    assert_eq!(
        key(parse(dir.path(), &text, Some(short))),
        "tokenizer.max-len"
    );
}
