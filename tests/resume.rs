//! Exact resume: the real binary, killed with SIGKILL at random moments (and right after states
//! of the distillation twin, a pruning round and QAT were saved) of tiny runs that hold every
//! stage kind, and resumed until it finishes, ends with the bytes, metrics and TensorBoard
//! points of the same run never interrupted. Set `MOPT_KILL_SEED` to replay a failure's kills.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::{files_named, read_json, tree, write_tiny_recipe};

/// The tiny recipe with a state saved after every optimizer step, then `stages`.
fn chain_recipe(dir: &Path, name: &str, stages: &str) -> PathBuf {
    chain_recipe_with(dir, name, "", stages)
}

/// [`chain_recipe`] with `extra` lines in `[train]`.
fn chain_recipe_with(dir: &Path, name: &str, extra: &str, stages: &str) -> PathBuf {
    let p = write_tiny_recipe(dir, name, &format!("state-every = 1\n{extra}"));
    let text = std::fs::read_to_string(&p).unwrap()
        + "\n[evaluation]\nlatency-warmup = 1\nlatency-runs = 2\nlatency-seq-len = 16\nanalysis = false\n\n"
        + stages;
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

const TRAINING_CHAIN: &str = "[[stage]]\nkind = \"finetune\"\n\n\
[[stage]]\nkind = \"distill\"\nalpha = 0.5\ntemperature = 2.0\nbaseline = true\n[stage.student]\nconfig = \"{cfg}\"\ninit-from-teacher-layers = [0, 1]\n\n\
[[stage]]\nkind = \"prune\"\ncriterion = \"taylor\"\ntarget = 0.5\nstep = 0.25\nffn-multiple = 4\n[stage.train]\nepochs = 1\n\n\
[[stage]]\nkind = \"qat\"\ncalibration-samples = 32\n[stage.train]\nepochs = 1\nlr = 1e-4\n\n\
[[stage]]\nkind = \"export\"\nsamples = 40\nreference = \"finetune\"\n";

const PTQ_CHAIN: &str = "[[stage]]\nkind = \"finetune\"\n[stage.train]\nepochs = 1\n\n\
[[stage]]\nkind = \"ptq\"\nobserver = \"percentile\"\npercentile = 99.9\ncalibration-samples = 32\nmax-fallback = 2\n\n\
[[stage]]\nkind = \"export\"\nsamples = 40\n";

/// A writer of the tiny text recipe with `stages` (`{cfg}`: the tiny BERT config).
fn text_recipe(stages: &'static str) -> impl Fn(&Path, &str) -> PathBuf {
    move |dir, name| {
        let cfg = common::write_tiny_config(dir);
        chain_recipe(dir, name, &stages.replace("{cfg}", cfg.to_str().unwrap()))
    }
}

/// The image chain: a tiny ResNet on the 8×8 digits with random crops and flips, fine-tuned,
/// distilled into a smaller ResNet (teacher live, beside its twin), pruned in two rounds,
/// trained with fake-quant and exported.
fn image_recipe(dir: &Path, name: &str) -> PathBuf {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/data/digits/digits.csv.gz");
    assert!(data.is_file(), "run `datasets/fetch.sh --small` first");
    let shape = |file: &str, json: &str| {
        let p = dir.join(file);
        std::fs::write(&p, json).unwrap();
        p
    };
    let teacher = shape(
        "resnet.json",
        r#"{"channels": 1, "image_size": 8, "stages": [{"width": 8, "blocks": [8]}, {"width": 16, "blocks": [16]}]}"#,
    );
    let student = shape(
        "student.json",
        r#"{"channels": 1, "image_size": 8, "stages": [{"width": 4, "blocks": [4]}, {"width": 8, "blocks": [4]}]}"#,
    );
    let text = format!(
        r#"[run]
name = "{name}"
output-dir = "{out}"
seed = 7

[model]
arch = "resnet"
config = "{teacher}"

[data]
format = "pixels-csv"
path = "{data}"
pixel-max = 16
valid-fraction = 0.1
test-fraction = 0.2

[data.augment]
crop = 1
flip = true

[train]
epochs = 2
batch-size = 64
lr = 3e-3
state-every = 1

[evaluation]
golden-samples = 64
latency-runs = 0

[[stage]]
kind = "finetune"

[[stage]]
kind = "distill"
name = "student"
alpha = 0.5
baseline = true
[stage.student]
arch = "resnet"
config = "{student}"

[[stage]]
kind = "prune"
targets = ["channels"]
criterion = "taylor"
target = 0.5
step = 0.25
taylor-batches = 2
hidden-multiple = 2
distill = false
[stage.train]
epochs = 1

[[stage]]
kind = "qat"
calibration-samples = 64
distill = false
[stage.train]
epochs = 1
lr = 1e-4

[[stage]]
kind = "export"
samples = 32
latency-runs = 0
"#,
        out = dir.join("runs").display(),
        teacher = teacher.display(),
        student = student.display(),
        data = data.display(),
    );
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

/// A run name and the writer of its recipe into a folder.
type Chain<'a> = (&'a str, &'a dyn Fn(&Path, &str) -> PathBuf);

/// When to kill a run.
#[derive(Debug, Clone)]
enum Kill {
    /// After this long.
    After(Duration),
    /// This long after this file (in the run folder) is written by the run being watched.
    When(&'static str, Duration),
}

/// SplitMix64 over a seed: the kill moments.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        lo + (hi - lo) * (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn kill_seed() -> u64 {
    std::env::var("MOPT_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

/// Run `recipe` (`--no-reuse`: every stage computed here) with `extra` flags, stderr appended to
/// `log`; kill it at `kill`. True when it finished (successfully) before the kill.
fn run(recipe: &Path, run_dir: &Path, extra: &[&str], kill: Option<&Kill>, log: &Path) -> bool {
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let started = SystemTime::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mopt-train"))
        .arg(recipe)
        .arg("--no-reuse")
        .args(extra)
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    // When the watched file was first seen written by this run.
    let mut seen: Option<Instant> = None;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            assert!(status.success(), "the run failed: {text}");
            return true;
        }
        let due = match kill {
            None => false,
            Some(Kill::After(d)) => t0.elapsed() >= *d,
            Some(Kill::When(file, d)) => {
                let written = std::fs::metadata(run_dir.join(file))
                    .and_then(|m| m.modified())
                    .is_ok_and(|m| m > started);
                if written && seen.is_none() {
                    seen = Some(Instant::now());
                }
                seen.is_some_and(|s| s.elapsed() >= *d)
            }
        };
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "the run never ended"
        );
        if due {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            let mut f = std::fs::OpenOptions::new().append(true).open(log).unwrap();
            std::io::Write::write_all(&mut f, format!("--- killed: {kill:?}\n").as_bytes())
                .unwrap();
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Kill `recipe`'s run at each of `kills` in turn (resuming after each), then let it finish.
fn killed_run(recipe: &Path, run_dir: &Path, kills: &[Kill], log: &Path) {
    let mut first = true;
    for k in kills {
        let flags: &[&str] = if first { &[] } else { &["--resume"] };
        first = false;
        if run(recipe, run_dir, flags, Some(k), log) {
            return;
        }
    }
    let flags: &[&str] = if first { &[] } else { &["--resume"] };
    run(recipe, run_dir, flags, None, log);
}

/// Keys that time the run rather than compute it.
const TIMING: [&str; 4] = ["samples_per_s", "time_s", "peak_rss_mb", "wall_time_s"];

/// A metrics.jsonl without its timing fields.
fn metrics(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            for k in TIMING {
                v.as_object_mut().unwrap().remove(k);
            }
            v
        })
        .collect()
}

/// Every TensorBoard scalar (but timings) of each events folder, as TensorBoard reads them:
/// `{folder: {tag: [[step, value], …]}}`.
fn tensorboard(dirs: &[PathBuf]) -> serde_json::Value {
    let script = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
out = {}
for d in sys.argv[1:]:
    acc = EventAccumulator(d); acc.Reload()
    out[d] = {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]
              if not any(t.endswith(k) for k in ("samples_per_s", "time_s", "peak_rss_mb"))}
print(json.dumps(out))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(dirs)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "TensorBoard could not read the events (pip install -r requirements-test.txt): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The killed run `b` against the uninterrupted run `a`: the same bytes in every checkpoint and
/// ONNX file, the same metrics lines and TensorBoard points (each step once), the same report.
fn assert_same_runs(a: &Path, b: &Path, log: &Path, (min_files, min_logs): (usize, usize)) {
    let why = || std::fs::read_to_string(log).unwrap_or_default();
    let mut compared = 0;
    for name in ["model.bpk", "config.json", "model.onnx"] {
        for f in files_named(a, name) {
            let rel = f.strip_prefix(a).unwrap();
            let other = std::fs::read(b.join(rel))
                .unwrap_or_else(|e| panic!("{}: {e}\n{}", b.join(rel).display(), why()));
            assert!(
                std::fs::read(&f).unwrap() == other,
                "{} differs after the kills\n{}",
                rel.display(),
                why()
            );
            compared += 1;
        }
    }
    assert!(compared >= min_files, "only {compared} files compared");
    let logs = files_named(a, "metrics.jsonl");
    assert!(logs.len() >= min_logs, "{logs:?}");
    let mut events = Vec::new();
    for f in &logs {
        let rel = f.strip_prefix(a).unwrap();
        assert_eq!(
            metrics(f),
            metrics(&b.join(rel)),
            "{} differs after the kills\n{}",
            rel.display(),
            why()
        );
        let dir = f.parent().unwrap().join("events");
        events.push(dir.clone());
        events.push(b.join(dir.strip_prefix(a).unwrap()));
    }
    let tb = tensorboard(&events);
    for pair in events.chunks(2) {
        let (x, y) = (
            &tb[pair[0].to_str().unwrap()],
            &tb[pair[1].to_str().unwrap()],
        );
        assert!(!x.as_object().unwrap().is_empty());
        assert_eq!(
            x,
            y,
            "{} vs {}\n{}",
            pair[0].display(),
            pair[1].display(),
            why()
        );
    }
    let stages = |r: &Path| -> Vec<(serde_json::Value, serde_json::Value, serde_json::Value)> {
        read_json(&r.join("report.json"))["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["model"]["valid"].clone(),
                    s["model"]["test"].clone(),
                    s["steps"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(stages(a), stages(b), "{}", why());
}

/// Both runs of one chain, the recipe written by `recipe(dir, run name)`: uninterrupted into
/// `runs/<name>`, killed into `runs/<name>-killed`.
fn check_chain(
    tmp: &Path,
    (name, recipe): Chain,
    kills: impl Fn(Duration) -> Vec<Kill>,
    min: (usize, usize),
) {
    let whole = recipe(tmp, name);
    let killed_name = format!("{name}-killed");
    let killed = recipe(tmp, &killed_name);
    let (a, b) = (
        tmp.join("runs").join(name),
        tmp.join("runs").join(&killed_name),
    );
    let log = tmp.join(format!("{name}.log"));
    let t0 = Instant::now();
    run(
        &whole,
        &a,
        &[],
        None,
        &tmp.join(format!("{name}-whole.log")),
    );
    let kills = kills(t0.elapsed());
    killed_run(&killed, &b, &kills, &log);
    let text = std::fs::read_to_string(&log).unwrap();
    eprintln!("{name}: kills {kills:?}");
    assert!(text.contains("--- killed"), "no kill landed: {text}");
    assert_same_runs(&a, &b, &log, min);
}

#[test]
fn killed_training_stages_resume_to_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let seed = kill_seed();
    eprintln!("MOPT_KILL_SEED={seed}");
    let recipe = text_recipe(TRAINING_CHAIN);
    let chain: Chain = ("chain", &recipe);
    check_chain(
        tmp.path(),
        chain,
        |whole| {
            let mut rng = Rng(seed);
            let mut ms = |hi: f64| Duration::from_secs_f64(rng.uniform(0.0, hi));
            // In stage order, each a random moment after a state of that fit was written, then
            // anywhere.
            let mut kills = vec![
                Kill::When("02-distill/twin/state/position.json", ms(0.2)),
                Kill::When("03-prune/round-2/state/position.json", ms(0.1)),
                Kill::When("04-qat/state/position.json", ms(0.1)),
            ];
            for _ in 0..3 {
                kills.push(Kill::After(whole.mul_f64(ms(0.5).as_secs_f64())));
            }
            kills
        },
        (20, 6),
    );
    let log = std::fs::read_to_string(tmp.path().join("chain.log")).unwrap();
    // The watched kills landed inside training: those fits went on from their saved states.
    for stage in ["distill", "prune", "qat"] {
        let resumed = log
            .lines()
            .any(|l| l.starts_with(stage) && l.contains("resuming from its training state"));
        assert!(resumed, "{stage} never resumed from a state: {log}");
    }
}

#[test]
fn killed_ptq_and_export_stages_resume_to_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let seed = kill_seed();
    eprintln!("MOPT_KILL_SEED={seed}");
    let kills = |whole: Duration| {
        let mut rng = Rng(seed ^ 1);
        (0..4)
            .map(|_| Kill::After(whole.mul_f64(rng.uniform(0.2, 0.8))))
            .collect()
    };
    check_chain(tmp.path(), ("ptq", &text_recipe(PTQ_CHAIN)), kills, (6, 1));
}

#[test]
fn killed_image_stages_resume_to_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let seed = kill_seed();
    eprintln!("MOPT_KILL_SEED={seed}");
    let kills = |whole: Duration| {
        let mut rng = Rng(seed ^ 2);
        let mut kills = vec![Kill::When(
            "02-student/twin/state/position.json",
            Duration::from_secs_f64(rng.uniform(0.0, 0.2)),
        )];
        for _ in 0..4 {
            kills.push(Kill::After(whole.mul_f64(rng.uniform(0.05, 0.5))));
        }
        kills
    };
    check_chain(tmp.path(), ("image", &image_recipe), kills, (16, 6));
}

/// Kills for a one-stage finetune run: a random moment just after its first state was written,
/// then one anywhere in the first 60% of the run's length.
fn finetune_kills(seed: u64, whole: Duration) -> Vec<Kill> {
    let mut rng = Rng(seed);
    vec![
        Kill::When(
            "01-finetune/state/position.json",
            Duration::from_secs_f64(rng.uniform(0.0, 0.1)),
        ),
        Kill::After(whole.mul_f64(rng.uniform(0.1, 0.6))),
    ]
}

/// fp16 with dynamic loss scaling: the scaler's state (scale, clean steps, skips) is part of the
/// training state, so a resumed run scales and skips exactly as the uninterrupted one.
#[test]
fn a_killed_fp16_run_resumes_with_its_loss_scale() {
    let tmp = tempfile::tempdir().unwrap();
    let seed = kill_seed();
    eprintln!("MOPT_KILL_SEED={seed}");
    let stages = "[[stage]]\nkind = \"finetune\"\n[stage.train]\nepochs = 3\n";
    // A low growth interval, so that the scale changes inside the run.
    let extra = "precision = \"fp16\"\nloss-scale-growth-interval = 3";
    let recipe = |dir: &Path, name: &str| chain_recipe_with(dir, name, extra, stages);
    let kills = |whole: Duration| finetune_kills(seed ^ 3, whole);
    check_chain(tmp.path(), ("fp16", &recipe), kills, (4, 1));
    let report = read_json(&tmp.path().join("runs/fp16-killed/01-finetune/report.json"));
    assert!(
        report["loss_scale"]["scale"].as_f64().unwrap() > 65536.0,
        "{report}"
    );
}

/// Data parallel over two CPU replicas with dropout: each shard's dropout seeds follow from
/// the seed and the position, so a resumed run draws the masks the uninterrupted one drew.
#[test]
fn a_killed_data_parallel_run_resumes_to_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let seed = kill_seed();
    eprintln!("MOPT_KILL_SEED={seed}");
    let stages = "[[stage]]\nkind = \"finetune\"\n[stage.train]\nepochs = 3\nbatch-size = 8\n";
    let recipe = |dir: &Path, name: &str| {
        let p = chain_recipe(dir, name, stages);
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replace("seed = 7\n", "seed = 7\ndevices = [0, 1]\n");
        std::fs::write(&p, text).unwrap();
        p
    };
    let kills = |whole: Duration| finetune_kills(seed ^ 4, whole);
    check_chain(tmp.path(), ("parallel", &recipe), kills, (4, 1));
    let log = std::fs::read_to_string(tmp.path().join("parallel.log")).unwrap();
    assert!(log.contains("resuming from its training state"), "{log}");
}

/// A one-stage finetune (3 epochs) run whole into `runs/whole` (`a`), and the same recipe as
/// `cut` to run into `runs/cut` (`b`), its stderr to `log`.
struct Cut {
    cut: PathBuf,
    a: PathBuf,
    b: PathBuf,
    log: PathBuf,
}

fn whole_then_cut(dir: &Path) -> Cut {
    let stages = "[[stage]]\nkind = \"finetune\"\n[stage.train]\nepochs = 3\n";
    let whole = chain_recipe(dir, "whole", stages);
    let a = dir.join("runs/whole");
    run(&whole, &a, &[], None, &dir.join("whole.log"));
    Cut {
        cut: chain_recipe(dir, "cut", stages),
        a,
        b: dir.join("runs/cut"),
        log: dir.join("cut.log"),
    }
}

/// Run `recipe` into `run_dir` and kill it `after` the run first wrote `file`.
fn cut_at(recipe: &Path, run_dir: &Path, file: &'static str, after: Duration, log: &Path) {
    let when = Kill::When(file, after);
    assert!(
        !run(recipe, run_dir, &[], Some(&when), log),
        "finished before the kill"
    );
}

/// A corrupted training state is named and passed over for the one before it, and the run still
/// ends with the uninterrupted run's bytes.
#[test]
fn a_corrupt_training_state_is_named_and_the_previous_one_used() {
    let tmp = tempfile::tempdir().unwrap();
    let Cut { cut, a, b, log } = whole_then_cut(tmp.path());
    // Killed once two states are on disk.
    cut_at(
        &cut,
        &b,
        "01-finetune/state.prev/position.json",
        Duration::ZERO,
        &log,
    );
    let state = b.join("01-finetune/state");
    let weights = state.join("model.bpk");
    let mut bytes = std::fs::read(&weights).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x40;
    std::fs::write(&weights, bytes).unwrap();
    run(&cut, &b, &["--resume"], None, &log);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!("training state {} not used", state.display()))
            && text.contains(&format!("{} is corrupt", weights.display())),
        "{text}"
    );
    assert!(
        text.contains("resuming from its training state at step"),
        "{text}"
    );
    assert_same_runs(&a, &b, &log, (4, 1));
    assert!(
        !b.join("01-finetune/state").exists() && !b.join("01-finetune/state.prev").exists(),
        "a finished fit removes its states"
    );
}

/// Whether this process runs as root (which writes through file permissions).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

/// The binary on `args`, without the capabilities that let root write through permissions.
fn mopt_unprivileged(args: &[&str]) -> std::process::Output {
    let bin = env!("CARGO_BIN_EXE_mopt-train");
    let mut cmd = if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--bounding-set=-dac_override,-dac_read_search,-fowner",
            "--",
            bin,
        ]);
        c
    } else {
        Command::new(bin)
    };
    cmd.args(args)
        .output()
        .expect("run mopt-train (and setpriv when root)")
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    tree(dir)
        .into_iter()
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

fn set_writable(dir: &Path, writable: bool) {
    use std::os::unix::fs::PermissionsExt;
    let mode = |is_dir: bool| match (is_dir, writable) {
        (true, true) => 0o755,
        (true, false) => 0o555,
        (false, true) => 0o644,
        (false, false) => 0o444,
    };
    // Permissions need ownership, not a writable folder: any order will do.
    for p in tree(dir) {
        let m = std::fs::Permissions::from_mode(mode(p.is_dir()));
        std::fs::set_permissions(&p, m).unwrap();
    }
}

/// A read-only output folder: a new run is refused with the folder named and nothing made; a
/// killed run resumed into a read-only run folder fails naming the file it could not write and
/// changes nothing, and once writable again it resumes to the uninterrupted run's bytes.
#[test]
fn a_read_only_output_folder_fails_cleanly_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let Cut { cut, a, b, log } = whole_then_cut(tmp.path());
    // The run with `flags` while `folder` is read-only: refused, naming the run folder.
    let refused = |folder: &Path, flags: &[&str]| {
        set_writable(folder, false);
        let out = mopt_unprivileged(&[&[cut.to_str().unwrap(), "--no-reuse"], flags].concat());
        set_writable(folder, true);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(matches!(out.status.code(), Some(1 | 2)), "{err}");
        assert!(
            err.contains(&b.display().to_string()) && err.contains("ermission denied"),
            "{err}"
        );
        err
    };

    // A fresh run into a read-only output folder.
    refused(&tmp.path().join("runs"), &[]);
    assert!(!b.exists(), "nothing made");

    // Killed inside its training, then resumed into a read-only run folder.
    cut_at(
        &cut,
        &b,
        "01-finetune/state/position.json",
        Duration::from_millis(30),
        &log,
    );
    let before = snapshot(&b);
    let err = refused(&b, &["--resume"]);
    assert!(
        snapshot(&b) == before,
        "the read-only run folder changed: {err}"
    );
    run(&cut, &b, &["--resume"], None, &log);
    assert_same_runs(&a, &b, &log, (4, 1));
}

/// A write that fails mid-file (a full disk, simulated by a file-size limit: a file cannot grow
/// past 2 MiB, so the next checkpoint or state cannot be written) stops the run with an error
/// naming the file and the fix; the last good state and checkpoints stay as they were, and a
/// resume once there is room ends with the uninterrupted run's bytes.
#[test]
fn a_failed_write_keeps_the_last_good_state() {
    let tmp = tempfile::tempdir().unwrap();
    let Cut { cut, a, b, log } = whole_then_cut(tmp.path());
    cut_at(
        &cut,
        &b,
        "01-finetune/state.prev/position.json",
        Duration::ZERO,
        &log,
    );
    let stage = b.join("01-finetune");
    let kept = |d: &Path| {
        snapshot(&d.join("state"))
            .into_iter()
            .chain(snapshot(&d.join("state.prev")))
    };
    let before: Vec<_> = kept(&stage).collect();
    // SIGXFSZ ignored (kept across exec): a write past the limit fails with EFBIG instead.
    let script = format!(
        "trap '' XFSZ; ulimit -f 2048; exec '{}' '{}' --no-reuse --resume",
        env!("CARGO_BIN_EXE_mopt-train"),
        cut.display()
    );
    let out = Command::new("bash").args(["-c", &script]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the disk is full") && err.contains("--resume"),
        "{err}"
    );
    assert!(
        err.contains(&stage.display().to_string()),
        "names the file: {err}"
    );
    let after: Vec<_> = kept(&stage).collect();
    assert!(before == after, "the saved states changed: {err}");
    assert!(
        !stage.join("state.tmp").exists(),
        "no half-written state left"
    );
    run(&cut, &b, &["--resume"], None, &log);
    assert_same_runs(&a, &b, &log, (4, 1));
}
