//! Remote devices (`mopt-train serve`, `[run] devices = ["ws://..."]`): training data-parallel
//! over servers in other processes, addresses and tokens checked before a run folder exists,
//! and a server killed mid-run ending the run with a message naming it, `--resume` on a
//! replacement server finishing with the metrics of an uninterrupted run.

#![cfg(feature = "remote")]

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `mopt-train serve` process on a free port of 127.0.0.1, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(token_file: Option<&Path>) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mopt-train"));
        cmd.args(["serve", "--host", "127.0.0.1", "--port", "0"]);
        if let Some(f) = token_file {
            cmd.arg("--token-file").arg(f);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mopt-train serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        // Keep reading the server's log, so that it never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("ws://"))
            .unwrap_or_else(|| panic!("no address in `{line}`"))
            .to_string();
        Server { child, url }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The tiny recipe without dropout, `batch` examples per device, on `devices` (a TOML list);
/// 4 epochs instead of 2 when `extra_train` is given.
fn recipe(dir: &Path, name: &str, batch: usize, devices: &str, extra_train: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = write_tiny_recipe(dir, name, extra_train);
    let epochs = if extra_train.is_empty() { 2 } else { 4 };
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("epochs = 2\n", &format!("epochs = {epochs}\n"))
        .replace("seed = 7\n", &format!("seed = 7\n{devices}\n"))
        .replace("[model]\n", "[model]\ndropout = 0.0\n")
        .replace("batch-size = 16", &format!("batch-size = {batch}"));
    std::fs::write(&p, text).unwrap();
    p
}

fn report(dir: &Path, name: &str) -> serde_json::Value {
    read_json(&dir.join(format!("runs/{name}/01-finetune/report.json")))
}

fn loss(r: &serde_json::Value) -> f64 {
    r["test"]["loss"].as_f64().unwrap()
}

#[test]
fn two_and_three_servers_train_as_one_device_with_their_total_batch() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start(None)).collect();
    let tmp = tempfile::tempdir().unwrap();
    // Two servers: the plan, then the run against one device of batch 3 x 8.
    let urls = |n: usize| {
        servers[..n]
            .iter()
            .map(|s| format!("\"{}\"", s.url))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let two = recipe(
        &tmp.path().join("two"),
        "two",
        8,
        &format!("devices = [0, {}]", urls(2)),
        "",
    );
    let check = mopt(&[two.to_str().unwrap(), "--check"]);
    assert!(check.status.success(), "{}", stderr(&check));
    let plan = String::from_utf8_lossy(&check.stdout).into_owned();
    let shown = format!(
        "data-parallel on devices [0, {}, {}]: batch-size 8 per device, effective batch 8 x 3",
        servers[0].url, servers[1].url
    );
    assert!(plan.contains(&shown), "{plan}");
    assert!(
        plan.contains("devices  main (0): the memory above, optimizer state included (not sharded); each of the 2 others")
            && plan.contains("over the network a step for each remote device")
            && plan.contains("gradients gathered and summed on the main device (Burn's multi-device strategy")
            && plan.contains("one optimizer step on the main device (0)"),
        "{plan}"
    );
    for n in [2, 3] {
        let dir = tmp.path().join(format!("servers{n}"));
        let remote = recipe(
            &dir,
            "remote",
            8,
            &format!("devices = [0, {}]", urls(n)),
            "",
        );
        let one_dir = tmp.path().join(format!("one{n}"));
        let one = recipe(&one_dir, "one", 8 * (n + 1), "", "");
        for r in [&remote, &one] {
            let out = mopt(&[r.to_str().unwrap(), "--max-steps", "3"]);
            assert!(out.status.success(), "{}", stderr(&out));
        }
        let (r, o) = (report(&dir, "remote"), report(&one_dir, "one"));
        assert_eq!(r["steps"], 3);
        // The same examples a step, split in shards of 8 whose losses are weighted by their
        // share; the servers run Burn's own kernels, the local device mopt's: the losses agree
        // to rounding.
        assert!(
            (loss(&o) - loss(&r)).abs() < 1e-4 * loss(&o).abs().max(1.0),
            "{n} servers: {} vs one device {}",
            loss(&r),
            loss(&o)
        );
    }
    // A single-device run of batch 8 takes other steps: the servers were used.
    let small = recipe(&tmp.path().join("small"), "small", 8, "", "");
    let out = mopt(&[small.to_str().unwrap(), "--max-steps", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r = report(&tmp.path().join("servers2"), "remote");
    assert!((loss(&report(&tmp.path().join("small"), "small")) - loss(&r)).abs() > 1e-5);
}

#[test]
fn bad_addresses_and_tokens_fail_before_the_run_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let token = tmp.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let wrong = tmp.path().join("wrong");
    std::fs::write(&wrong, "guess").unwrap();
    let guarded = Server::start(Some(&token));
    // A port nothing listens on: bind one, then free it.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("ws://127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let cases: [(&str, Option<&Path>, &str, &[&str]); 4] = [
        (
            "closed",
            None,
            &closed,
            &["remote device", "mopt-train serve --port"],
        ),
        (
            "no-token",
            None,
            &guarded.url,
            &["asks for a token", "--token-file"],
        ),
        (
            "wrong-token",
            Some(&wrong),
            &guarded.url,
            &["refused this token"],
        ),
        (
            "bad-device",
            Some(&token),
            &format!("{}#3", guarded.url),
            &["hosts only 1 device", "from #0 to #0"],
        ),
    ];
    for (name, token_file, url, expect) in cases {
        let r = recipe(
            tmp.path(),
            name,
            8,
            &format!("devices = [0, \"{url}\"]"),
            "",
        );
        let mut args = vec![r.to_str().unwrap().to_string()];
        if let Some(f) = token_file {
            args.extend(["--token-file".into(), f.to_str().unwrap().into()]);
        }
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let started = Instant::now();
        let out = mopt(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(url), "{name}: {err}");
        for e in expect {
            assert!(err.contains(e), "{name}: `{e}` not in {err}");
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{name}");
        assert!(!tmp.path().join("runs").join(name).exists(), "{name}");
    }
    // Local indices beside a remote main device would all mean that server.
    let r = recipe(tmp.path(), "mixed", 8, "devices = [0, 1]", "");
    let out = mopt(&[r.to_str().unwrap(), "--device", &guarded.url]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("lists local device indices"),
        "{}",
        stderr(&out)
    );
    assert!(!tmp.path().join("runs/mixed").exists());
    // The right token trains.
    let r = recipe(
        tmp.path(),
        "ok",
        8,
        &format!("devices = [0, \"{}\"]", guarded.url),
        "",
    );
    let out = mopt(&[
        r.to_str().unwrap(),
        "--token-file",
        token.to_str().unwrap(),
        "--max-steps",
        "1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// The step of the training state saved last (`state/position.json`), if any.
fn saved_step(run: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(run.join("01-finetune/state/position.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["step"].as_u64()
}

/// Start a run of `recipe` (with `MOPT_REMOTE_STEP_TIMEOUT_S = timeout` if given) and return
/// it, still running, once its first stage has saved the training state of step `steps`.
fn start_until_saved(recipe: &Path, run_dir: &Path, steps: u64, timeout: Option<&str>) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mopt-train"));
    if let Some(t) = timeout {
        cmd.env("MOPT_REMOTE_STEP_TIMEOUT_S", t);
    }
    let mut child = cmd
        .arg(recipe)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while saved_step(run_dir).unwrap_or(0) < steps {
        assert!(Instant::now() < deadline, "no training state saved");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before the server failed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

#[test]
fn a_server_killed_mid_run_ends_it_and_resume_on_a_replacement_finishes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let extra = "state-every = 1";
    // The uninterrupted run.
    let mut first = Server::start(None);
    let whole = recipe(
        &tmp.path().join("whole"),
        "whole",
        8,
        &format!("devices = [0, \"{}\"]", first.url),
        extra,
    );
    let out = mopt(&[whole.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The same run, its server killed at a step drawn from the clock (1 to 4 steps saved; the
    // message says which, for a failure to be replayed).
    let at = 1 + std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        % 4;
    eprintln!("killing the server once {at} steps are saved");
    let cut = recipe(
        &tmp.path().join("cut"),
        "cut",
        8,
        &format!("devices = [0, \"{}\"]", first.url),
        extra,
    );
    let run_dir = tmp.path().join("cut/runs/cut");
    let child = start_until_saved(&cut, &run_dir, at, None);
    first.kill();
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&first.url) && err.contains("--resume"),
        "{err}"
    );
    // A replacement server at another address; the recipe's copy records the device count only.
    let second = Server::start(None);
    let devices = format!("0,{}", second.url);
    let out = mopt(&[cut.to_str().unwrap(), "--resume", "--devices", &devices]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (w, c) = (
        report(&tmp.path().join("whole"), "whole"),
        report(&tmp.path().join("cut"), "cut"),
    );
    assert_eq!(w["steps"], c["steps"]);
    assert_eq!(
        loss(&w),
        loss(&c),
        "resumed run differs from the uninterrupted one"
    );
    assert_eq!(w["valid"], c["valid"]);
    // Byte-identical: every checkpoint's weights and config.
    let (a, b) = (tmp.path().join("whole/runs/whole"), run_dir);
    let mut compared = 0;
    for name in ["model.bpk", "config.json"] {
        for f in files_named(&a, name) {
            let rel = f.strip_prefix(&a).unwrap();
            assert!(
                std::fs::read(&f).unwrap() == std::fs::read(b.join(rel)).unwrap(),
                "{} differs between the uninterrupted and the resumed run (killed at step {at})",
                rel.display()
            );
            compared += 1;
        }
    }
    assert!(compared >= 2, "only {compared} files compared");
}

#[test]
fn a_server_that_stops_answering_ends_the_run_within_the_step_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let mut server = Server::start(None);
    let r = recipe(
        tmp.path(),
        "stalled",
        8,
        &format!("devices = [\"{}\"]", server.url),
        "state-every = 1",
    );
    let run_dir = tmp.path().join("runs/stalled");
    let child = start_until_saved(&r, &run_dir, 1, Some("3"));
    // The server stops (its connection stays open, nothing answers).
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let stopped = Instant::now();
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("made no progress for 3 s") && err.contains(&server.url),
        "{err}"
    );
    assert!(
        stopped.elapsed() < Duration::from_secs(60),
        "{:?}",
        stopped.elapsed()
    );
    server.kill();
}

/// Every stage kind that trains, over a local device and a server: fine-tune, distillation with
/// a live teacher (and its hard-label twin) and with the cached one, pruning in two rounds with
/// KD recovery, QAT. Against the same chain on two local replicas, stage by stage.
#[test]
fn every_training_stage_kind_runs_on_a_server() {
    let server = Server::start(None);
    let tmp = tempfile::tempdir().unwrap();
    let chain = |dir: &Path, name: &str, batch: usize, devices: &str| {
        let p = recipe(dir, name, batch, devices, "");
        let cfg = dir.join("tiny-config.json");
        let distill = |stage: &str, cache: bool, twin: bool| {
            format!(
                "[[stage]]\nkind = \"distill\"\nname = \"{stage}\"\nalpha = 0.5\ntemperature = 2.0\nteacher-cache = {cache}\nbaseline = {twin}\n\
                 [stage.student]\nconfig = \"{}\"\ndropout = 0.0\ninit-from-teacher-layers = [0, 1]\n\n",
                cfg.display()
            )
        };
        let text = std::fs::read_to_string(&p).unwrap()
            + "\n[evaluation]\nlatency-runs = 0\nanalysis = false\n\n[[stage]]\nkind = \"finetune\"\n\n"
            + &distill("live", false, true)
            + &distill("cached", true, false)
            + "[[stage]]\nkind = \"prune\"\ncriterion = \"taylor\"\ntarget = 0.5\nstep = 0.25\nffn-multiple = 4\ndistill = true\n[stage.train]\nepochs = 1\n\n\
               [[stage]]\nkind = \"qat\"\ncalibration-samples = 32\n[stage.train]\nepochs = 1\nlr = 1e-4\n";
        std::fs::write(&p, text).unwrap();
        let out = mopt(&[p.to_str().unwrap(), "--max-steps", "2"]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        read_json(&dir.join(format!("runs/{name}/report.json")))
    };
    // One device with the total batch against the main device and a server, 8 each.
    let local = chain(&tmp.path().join("local"), "local", 16, "");
    let remote = chain(
        &tmp.path().join("remote"),
        "remote",
        8,
        &format!("devices = [0, \"{}\"]", server.url),
    );
    let stages = |r: &serde_json::Value| r["stages"].as_array().unwrap().clone();
    let (a, b) = (stages(&local), stages(&remote));
    assert_eq!(a.len(), 6, "baseline and five stages");
    for i in 1..6 {
        assert_eq!(a[i]["kind"], b[i]["kind"]);
        let loss = |s: &serde_json::Value| s["model"]["valid"]["loss"].as_f64().unwrap();
        assert!(
            (loss(&a[i]) - loss(&b[i])).abs() < 1e-4 * loss(&a[i]).abs().max(1.0),
            "stage {i} ({}): {} on one device vs {} with a server",
            a[i]["kind"],
            loss(&a[i]),
            loss(&b[i])
        );
    }
    assert_eq!(
        b.iter()
            .map(|s| s["kind"].as_str().unwrap().to_string())
            .collect::<Vec<_>>(),
        ["baseline", "finetune", "distill", "distill", "prune", "qat"]
    );
}
