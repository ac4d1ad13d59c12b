//! Real data sets through mopt's loaders, the fixed split, tokenization and its cache.

mod common;

use std::collections::HashSet;
use std::path::PathBuf;

use mopt_data::{encode_splits, Splits, TextTokenizer};
use mopt_recipe::{DataSource, DataSpec, Scope};

fn spec(format: &str, source: DataSource) -> DataSpec {
    DataSpec {
        format: format.into(),
        source,
        split_seed_written: None,
        max_train: None,
        max_eval: None,
        cache_dir: None,
        keys: toml::Table::new(),
        written: Default::default(),
        scope: Scope::root(std::path::Path::new("data.toml"), "[data]\n").nested("data"),
    }
}

/// The splits of `sp`, each file read by its registered format.
fn load_splits(sp: &DataSpec) -> Result<Splits, mopt_data::DataError> {
    let registry = mopt_families::builtin();
    let format = registry
        .data_format_named(&sp.format)
        .expect("a shipped format");
    mopt_data::load_splits(sp, &|p: &std::path::Path| format.read_text(sp, p))
}

/// `sp` with its columns named.
fn columns(mut sp: DataSpec, text: &str, label: &str) -> DataSpec {
    sp.keys.insert("text-column".into(), text.into());
    sp.keys.insert("label-column".into(), label.into());
    sp
}

fn rt_spec() -> DataSpec {
    spec(
        "rotten-tomatoes",
        DataSource::Single {
            path: common::rotten_tomatoes(),
            valid_fraction: 0.1,
            test_fraction: 0.1,
        },
    )
}

#[test]
fn rotten_tomatoes_split_is_fixed_disjoint_and_documented() {
    let s = load_splits(&rt_spec()).unwrap();
    assert_eq!(
        (s.train.len(), s.valid.len(), s.test.len()),
        (10202, 1275, 1275)
    );
    let train: HashSet<&str> = s.train.iter().map(|e| e.text.as_str()).collect();
    assert!(
        s.test
            .iter()
            .chain(&s.valid)
            .all(|e| !train.contains(e.text.as_str())),
        "no text in two splits"
    );
    let labels: HashSet<&str> = s.train.iter().map(|e| e.label.as_str()).collect();
    assert_eq!(labels, HashSet::from(["fresh", "rotten"]));
    let fresh = s
        .train
        .iter()
        .chain(&s.valid)
        .chain(&s.test)
        .filter(|e| e.label == "fresh")
        .count();
    // 7,403 fresh rows before de-duplication.
    assert!((7300..=7403).contains(&fresh), "{fresh}");
    // Same seed, same split; another seed, another split.
    let again = load_splits(&rt_spec()).unwrap();
    assert_eq!(again.test[0], s.test[0]);
    let mut other = rt_spec();
    other.split_seed_written = Some(1);
    assert_ne!(load_splits(&other).unwrap().test[..5], s.test[..5]);
}

#[test]
fn orange_tab_reads_reuters_r8() {
    let d = common::data_dir().join("reuters-r8");
    let sp = spec(
        "orange-tab",
        DataSource::Files {
            train: d.join("reuters-r8-train.tab"),
            valid: None,
            test: d.join("reuters-r8-test.tab"),
            valid_fraction: 0.1,
        },
    );
    let sp = columns(sp, "Text", "Category");
    let s = load_splits(&sp).unwrap();
    let labels: HashSet<&str> = s
        .train
        .iter()
        .chain(&s.valid)
        .map(|e| e.label.as_str())
        .collect();
    assert_eq!(labels.len(), 8, "{labels:?}");
    assert!(
        s.test.len() > 2000 && s.train.len() > 4000,
        "{} {}",
        s.train.len(),
        s.test.len()
    );
    assert!(s.train.iter().all(|e| !e.text.is_empty()));
}

#[test]
fn csv_tsv_and_jsonl_use_named_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("d.csv");
    std::fs::write(
        &csv,
        "id,sentence,y\n1,\"good, really\ngood\",pos\n2,bad,neg\n3,fine,pos\n",
    )
    .unwrap();
    let jsonl = tmp.path().join("d.jsonl");
    std::fs::write(
        &jsonl,
        "{\"sentence\": \"good\", \"y\": \"pos\"}\n\n{\"sentence\": \"bad\", \"y\": 0}\n",
    )
    .unwrap();
    let files = |p: &PathBuf| DataSource::Files {
        train: p.clone(),
        valid: Some(p.clone()),
        test: p.clone(),
        valid_fraction: 0.1,
    };
    let c = columns(spec("csv", files(&csv)), "sentence", "y");
    let s = load_splits(&c).unwrap();
    assert_eq!(s.train.len(), 3);
    assert_eq!(s.train[0].text, "good, really\ngood");
    assert_eq!(s.train[1].label, "neg");
    let mut j = c.clone();
    j.format = "jsonl".into();
    j.source = files(&jsonl);
    let s = load_splits(&j).unwrap();
    assert_eq!(s.train.len(), 2);
    assert_eq!(s.train[1].label, "0");
    let c = columns(c, "sentence", "label");
    let err = load_splits(&c).unwrap_err().to_string();
    assert!(
        err.contains("no column `label`") && err.contains("label-column") && err.contains("d.csv"),
        "{err}"
    );
}

#[test]
fn token_cache_is_reused_and_invalidated_by_data_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = TextTokenizer::from_file(&common::minilm_dir().join("vocab.txt"), 64, true).unwrap();
    let mut sp = rt_spec();
    sp.max_train = Some(200);
    sp.max_eval = Some(50);
    let splits = load_splits(&sp).unwrap();
    let anchor = common::rotten_tomatoes();
    let encode = |tok: &TextTokenizer, splits| {
        encode_splits(
            tok,
            splits,
            None,
            Some(tmp.path()),
            [&anchor, &anchor, &anchor],
        )
        .unwrap()
    };
    let first = encode(&tok, &splits);
    assert!(!first.from_cache);
    assert_eq!(first.labels.labels, vec!["fresh", "rotten"]);
    assert!(first
        .train
        .iter()
        .all(|e| e.ids[0] == 101 && *e.ids.last().unwrap() == 102 && e.ids.len() <= 64));
    let second = encode(&tok, &splits);
    assert!(second.from_cache);
    assert_eq!(second.train, first.train);
    let mut changed = splits.clone();
    changed.train[0].text.push_str(" and more");
    let third = encode(&tok, &changed);
    assert!(!third.from_cache, "changed data must not reuse the cache");
    let short =
        TextTokenizer::from_file(&common::minilm_dir().join("vocab.txt"), 16, true).unwrap();
    let fourth = encode(&short, &splits);
    assert!(!fourth.from_cache, "a new max-len must not reuse the cache");
    assert!(fourth.train.iter().all(|e| e.ids.len() <= 16));
}

/// `[data] cache-dir` puts the token-id cache where the recipe says (a read-only or shared data
/// folder keeps none); a file there is refused by key.
#[test]
fn the_data_caches_go_where_cache_dir_says() {
    let tmp = tempfile::tempdir().unwrap();
    let recipes = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("recipes");
    let mut table: toml::Table = std::fs::read_to_string(recipes.join("distill_bert.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let data = table["data"].as_table_mut().unwrap();
    data.insert(
        "cache-dir".into(),
        tmp.path().join("caches").display().to_string().into(),
    );
    data.insert("max-train".into(), 64.into());
    data.insert("max-eval".into(), 16.into());
    let source = toml::to_string(&table).unwrap();
    let recipe = mopt_recipe::parse(&recipes.join("cache-dir.toml"), &source).unwrap();
    let dir = mopt_train::setup::cache_dir(&recipe.data).unwrap();
    assert_eq!(dir, tmp.path().join("caches"));
    let tok = &mopt_stages::data::text::tokenizer(&recipe).unwrap();
    let registry = mopt_families::builtin();
    let format = registry.data_format(&recipe).unwrap();
    let read = |p: &std::path::Path| format.read_text(&recipe.data, p);
    let first = mopt_train::setup::prepare_data(tok, (&recipe.data, &read), None).unwrap();
    assert!(!first.data.from_cache);
    let written: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(written.len(), 1, "one token-id cache in {}", dir.display());
    let again = mopt_train::setup::prepare_data(tok, (&recipe.data, &read), None).unwrap();
    assert!(again.data.from_cache);
    // A file is no folder.
    std::fs::write(tmp.path().join("file"), "").unwrap();
    let data = table["data"].as_table_mut().unwrap();
    data.insert(
        "cache-dir".into(),
        tmp.path().join("file").display().to_string().into(),
    );
    let source = toml::to_string(&table).unwrap();
    let err = mopt_recipe::parse(&recipes.join("cache-dir.toml"), &source).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("data.cache-dir") && text.contains("is a file"),
        "{text}"
    );
}
