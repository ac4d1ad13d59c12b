//! `mopt-train`'s command line as a function of the families and stage kinds it knows:
//! `mopt-train` is [`main`] with [`crate::builtin`], and a program with a model family of its
//! own gets the whole command line (a run, `--check`, `--resume`, `--seeds`, `--max-steps`,
//! `export`, `cache`, `lr-find`) with a main of a few lines:
//!
//! ```no_run
//! # struct MyFamily;
//! # fn my_family() -> mopt_families::image::ImageFamily<mopt_models::cnn::Cnn> {
//! #     mopt_families::image::ImageFamily::new()
//! # }
//! fn main() -> std::process::ExitCode {
//!     mopt::cli::main(mopt::builtin().with_family(my_family()))
//! }
//! ```
//!
//! Exit codes: 0 success; 2 bad recipe or input (nothing is written); 1 failure while running.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use mopt_stages::Registry;
use mopt_train::{rundir, TrainError};

#[derive(Parser, Debug)]
#[command(
    name = "mopt-train",
    version,
    about = "Make trained networks smaller and faster: run a mopt recipe",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The TOML recipe to run.
    #[arg(required = true)]
    recipe: Option<PathBuf>,
    /// Validate the recipe and print the stage plan (shapes, parameters, settings, gates, memory)
    /// without running anything (a dry run: an existing run folder does not stop it).
    #[arg(long)]
    check: bool,
    /// Replace an existing run folder (otherwise refused).
    #[arg(long, conflicts_with = "resume")]
    force: bool,
    /// Continue an interrupted run at its first unfinished stage; finished stages are reused
    /// after their outputs' sha256 is checked.
    #[arg(long)]
    resume: bool,
    /// Stop every training after N optimizer steps (smoke runs), a teacher trained on the way
    /// included; validation and test still run.
    #[arg(long, value_name = "N")]
    max_steps: Option<usize>,
    /// Run every stage here even when another run in the same output folder finished the same
    /// stage (same settings, input and baseline by sha256), which is reused by default.
    #[arg(long)]
    no_reuse: bool,
    /// Device to run on (overrides [run] device): `cpu`.
    #[arg(long)]
    device: Option<String>,
    /// Data-parallel devices (overrides [run] devices): indices of the device's backend and
    /// remote servers started by `mopt-train serve`, e.g. `--devices 0,ws://10.0.0.2:3000`.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    devices: Option<Vec<String>>,
    /// The token remote servers check (overrides [run] token-file).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Seed to run with (overrides `[run] seed`; the data split keeps `[data] split-seed`); the run
    /// folder becomes `<name>-seed<N>`, so that several seeds of one recipe sit side by side.
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Run once per seed (`--seeds 42,1,2`, each as `--seed`), then write
    /// `<output-dir>/<name>-seeds/summary.md` and `.json`: every stage's accuracy as mean ± std,
    /// and each stage against its references (the hard-label twin) as a paired difference with
    /// its 95% interval.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        conflicts_with = "seed"
    )]
    seeds: Option<Vec<u64>>,
}

#[derive(Subcommand, Debug)]
enum CacheAction {
    /// Every cache file under the folders: kind, size, age, path; totals by kind.
    List {
        /// Folders searched for `.mopt-cache/` (recursively).
        #[arg(default_value = "datasets/data")]
        roots: Vec<PathBuf>,
    },
    /// Remove cache files: all of them, or those the options select.
    Clean {
        /// Folders searched for `.mopt-cache/` (recursively).
        #[arg(default_value = "datasets/data")]
        roots: Vec<PathBuf>,
        /// Only files last written more than DAYS days ago.
        #[arg(long, value_name = "DAYS")]
        older_than: Option<f64>,
        /// Keep the newest N files of each kind in each cache folder.
        #[arg(long, value_name = "N", default_value_t = 0)]
        keep_latest: usize,
        /// List what would be removed, remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Subcommand, Debug)]
enum Command {
    /// LR range test: exponential sweep, loss curve written to `<run>-lr-find/`, suggested LR printed.
    LrFind {
        recipe: PathBuf,
        #[arg(long)]
        force: bool,
        #[arg(long)]
        device: Option<String>,
    },
    /// Export a run's best checkpoint to ONNX (and its teacher, for distillation recipes), with
    /// parity on real test sentences, a model card, and ONNX Runtime latency side by side.
    Export {
        recipe: PathBuf,
        /// Checkpoint folder (default `<run>/best`).
        #[arg(long)]
        checkpoint: Option<PathBuf>,
        /// Output folder (default `<run>/export`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Test sentences for the parity check.
        #[arg(long, default_value_t = 500)]
        samples: usize,
        /// ONNX Runtime latency runs at batch 32 (4x at batch 1); 0 skips the benchmark.
        #[arg(long, default_value_t = 30)]
        latency_runs: usize,
        /// Float parity tolerance, max |ONNX Runtime - mopt| logit (default: the recipe's export
        /// stage's `tolerance`, else 1e-4).
        #[arg(long)]
        tolerance: Option<f64>,
        #[arg(long)]
        force: bool,
    },
    /// The caches runs keep beside their data (`.mopt-cache/`: token ids, teacher outputs, teacher
    /// logits): list them, or remove old ones (a run rebuilds what it needs).
    Cache {
        #[command(subcommand)]
        action: CacheAction,
    },
    /// Continue a prompt with a language model and say how fast (prompt and generation apart):
    /// greedy by default, sampled with `--temperature` above 0.
    Generate {
        /// A recipe (its run's `best/` model), a checkpoint folder, or a GGUF file.
        model: PathBuf,
        /// The text to continue.
        #[arg(long)]
        prompt: String,
        /// At most this many new tokens (fewer when the model ends the text).
        #[arg(long, default_value_t = 32)]
        max_new_tokens: usize,
        /// 0: greedy; above 0: draw from softmax(logits / T).
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// Draw among the K most likely tokens (0: all).
        #[arg(long, default_value_t = 0)]
        top_k: usize,
        /// Seed of the draws.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Also print the prompt's and the new tokens' ids (stderr).
        #[arg(long)]
        ids: bool,
    },
    /// Zero-shot accuracy of a language model on the suites `datasets/fetch.sh --lm-eval` fetched
    /// (lm-evaluation-harness's scoring: `acc`, `acc_norm` per character, bits per byte), a
    /// table on stdout and JSON with `--json`.
    Eval {
        /// A recipe (its run's `best/` model), a checkpoint folder, or a GGUF file.
        model: PathBuf,
        /// Comma-separated tasks (hellaswag, arc_easy, arc_challenge, piqa, winogrande, boolq,
        /// csqa, openbookqa, sciq, socialiqa, lambada).
        #[arg(
            long,
            default_value = "hellaswag,arc_easy,arc_challenge,piqa,winogrande,boolq"
        )]
        tasks: String,
        /// At most this many documents a task, drawn with `--seed` (default: every document).
        #[arg(long)]
        limit: Option<usize>,
        /// Seed of the `--limit` draw.
        #[arg(long, default_value_t = 1234)]
        seed: u64,
        /// The folder of the request files.
        #[arg(long, default_value = "datasets/data/lm-eval")]
        data_dir: PathBuf,
        /// Also write the results as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Write a checkpoint folder in another program's format, as its family lists them (BERT:
    /// `hf`; Llama: `gguf`, `gguf-f16`, `gguf-q8_0`).
    Convert {
        /// A checkpoint folder (e.g. `checkpoints/<run>/best`).
        checkpoint: PathBuf,
        /// The format.
        #[arg(long)]
        to: String,
        /// Output folder or file, as the format writes.
        #[arg(long)]
        out: PathBuf,
    },
    /// Serve this machine's device to remote runs (`[run] devices = ["ws://HOST:PORT"]`) over
    /// Burn's remote backend (WebSocket: unencrypted, for a trusted network), until SIGTERM or
    /// Ctrl+C. Needs a build with `--features remote`.
    Serve {
        /// TCP port to listen on (0: one the system picks, printed).
        #[arg(long, default_value_t = 3000)]
        port: u16,
        /// Address to listen on (this machine only unless given: `--host 0.0.0.0` serves the
        /// network, with `--token-file` on anything but a trusted one).
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Accept only clients presenting the token in this file.
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// The device served: `cpu`, or a GPU of a build with its feature.
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// Write a mopt checkpoint folder as HF-style `model.safetensors` + `config.json`
    /// (`convert --to hf`).
    ExportHf {
        /// A checkpoint folder (e.g. `checkpoints/<run>/best`).
        checkpoint: PathBuf,
        /// Output folder.
        out: PathBuf,
    },
}

fn run(cli: Cli, registry: &Registry) -> anyhow::Result<()> {
    // Failure injection for the tests of the binary's own error paths.
    if std::env::var("MOPT_FAILPOINT").as_deref() == Ok("panic") {
        panic!("failpoint MOPT_FAILPOINT=panic");
    }
    match cli.command {
        Some(Command::LrFind {
            recipe,
            force,
            device,
        }) => lr_find(registry, &recipe, force, device.as_deref()),
        Some(Command::Export {
            recipe,
            checkpoint,
            out,
            samples,
            latency_runs,
            tolerance,
            force,
        }) => {
            let opts = mopt_stages::export_recipe::RecipeExport {
                checkpoint,
                out,
                samples,
                force,
                latency_runs,
                tolerance,
            };
            export(registry, &recipe, &opts)
        }
        Some(Command::Cache { action }) => cache(action),
        Some(Command::Generate {
            model,
            prompt,
            max_new_tokens,
            temperature,
            top_k,
            seed,
            ids,
        }) => {
            let settings = mopt_stages::generate::GenerateSettings {
                max_new_tokens,
                temperature,
                top_k,
                seed,
            };
            generate(registry, (&model, &prompt), &settings, ids)
        }
        Some(Command::Convert {
            checkpoint,
            to,
            out,
        }) => convert(registry, &checkpoint, &to, &out),
        Some(Command::Eval {
            model,
            tasks,
            limit,
            seed,
            data_dir,
            json,
        }) => zero_shot(
            registry,
            &model,
            (&tasks, limit, seed),
            (&data_dir, json.as_deref()),
        ),
        Some(Command::ExportHf { checkpoint, out }) => convert(registry, &checkpoint, "hf", &out),
        Some(Command::Serve {
            port,
            host,
            token_file,
            device,
        }) => serve(&host, port, token_file.as_deref(), &device),
        None => run_seeds(registry, &cli.run),
    }
}

/// `mopt-train lr-find`.
fn lr_find(
    registry: &Registry,
    recipe: &std::path::Path,
    force: bool,
    device: Option<&str>,
) -> anyhow::Result<()> {
    let recipe = mopt_recipe::load(recipe)?;
    let device = mopt_stages::recipe_device(&recipe, device)?;
    let dir = recipe
        .run
        .output_dir
        .join(format!("{}-lr-find", recipe.run.name));
    rundir::create_run_dir(&recipe, &dir, force)?;
    let result = mopt_stages::lr_find::lr_find(registry, &recipe, &device, &dir)?;
    println!(
        "suggested lr: {:.2e} (steepest descent of the smoothed loss; {} points{}) — curve in {}",
        result.suggested_lr,
        result.points.len(),
        if result.stopped_early {
            ", stopped when the loss diverged"
        } else {
            ""
        },
        dir.join("lr-find.csv").display()
    );
    Ok(())
}

/// The model a command names (a recipe: its run's `best/`), with its family: from the recipe,
/// the checkpoint's `config.json` or the GGUF's architecture.
fn model_source<'a>(
    registry: &'a Registry,
    model: &std::path::Path,
) -> anyhow::Result<(&'a mopt_stages::family::FamilyEntry, PathBuf)> {
    use mopt_stages::StageError;
    let (family, source) = if model.extension().is_some_and(|x| x == "toml") {
        let recipe = mopt_recipe::load(model)?;
        let best = recipe.run.run_dir().join("best");
        (registry.recipe_family(&recipe)?, best)
    } else {
        let family = registry.source_family(model).ok_or_else(|| {
            StageError::Unsupported(format!(
                "{}: not a model of a registered family (a checkpoint folder whose config.json names its model_type, a GGUF file, or a recipe)",
                model.display()
            ))
        })?;
        (family, model.to_path_buf())
    };
    if !source.exists() {
        return Err(StageError::Unsupported(format!(
            "{}: no model there: run the recipe first",
            source.display()
        ))
        .into());
    }
    Ok((family, source))
}

/// `mopt-train eval`: every task's documents read first (a bad task or file fails before any
/// scoring), then scored with a progress bar; a table on stdout, JSON where asked.
fn zero_shot(
    registry: &Registry,
    model: &std::path::Path,
    (tasks, limit, seed): (&str, Option<usize>, u64),
    (data_dir, json): (&std::path::Path, Option<&std::path::Path>),
) -> anyhow::Result<()> {
    use mopt_stages::zero_shot::{evaluate_task, task_documents, CanScore};
    use mopt_stages::StageError;
    let (family, source) = model_source(registry, model)?;
    let Some(can) = family.capability::<dyn CanScore>() else {
        return Err(StageError::Unsupported(format!(
            "`{}` models do not score text continuations (a language-model family does)",
            family.arch()
        ))
        .into());
    };
    let names: Vec<&str> = tasks
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    let docs = names
        .iter()
        .map(|t| task_documents(data_dir, t, limit, seed))
        .collect::<Result<Vec<_>, _>>()?;
    eprintln!("loading {}", source.display());
    let scorer = can.scorer(&source)?;
    let mut results = Vec::new();
    for (task, docs) in names.iter().zip(&docs) {
        let mut bar = mopt_train::logging::Progress::new(task, docs.len());
        let start = std::time::Instant::now();
        let r = evaluate_task(scorer.as_ref(), task, docs, |k| {
            let rate = k as f64 / start.elapsed().as_secs_f64().max(1e-9);
            bar.update(k, &format!("{rate:.1} docs/s"));
        })?;
        bar.finish(&format!("{:.1} docs/s", r.docs_per_sec));
        results.push(r);
    }
    println!("{}", zero_shot_table(&results));
    if let Some(path) = json {
        let out = serde_json::json!({
            "model": source.display().to_string(),
            "limit": limit,
            "seed": seed,
            "tasks": results,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&out)?)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// The results as a Markdown table: each task's accuracies with their standard errors, chance,
/// bits per byte and speed, then the mean accuracy of the multiple-choice tasks.
fn zero_shot_table(results: &[mopt_stages::zero_shot::TaskResult]) -> String {
    let pct = |e: Option<mopt_stages::zero_shot::Estimate>| {
        e.map_or("-".to_string(), |e| {
            format!("{:.2} ± {:.2}", 100.0 * e.mean, 100.0 * e.stderr)
        })
    };
    let mut s = String::from("| task | docs | acc % | acc_norm % | chance % | bits/byte | docs/s |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for r in results {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.4} | {:.1} |\n",
            r.task,
            r.documents,
            pct(r.acc),
            pct(r.acc_norm),
            r.chance.map_or("-".into(), |c| format!("{:.2}", 100.0 * c)),
            r.bits_per_byte.mean,
            r.docs_per_sec
        ));
    }
    let accs: Vec<f64> = results
        .iter()
        .filter_map(|r| r.acc_norm.map(|e| e.mean))
        .collect();
    if !accs.is_empty() {
        let mean = 100.0 * accs.iter().sum::<f64>() / accs.len() as f64;
        s.push_str(&format!(
            "\nmean acc_norm over {} tasks: {mean:.2} %",
            accs.len()
        ));
    }
    s
}

/// `mopt-train generate`: the model's family from the recipe, the checkpoint's `config.json` or
/// the GGUF's architecture; the text on stdout, the speed on stderr.
fn generate(
    registry: &Registry,
    (model, prompt): (&std::path::Path, &str),
    settings: &mopt_stages::generate::GenerateSettings,
    ids: bool,
) -> anyhow::Result<()> {
    use mopt_stages::generate::CanGenerate;
    use mopt_stages::StageError;
    let (family, source) = model_source(registry, model)?;
    let Some(g) = family.capability::<dyn CanGenerate>() else {
        return Err(StageError::Unsupported(format!(
            "`{}` models do not generate text (a language-model family does)",
            family.arch()
        ))
        .into());
    };
    let out = g.generate(&source, prompt, settings)?;
    println!("{prompt}{}", out.text);
    if ids {
        eprintln!(
            "prompt ids {:?}\nnew ids {:?}",
            out.prompt_tokens, out.tokens
        );
    }
    eprintln!(
        "prompt: {} tokens in {:.2} s ({:.1} tokens/s); generated: {} tokens, {:.1} tokens/s after the first",
        out.prompt_tokens.len(),
        out.prompt_secs,
        out.prompt_tokens_per_sec(),
        out.tokens.len(),
        out.decode_tokens_per_sec()
    );
    if out.integer_layers > 0 {
        eprintln!(
            "int8: {} linear layers ran in integers (u8 x s8 sums, {})",
            out.integer_layers,
            mopt_kernels::int8::Path::best().name()
        );
    }
    Ok(())
}

/// `mopt-train serve`: this machine's device to remote runs, until SIGTERM.
fn serve(
    host: &str,
    port: u16,
    token_file: Option<&std::path::Path>,
    device: &str,
) -> anyhow::Result<()> {
    let spec = mopt_train::DeviceSpec::parse(device)?;
    if spec.is_remote() {
        return Err(TrainError::Input(format!(
            "serve --device {device}: a server serves a device of this machine (cpu, or a GPU of a build with its feature), not another server's"
        ))
        .into());
    }
    let token = token_file
        .map(mopt_train::backend::Token::read)
        .transpose()?;
    serve_on(host, port, token.as_ref(), &spec)
}

#[cfg(feature = "remote")]
fn serve_on(
    host: &str,
    port: u16,
    token: Option<&mopt_train::backend::Token>,
    spec: &mopt_train::DeviceSpec,
) -> anyhow::Result<()> {
    use std::io::Write;
    let device = spec.open()?;
    let listener = std::net::TcpListener::bind((host, port)).map_err(|e| {
        TrainError::Input(format!(
            "cannot listen on {host}:{port}: {e}; pick another --port (or 0 for a free one)"
        ))
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| TrainError::Failed(format!("listening socket: {e}")))?;
    println!(
        "serving {} on ws://{addr} ({}); stop with SIGTERM or Ctrl+C",
        spec.name(),
        match (token.is_some(), addr.ip().is_loopback()) {
            (true, _) => "clients must present the token",
            (false, true) => "no token: any program of this machine can run tensors here",
            (false, false) => "no token: anyone who reaches the port can run tensors here; give --token-file off a trusted network",
        }
    );
    let _ = std::io::stdout().flush();
    mopt_train::remote::serve(vec![device], listener, token)?;
    println!("server stopped");
    Ok(())
}

#[cfg(not(feature = "remote"))]
fn serve_on(
    _host: &str,
    _port: u16,
    _token: Option<&mopt_train::backend::Token>,
    _spec: &mopt_train::DeviceSpec,
) -> anyhow::Result<()> {
    Err(TrainError::Input(
        "this mopt-train was built without the `remote` feature; rebuild with `cargo build --release --features remote` to serve"
            .into(),
    )
    .into())
}

/// `mopt-train convert` (and `export-hf`): the checkpoint's family writes it as `format`.
fn convert(
    registry: &Registry,
    checkpoint: &std::path::Path,
    format: &str,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    use mopt_stages::convert::CanConvert;
    use mopt_stages::StageError;
    let family = registry.source_family(checkpoint).ok_or_else(|| {
        StageError::Unsupported(format!(
            "{}: not a checkpoint folder of a registered family (its config.json names a model_type)",
            checkpoint.display()
        ))
    })?;
    let Some(c) = family.capability::<dyn CanConvert>() else {
        return Err(StageError::Unsupported(format!(
            "`{}` checkpoints convert to no other format",
            family.arch()
        ))
        .into());
    };
    println!("wrote {}", c.convert(checkpoint, format, out)?);
    Ok(())
}

/// `mopt-train export`.
fn export(
    registry: &Registry,
    recipe: &std::path::Path,
    opts: &mopt_stages::export_recipe::RecipeExport,
) -> anyhow::Result<()> {
    let recipe = mopt_recipe::load(recipe)?;
    let s = mopt_stages::export_recipe::export_recipe(registry, &recipe, opts)?;
    for (name, card) in
        std::iter::once(("student", &s.student)).chain(s.teacher.as_ref().map(|t| ("teacher", t)))
    {
        println!(
            "{name}: parity max |ORT - mopt| {:.2e}, prediction agreement {:.2}% on {} test sentences{}; accuracy {:.4}; {} ops {:?}",
            card.parity.max_abs_err,
            card.parity.agreement * 100.0,
            card.parity.samples,
            if card.quantization.is_some() { " (QDQ)" } else { "" },
            card.accuracy_at_export.unwrap_or(f64::NAN),
            if card.quantization.is_some() { "ONNX Runtime's optimised graph" } else { "fused" },
            card.fused_ops
        );
    }
    for l in &s.latency {
        println!("ONNX Runtime {}: {}", l.model, l.latency);
    }
    println!("export folder: {}", s.out.display());
    Ok(())
}

/// A run: once, or once per seed (`--seeds`, else `--seed`, else `[run] seeds`, else the
/// recipe's one seed) followed by the seeds' summary.
fn run_seeds(registry: &Registry, args: &RunArgs) -> anyhow::Result<()> {
    let path = args.recipe.clone().expect("clap requires RECIPE");
    let loaded = mopt_recipe::load(&path)?;
    let several = match (&args.seeds, args.seed) {
        (Some(list), _) => Some(list.clone()),
        (None, Some(_)) => None,
        (None, None) => (!loaded.run.seeds.is_empty()).then(|| loaded.run.seeds.clone()),
    };
    let seeds: Vec<Option<u64>> = match &several {
        Some(list) => list.iter().map(|&s| Some(s)).collect(),
        None => vec![args.seed],
    };
    let mut reports = Vec::new();
    for seed in seeds {
        let recipe = match seed {
            Some(s) => loaded.clone().with_seed(s),
            None => loaded.clone(),
        };
        let seed = recipe.run.seed;
        match run_recipe(registry, recipe, args)? {
            Some(report) => reports.push((seed, report)),
            None => return Ok(()),
        }
    }
    if several.is_some() {
        let summary = mopt_stages::seeds::summarize(&reports);
        let dir = loaded
            .run
            .output_dir
            .join(format!("{}-seeds", loaded.run.name));
        mopt_stages::seeds::write(&dir, &summary)?;
        print!("{}", mopt_stages::seeds::markdown(&summary));
        println!("summary: {}/summary.md", dir.display());
    }
    Ok(())
}

/// Run (or `--check`) one recipe; the report, unless only checked.
fn run_recipe(
    registry: &Registry,
    recipe: mopt_recipe::Recipe,
    args: &RunArgs,
) -> anyhow::Result<Option<mopt_stages::report::PipelineReport>> {
    let recipe = match &args.devices {
        Some(list) => recipe.with_devices(list)?,
        None => recipe,
    };
    let pipeline = mopt_stages::Pipeline::from_recipe(recipe, registry)?;
    let flags = mopt_stages::DeviceFlags {
        device: args.device.as_deref(),
        token_file: args.token_file.as_deref(),
    };
    let (device, replicas) = mopt_stages::recipe_devices(&pipeline.recipe, flags)?;
    if args.check {
        print!("{}", pipeline.check(&device)?);
        println!("recipe OK");
        return Ok(None);
    }
    let opts = mopt_stages::RunOptions {
        device,
        force: args.force,
        resume: args.resume,
        max_steps: args.max_steps,
        run_dir: None,
        reuse: !args.no_reuse,
        replicas,
    };
    let report = pipeline.run(&opts)?;
    let h = mopt_stages::record::Headline::named(&report.metric);
    let name = h.0.name();
    for st in &report.stages {
        println!(
            "{} {} ({}): {}; validation {name} {}, test {}, {:.2}M params",
            st.index,
            st.name,
            st.kind,
            st.decision.action.label(),
            h.value(h.of(&st.model.valid)),
            h.value(h.of(&st.model.test)),
            st.model.params as f64 / 1e6
        );
    }
    println!(
        "final model: stage {} -> {}/best (test {name} {}); {:.0}s wall",
        report.final_stage,
        report.run_dir,
        h.value(h.of(&report.final_model.test)),
        report.wall_time_s
    );
    println!("report: {}/report.md", report.run_dir);
    Ok(Some(report))
}

/// `mopt-train cache list|clean`.
fn cache(action: CacheAction) -> anyhow::Result<()> {
    use mopt_train::cache::{clean, scan, select, CacheFile, CleanRule};
    let show = |files: &[CacheFile]| {
        let now = std::time::SystemTime::now();
        for f in files {
            let age = now.duration_since(f.modified).unwrap_or_default();
            println!(
                "{:<8} {:>10.2} MiB {:>7.1} days  {}",
                f.kind.label(),
                f.bytes as f64 / 1048576.0,
                age.as_secs_f64() / 86400.0,
                f.path.display()
            );
        }
        let total: u64 = files.iter().map(|f| f.bytes).sum();
        println!("{} files, {:.2} MiB", files.len(), total as f64 / 1048576.0);
    };
    match action {
        CacheAction::List { roots } => show(&scan(&roots)?),
        CacheAction::Clean {
            roots,
            older_than,
            keep_latest,
            dry_run,
        } => {
            let older_than = match older_than {
                Some(d) if !(d.is_finite() && d >= 0.0) => {
                    return Err(TrainError::Input(format!(
                        "--older-than {d}: give a number of days, 0 or more"
                    ))
                    .into())
                }
                d => d.map(|d| std::time::Duration::from_secs_f64(d * 86400.0)),
            };
            let rule = CleanRule {
                older_than,
                keep_latest,
            };
            let picked = select(&scan(&roots)?, &rule, std::time::SystemTime::now());
            show(&picked);
            if dry_run {
                println!("dry run: nothing removed");
            } else {
                let freed = clean(&picked)?;
                println!("removed; {:.2} MiB freed", freed as f64 / 1048576.0);
            }
        }
    }
    Ok(())
}

fn exit_code(err: &anyhow::Error) -> u8 {
    if let Some(e) = err.downcast_ref::<mopt_stages::StageError>() {
        return if e.is_input_error() { 2 } else { 1 };
    }
    if let Some(e) = err.downcast_ref::<mopt_export::ExportError>() {
        return if e.is_input_error() { 2 } else { 1 };
    }
    if let Some(e) = err.downcast_ref::<TrainError>() {
        return if e.is_input_error() { 2 } else { 1 };
    }
    if err.downcast_ref::<mopt_recipe::RecipeError>().is_some() {
        return 2;
    }
    1
}

/// Run the command line of `std::env::args` with the families and stage kinds of `registry`:
/// the allocator and the kernels' thread pool set up first (as [`mopt_kernels::tune_allocator`]
/// and [`mopt_kernels::init_pool`] say), then [`run_from`].
pub fn main(registry: Registry) -> ExitCode {
    mopt_kernels::tune_allocator();
    // This thread as the kernels' worker 0 (rayon's global pool is built nowhere else before).
    if let Err(e) = mopt_kernels::init_pool(None) {
        eprintln!("warning: mopt-train runs on rayon's default pool: {e}");
    }
    ExitCode::from(run_from(registry, std::env::args_os()))
}

/// Run the command line `args` (the program's name first) with the families and stage kinds of
/// `registry`: errors printed and mapped to the exit code (2: bad input, nothing written; 1: a
/// failure while running, or a bug), which is returned. Usage errors exit as clap's (2; 0 for
/// `--help`).
pub fn run_from<I, T>(registry: Registry, args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return e.exit_code().clamp(0, 255) as u8;
        }
    };
    // A panic is a bug: say so (after Rust's own message with its location) and exit with 1,
    // never 101; finished stages stay on disk for `--resume`.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli, &registry))) {
        Ok(Ok(())) => 0,
        Ok(Err(err)) => {
            eprintln!("error: {err:#}");
            exit_code(&err)
        }
        Err(_) => {
            eprintln!(
                "error: mopt-train stopped on an internal error (the panic above): this is a bug in mopt, \
                 not a problem with your input; please report it with the command and the recipe. \
                 Finished stages are kept: `--resume` continues the run."
            );
            1
        }
    }
}
