//! A language model's text through `[data] format = "text-files"`: Shakespeare's works
//! (`datasets/fetch.sh --small`) split by work, tokenised by SmolLM2's GGUF tokenizer and packed
//! into windows.

use std::path::{Path, PathBuf};

use mopt_core::{Examples, Labeled};
use mopt_gguf::{Gguf, GgufTokenizer};
use mopt_stages::data::lm::LmData;
use mopt_stages::data::{RunSplits, Split};

fn data(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../datasets/data")
        .join(rel);
    assert!(
        p.exists(),
        "test data missing ({}): run `datasets/fetch.sh --small` first",
        p.display()
    );
    p
}

/// The first `n` bytes of a play (cut at a line end), as a work of its own.
fn excerpt(dir: &Path, play: &str, n: usize) -> String {
    let text = std::fs::read_to_string(data(&format!("shakespeare/{play}"))).unwrap();
    let cut = text[..n].rfind('\n').unwrap();
    std::fs::write(dir.join(play), &text[..cut]).unwrap();
    text[..cut].to_string()
}

fn recipe(dir: &Path, data_keys: &str) -> mopt_recipe::Recipe {
    let text = format!(
        "[run]\nname = \"lm\"\noutput-dir = \"{out}\"\n\n[model]\narch = \"llama\"\nconfig = \"{gguf}\"\n\n[tokenizer]\npath = \"{gguf}\"\nmax-len = 32\n\n[data]\nformat = \"text-files\"\n{data_keys}\n",
        out = dir.join("runs").display(),
        gguf = data("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf").display(),
    );
    let path = dir.join("lm.toml");
    std::fs::write(&path, &text).unwrap();
    mopt_recipe::parse(&path, &text).expect("a valid recipe")
}

#[test]
fn works_are_split_whole_tokenised_and_packed_into_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let works = tmp.path().join("works");
    std::fs::create_dir(&works).unwrap();
    let plays = ["hamlet_gut.txt", "macbeth_gut.txt", "tempest_gut.txt"];
    let texts: Vec<String> = plays.iter().map(|p| excerpt(&works, p, 3000)).collect();
    std::fs::write(works.join("notes.md"), "not a work").unwrap();
    let keys = format!(
        "train = \"{w}\"\nvalid = \"{w}/tempest_gut.txt\"\ntest = \"{w}/tempest_gut.txt\"\n",
        w = works.display()
    );
    let r = recipe(tmp.path(), &keys);
    let d = LmData::load(&r, 2).unwrap();
    // Training: Hamlet then Macbeth (name order), the held-out Tempest and the .md left out.
    let names: Vec<_> = d.works[0].iter().map(|p| p.file_name().unwrap()).collect();
    assert_eq!(names, ["hamlet_gut.txt", "macbeth_gut.txt"]);
    let tok_path = mopt_stages::data::text::tokenizer(&r).unwrap().path;
    let tok = GgufTokenizer::from_gguf(&Gguf::open(&tok_path).unwrap()).unwrap();
    let (h, m) = (
        tok.encode(&texts[0]).unwrap(),
        tok.encode(&texts[1]).unwrap(),
    );
    let eos = tok.eos_id().expect("SmolLM2 has an end-of-text token");
    let stream = [h.clone(), vec![eos], m.clone()].concat();
    // Windows of 32 positions (33 ids), one every 32 ids; the partial tail dropped.
    assert_eq!(d.train.len(), (stream.len() - 1) / 32);
    assert_eq!(d.train.window(0), &stream[..33]);
    let k = h.len() / 32;
    assert!(
        d.train.window(k).contains(&eos),
        "the join sits in window {k}"
    );
    assert_eq!(
        d.valid.len(),
        (tok.encode(&texts[2]).unwrap().len() - 1) / 32
    );
    assert_eq!((d.golden.len(), d.golden.window(1)), (2, d.valid.window(1)));
    assert_eq!(d.labels().len(), tok.vocab_size());
    // A batch reads 32 ids a window and predicts the next 32: rows of next tokens.
    let batch = d
        .split(Split::Train)
        .batch(&[1, 0], &burn::prelude::Device::flex());
    assert_eq!(batch.inputs.dims(), [2, 32]);
    let targets: Vec<i64> = batch
        .labels()
        .into_data()
        .convert::<i64>()
        .try_to_vec::<i64>()
        .unwrap();
    let want: Vec<i64> = [&stream[33..65], &stream[1..33]]
        .concat()
        .iter()
        .map(|&t| t as i64)
        .collect();
    assert_eq!(targets, want);
}

#[test]
fn a_work_that_is_not_utf8_is_named_with_its_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let works = tmp.path().join("works");
    std::fs::create_dir(&works).unwrap();
    excerpt(&works, "hamlet_gut.txt", 2000);
    let mut bad = b"To be, or not to be".to_vec();
    bad.extend([0xff, 0xfe]);
    std::fs::write(works.join("bad.txt"), &bad).unwrap();
    let held = tmp.path().join("held.txt");
    std::fs::write(&held, "Exeunt.").unwrap();
    let keys = format!(
        "train = \"{}\"\nvalid = \"{h}\"\ntest = \"{h}\"\n",
        works.display(),
        h = held.display()
    );
    let err = LmData::load(&recipe(tmp.path(), &keys), 2)
        .err()
        .expect("a work that is not UTF-8")
        .to_string();
    assert!(err.contains("bad.txt"), "{err}");
    assert!(
        err.contains("not UTF-8 text (invalid byte at offset 19)"),
        "{err}"
    );
}

#[test]
fn text_files_refuse_what_a_language_model_has_no_use_for() {
    let tmp = tempfile::tempdir().unwrap();
    let held = tmp.path().join("held.txt");
    std::fs::write(&held, "Exeunt.").unwrap();
    let gguf = data("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let base = format!(
        "[run]\nname = \"lm\"\n\n[model]\narch = \"llama\"\nconfig = \"{g}\"\n\n[tokenizer]\npath = \"{g}\"\n\n[data]\nformat = \"text-files\"\n",
        g = gguf.display()
    );
    let path = tmp.path().join("lm.toml");
    for (keys, key, why) in [
        (
            format!("path = \"{}\"\n", held.display()),
            "data.path",
            "split by work",
        ),
        (
            format!("train = \"{h}\"\ntest = \"{h}\"\n", h = held.display()),
            "data.valid",
            "validation works",
        ),
        (
            format!(
                "train = \"{h}\"\nvalid = \"{h}\"\ntest = \"{h}\"\nlabel-column = \"x\"\n",
                h = held.display()
            ),
            "data.label-column",
            "its own target",
        ),
    ] {
        let text = format!("{base}{keys}");
        // The format's keys are the format's: refused where the registry checks the recipe.
        let err = mopt_recipe::parse(&path, &text)
            .map_err(mopt_stages::StageError::from)
            .and_then(|r| mopt_stages::Pipeline::from_recipe(r, &mopt_families::builtin()))
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains(key) && err.contains(why), "{err}");
    }
    // A classifier family cannot read running text: refused before anything runs.
    let keys = format!(
        "train = \"{h}\"\nvalid = \"{h}\"\ntest = \"{h}\"\n",
        h = held.display()
    );
    let text = format!("{base}{keys}").replace("arch = \"llama\"", "arch = \"bert\"");
    let r = mopt_recipe::parse(&path, &text).unwrap();
    let err = mopt_stages::Pipeline::from_recipe(r, &mopt_families::builtin())
        .err()
        .expect("bert on running text")
        .to_string();
    assert!(
        err.contains("`text-files` holds running text, and `bert` models read text"),
        "{err}"
    );
}
