//! Speed harness: mopt (Burn Flex) against a PyTorch reference, side by side in one run.
//!
//! ```sh
//! python3 -m pip install -r benches/requirements.txt   # PyTorch + transformers, once
//! cargo bench --profile dev --bench speed               # steps + inference, then the PyTorch run
//! cargo bench --profile dev --bench speed -- --ops      # per-op breakdown (forward + backward)
//! ```
//!
//! The harness measures, at batch 32 × max length 64 with dynamic padding on the same training
//! batches (the teacher recipe's data, its seeded epoch order), the teacher fine-tune step, the
//! 3-layer student step on hard labels, the distillation step of `recipes/distill_bert.toml` with
//! the teacher cache and with a live teacher, teacher and student inference at batch 1 and 32, and
//! the machine's SGEMM rate; then the ResNet rows (`resnet/`) and the language-model rows
//! (`lm/`: SmolLM2-135M, a step at 8 × 256 tokens and inference at batch 1 and 8). It then writes the models (HF format) and the batches to a work
//! folder and runs `benches/torch_reference.py` on them with the same thread count, which checks
//! that its logits equal mopt's before it times anything. Medians, ratios, achieved GFLOP/s, the
//! CPU model and its SIMD features go to `benches/results/speed.json` (and `ops.json`).
//!
//! Options: `--steps N` (timed steps, default 20), `--warmup N` (3), `--threads N` (2),
//! `--ops`, `--plain` (also time every row on Burn Flex's own ops), `--no-torch`,
//! `--python PATH` (python3), `--out FILE`, `--device NAME` (where the step rows run: `cpu`,
//! `cuda:0` with `--features cuda`, ...; PyTorch runs on the same device).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use mopt_data::{epoch_order, Batcher, Encoded, TextBatch};
use mopt_distill::matching::MatchPlan;
use mopt_distill::spec::DistillSpec;
use mopt_distill::text::cache::compute;
use mopt_distill::text::task::{DistillTask, TeacherSource};
use mopt_distill::DistillModel;
use mopt_kernels::autocast;
use mopt_models::bert::setup::{build_model, model_config};
use mopt_models::bert::student::from_teacher_layers;
use mopt_models::bert::{weights, BertConfig, BertForSequenceClassification};
use mopt_recipe::Precision;
use mopt_recipe::Recipe;
use mopt_stages::kinds::distill::DistillStage;
use mopt_train::clip::unscale_and_clip;
use mopt_train::trainer::{save_checkpoint_dir, BatchOf, FinetuneTask, Task};
use mopt_train::DeviceSpec;
use serde_json::{json, Value};

mod lm;
mod ops;
mod resnet;

struct Args {
    steps: usize,
    warmup: usize,
    threads: usize,
    ops: bool,
    torch: bool,
    /// Also time every row with mopt's fused kernels off (Burn Flex's own ops).
    plain: bool,
    /// Only the rows whose name contains this (profiling one step).
    only: Option<String>,
    python: String,
    out: Option<PathBuf>,
    /// Where the step rows run (`cpu`, `cuda:0`, ...; mopt-train's device names).
    device: String,
}

fn parse_args() -> Args {
    let mut a = Args {
        steps: 20,
        warmup: 3,
        threads: 2,
        ops: false,
        torch: true,
        plain: false,
        only: None,
        python: "python3".into(),
        out: None,
        device: "cpu".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut num = |name: &str| -> usize {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match arg.as_str() {
            "--steps" => a.steps = num("--steps"),
            "--warmup" => a.warmup = num("--warmup"),
            "--threads" => a.threads = num("--threads"),
            "--ops" => a.ops = true,
            "--no-torch" => a.torch = false,
            "--plain" => a.plain = true,
            "--only" => a.only = Some(it.next().expect("--only needs a row name")),
            "--python" => a.python = it.next().expect("--python needs a path"),
            "--out" => a.out = Some(it.next().expect("--out needs a file").into()),
            "--device" => a.device = it.next().expect("--device needs a name"),
            // `cargo bench` passes `--bench`; ignore it and anything libtest-like.
            _ => {}
        }
    }
    a
}

/// Milliseconds of each run of `f` after `warmup` untimed runs.
pub fn time_ms(warmup: usize, runs: usize, mut f: impl FnMut(usize)) -> Vec<f64> {
    for i in 0..warmup {
        f(i);
    }
    (0..runs)
        .map(|i| {
            let t = Instant::now();
            f(warmup + i);
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect()
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    }
}

/// CPU model and SIMD features from /proc/cpuinfo.
pub fn cpu_info() -> Value {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let flags = field("flags");
    let simd: Vec<&str> = flags
        .split_whitespace()
        .filter(|f| {
            f.starts_with("avx") || f.starts_with("sse") || *f == "fma" || f.starts_with("amx")
        })
        .collect();
    json!({
        "model": field("model name"),
        "simd": simd,
        "gemm_path": mopt_kernels::gemm::path(),
        "bf16_path": mopt_kernels::bf16::path(),
        // `MOPT_SIMD=avx2`: mopt's kernels held to AVX2 on this CPU (a proxy), and PyTorch's
        // too when `ATEN_CPU_CAPABILITY` / `ONEDNN_MAX_CPU_ISA` say so.
        "kernels_simd": if mopt_kernels::cpu::avx2_only() { "avx2 (MOPT_SIMD)" } else { "widest" },
        "torch_isa": std::env::var("ONEDNN_MAX_CPU_ISA").unwrap_or_else(|_| "widest".into()),
        "logical_cpus": text.lines().filter(|l| l.starts_with("processor")).count(),
    })
}

/// Forward matmul FLOPs of a BERT encoder on `batch × seq` tokens.
fn forward_flops(c: &BertConfig, batch: usize, seq: usize) -> f64 {
    let t = (batch * seq) as f64;
    let h = c.hidden_size as f64;
    (0..c.num_hidden_layers)
        .map(|i| {
            let a = (c.heads(i) * c.head_size()) as f64;
            let f = c.ffn(i) as f64;
            2.0 * t * (3.0 * h * a + a * h + 2.0 * h * f) + 4.0 * (batch * seq * seq) as f64 * a
        })
        .sum()
}

fn padded_tokens(batches: &[Vec<&Encoded>]) -> Vec<usize> {
    batches
        .iter()
        .map(|b| b.len() * b.iter().map(|e| e.ids.len()).max().unwrap_or(0))
        .collect()
}

/// One optimizer step of `task` on `model`, as the trainer runs it: loss (forward under
/// autocast for bf16/fp16) → backward (fp16: loss scaled by 2^16) → unscale + global-norm clip
/// in one pass → AdamW.
#[allow(clippy::too_many_arguments)]
fn train_step<T: Task>(
    precision: Precision,
    task: &mut T,
    model: T::Model,
    optim: &mut ModuleOptimizer,
    b: &BatchOf<T>,
    indices: &[usize],
    clip: f32,
    lr: f64,
) -> T::Model {
    let compute = mopt_train::amp::compute_dtype(precision);
    let (loss, _) = autocast::scope(compute, || task.loss(&model, b, indices, 0.5));
    let _: f32 = loss.clone().into_scalar();
    let scale = if precision == Precision::Fp16 {
        65536.0
    } else {
        1.0
    };
    let loss = if scale == 1.0 {
        loss
    } else {
        loss.mul_scalar(scale)
    };
    let mut grads = GradientsParams::from_grads(loss.backward(), &model);
    unscale_and_clip(&model, &mut grads, 1.0 / scale, Some(clip));
    optim.step(lr, model, grads)
}

/// Milliseconds of each timed optimizer step of `task` on `model`, batch `i` at step `i`.
#[allow(clippy::too_many_arguments)]
fn time_training<T: Task>(
    (warmup, steps): (usize, usize),
    precision: Precision,
    task: &mut T,
    model: T::Model,
    mut optim: ModuleOptimizer,
    batches: &[BatchOf<T>],
    indices: &[Vec<usize>],
    clip: f32,
    lr: f64,
) -> Vec<f64> {
    let mut slot = Some(model);
    time_ms(warmup, steps, |i| {
        let m = slot.take().expect("model");
        slot = Some(train_step(
            precision,
            task,
            m,
            &mut optim,
            &batches[i],
            &indices[i],
            clip,
            lr,
        ));
    })
}

struct Bench {
    args: Args,
    root: PathBuf,
    results: BTreeMap<String, Value>,
    /// Rows timed with the fused kernels off (`--plain`).
    plain: BTreeMap<String, Value>,
    recording_plain: bool,
}

impl Bench {
    /// The `--device` (inference) and its autodiff twin, seeded.
    fn devices(&self) -> (Device, Device) {
        let device = DeviceSpec::parse(&self.args.device)
            .and_then(|d| d.open())
            .unwrap_or_else(|e| panic!("--device: {e}"));
        let ad = device.clone().autodiff();
        ad.seed(42);
        (device, ad)
    }

    /// PyTorch's name for the `--device` (`cpu`, `cuda:N`).
    fn torch_device(&self) -> String {
        match DeviceSpec::parse(&self.args.device) {
            Ok(DeviceSpec::Cuda(i) | DeviceSpec::TchCuda(i)) => format!("cuda:{i}"),
            _ => "cpu".to_string(),
        }
    }

    fn wants(&self, name: &str) -> bool {
        self.args
            .only
            .as_ref()
            .is_none_or(|o| name.contains(o.as_str()))
    }

    fn record(&mut self, name: &str, ms: &[f64], samples: usize, flops: Option<f64>) {
        let m = median(ms);
        let mut v = json!({
            "median_ms": m,
            "runs": ms.len(),
            "min_ms": ms.iter().cloned().fold(f64::INFINITY, f64::min),
        });
        if samples > 0 {
            v["samples_per_s"] = json!(samples as f64 / (m / 1e3));
        }
        if let Some(f) = flops {
            v["gflops"] = json!(f / (m / 1e3) / 1e9);
        }
        eprintln!("  {name:<28} {m:>9.1} ms");
        if self.recording_plain {
            self.plain.insert(name.to_string(), v);
        } else {
            self.results.insert(name.to_string(), v);
        }
    }
}

fn recipe(root: &Path, name: &str) -> Recipe {
    mopt_recipe::load(root.join("recipes").join(name)).unwrap_or_else(|e| panic!("{e}"))
}

fn sgemm_gflops(device: &Device, n: usize) -> f64 {
    let a: Tensor<2> = Tensor::random([n, n], burn::tensor::Distribution::Default, device);
    let b: Tensor<2> = Tensor::random([n, n], burn::tensor::Distribution::Default, device);
    let ms = time_ms(2, 7, |_| {
        let _ = a.clone().matmul(b.clone()).into_data();
    });
    2.0 * (n as f64).powi(3) / (median(&ms) / 1e3) / 1e9
}

/// GFLOP/s of mopt's own GEMM (`mopt_kernels::gemm`, which the linear layers run on).
fn mopt_sgemm_gflops(n: usize) -> f64 {
    use mopt_kernels::gemm::{sgemm, View};
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.1).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 * 0.1).collect();
    let mut c = vec![0.0f32; n * n];
    let ms = time_ms(2, 7, |_| {
        sgemm(
            View::row_major(&a, n, n),
            View::row_major(&b, n, n),
            &mut c,
            1.0,
            false,
        );
    });
    2.0 * (n as f64).powi(3) / (median(&ms) / 1e3) / 1e9
}

fn main() {
    // As mopt-train does (the PyTorch side runs in its own process, with its defaults).
    mopt_kernels::tune_allocator();
    if !std::env::args().any(|a| a == "--bench") {
        // Built and started by `cargo test`: nothing to time here.
        println!("speed harness: run it with `cargo bench --profile dev --bench speed` (see benches/README.md)");
        return;
    }
    let args = parse_args();
    // `main` as worker 0 beside `threads - 1` workers, as mopt-train runs (and as PyTorch's
    // OpenMP runs its main thread).
    mopt_kernels::init_pool(Some(args.threads)).expect("rayon pool");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut bench = Bench {
        args,
        root: root.clone(),
        results: BTreeMap::new(),
        plain: BTreeMap::new(),
        recording_plain: false,
    };
    let work = root.join("target").join("mopt-bench");
    std::fs::create_dir_all(&work).expect("work folder");
    let out_dir = root.join("benches").join("results");
    std::fs::create_dir_all(&out_dir).expect("results folder");
    if bench.args.ops {
        let out = bench.args.out.clone().unwrap_or(out_dir.join("ops.json"));
        ops::run(&bench.args, &work, &out);
        return;
    }
    if bench.args.plain {
        eprintln!("Burn Flex's own ops (mopt's fused kernels off):");
        mopt_kernels::set_enabled(false);
        bench.recording_plain = true;
        run_steps(&mut bench, &work);
        mopt_kernels::set_enabled(true);
        bench.recording_plain = false;
        eprintln!("mopt's fused kernels:");
    }
    let _ = std::fs::remove_file(work.join("resnet.json"));
    let _ = std::fs::remove_file(work.join("lm.json"));
    run_steps(&mut bench, &work);
    if bench.wants("resnet") {
        resnet::run(&mut bench, &work);
    }
    if lm::ROWS.iter().any(|r| bench.wants(r)) {
        lm::run(&mut bench, &work);
    }
    let out = bench.args.out.clone().unwrap_or(out_dir.join("speed.json"));
    finish(&bench, &work, &out);
}

/// Everything the PyTorch side needs, written once.
struct Prepared {
    teacher_recipe: Recipe,
    layers: Vec<usize>,
    teacher: BertForSequenceClassification,
    teacher_config: BertConfig,
    student: BertForSequenceClassification,
    student_config: BertConfig,
    distill_train: mopt_recipe::TrainSpec,
    distill_spec: DistillSpec,
    plan: MatchPlan,
    subset: Vec<Encoded>,
    pad_id: u32,
}

fn prepare(bench: &Bench, work: &Path) -> Prepared {
    let teacher_recipe = recipe(&bench.root, "finetune_teacher.toml");
    let registry = mopt_families::builtin();
    let format = registry
        .data_format(&teacher_recipe)
        .expect("a shipped format");
    let prepared = mopt_stages::data::text::prepare(format, &teacher_recipe, None)
        .expect("data (run datasets/fetch.sh --text)");
    let tokenizer = mopt_stages::data::text::tokenizer(&teacher_recipe).expect("a text recipe");
    let data = &prepared.data;
    let model_spec = teacher_recipe.model.as_ref().expect("[model]");
    let config = model_config(
        model_spec,
        &tokenizer,
        &teacher_recipe.scope.nested("model"),
        &data.labels.labels,
        prepared.tokenizer.vocab_size(),
    )
    .expect("config");
    let device = Device::flex();
    let (teacher, _) = build_model(model_spec, teacher_recipe.run.seed, &config, &device)
        .expect("teacher weights");
    // The teacher as a mopt checkpoint (for the distillation setup) and in HF form (for PyTorch).
    let ckpt = work.join("teacher");
    save_checkpoint_dir(&teacher, &config, &prepared.extras(), &ckpt).expect("teacher checkpoint");
    weights::save_hf(&teacher, &config, &work.join("teacher-hf")).expect("teacher hf");
    let b = teacher_recipe.train.batch_size;
    let n = (bench.args.warmup + bench.args.steps) * b;
    let order = epoch_order(data.train.len(), teacher_recipe.run.seed, 0);
    let subset: Vec<Encoded> = order
        .iter()
        .cycle()
        .take(n)
        .map(|&i| data.train[i].clone())
        .collect();
    let distill_recipe = recipe(&bench.root, "distill_bert.toml");
    let stage = DistillStage::from_entry(&distill_recipe.stages[0]).expect("distill stage");
    let (_, plan) = mopt_families::bert::distill::student_config(
        &stage,
        &config,
        &data.labels,
        &mopt_stages::data::text::tokenizer(&distill_recipe).expect("a text recipe"),
        prepared.tokenizer.vocab_size(),
    )
    .expect("distill_bert.toml's student fits the teacher");
    let _ = ckpt;
    // The student's shape and objective are the recipe's; its initial values do not change a
    // step's time, so it starts from the teacher's layers at the recipe's indices.
    let keys = mopt_models::bert::BertModel::from_spec(&stage.student).expect("BERT's keys");
    let layers = (keys.init_from_teacher_layers.clone())
        .or_else(|| keys.weights_layers.clone())
        .expect("distill_bert.toml's student takes layers of the teacher or of its weights");
    let mut student_config = config.clone();
    student_config.num_hidden_layers = layers.len();
    let student = from_teacher_layers(&teacher, &layers, &student_config);
    weights::save_hf(&student, &student_config, &work.join("student-hf")).expect("student hf");
    Prepared {
        teacher_recipe,
        layers,
        teacher,
        teacher_config: config,
        student,
        student_config,
        distill_train: distill_recipe.stages[0].train.clone(),
        distill_spec: stage.spec.clone(),
        plan,
        subset,
        pad_id: prepared.tokenizer.pad_id,
    }
}

fn run_steps(bench: &mut Bench, work: &Path) {
    eprintln!("preparing models and batches");
    let p = prepare(bench, work);
    let (warmup, steps) = (bench.args.warmup, bench.args.steps);
    let (device, ad) = bench.devices();
    let batcher = Batcher::new(p.pad_id);
    let bsz = 32;
    let chunks: Vec<Vec<&Encoded>> = p.subset.chunks(bsz).map(|c| c.iter().collect()).collect();
    let index_chunks: Vec<Vec<usize>> = (0..p.subset.len())
        .collect::<Vec<_>>()
        .chunks(bsz)
        .map(|c| c.to_vec())
        .collect();
    let tokens = padded_tokens(&chunks);
    let mean_seq = tokens[warmup..].iter().sum::<usize>() as f64 / (steps * bsz) as f64;
    let batches: Vec<TextBatch> = chunks.iter().map(|c| batcher.batch(c, &ad)).collect();
    let t = &p.distill_train;
    let clip = t.grad_clip_norm.unwrap_or(1.0);
    let lr = 5e-5;
    let adamw = || mopt_train::trainer::adamw(t);
    let step_flops = |c: &BertConfig, extra_fwd: Option<&BertConfig>| -> f64 {
        // forward + backward ≈ 3 forward; a live teacher adds one forward.
        let per_step: f64 = tokens[warmup..]
            .iter()
            .map(|&tk| {
                let seq = tk / bsz;
                3.0 * forward_flops(c, bsz, seq)
                    + extra_fwd.map_or(0.0, |tc| forward_flops(tc, bsz, seq))
            })
            .sum();
        per_step / steps as f64
    };
    eprintln!(
        "steps: {warmup} warm-up + {steps} timed, batch {bsz}, mean padded length {mean_seq:.1}, {} threads",
        bench.args.threads
    );

    // The teacher on the training device (the students start from its layers).
    let teacher_ad = || {
        build_model(
            p.teacher_recipe.model.as_ref().expect("[model]"),
            p.teacher_recipe.run.seed,
            &p.teacher_config,
            &ad,
        )
        .expect("teacher")
        .0
    };
    // Teacher fine-tune step, without and with gradient checkpointing (time and peak memory).
    let ck = device.clone().autodiff().gradient_checkpointing();
    for (name, dev) in [("teacher_step", &ad), ("teacher_step_checkpointed", &ck)] {
        if !bench.wants(name) {
            continue;
        }
        let model = build_model(
            p.teacher_recipe.model.as_ref().expect("[model]"),
            p.teacher_recipe.run.seed,
            &p.teacher_config,
            dev,
        )
        .expect("teacher")
        .0;
        let dev_batches: Vec<TextBatch> = chunks.iter().map(|c| batcher.batch(c, dev)).collect();
        let mut task = FinetuneTask::new(dev);
        reset_peak_rss();
        let ms = time_training(
            (warmup, steps),
            Precision::Fp32,
            &mut task,
            model,
            adamw(),
            &dev_batches,
            &index_chunks,
            clip,
            lr,
        );
        let f = step_flops(&p.teacher_config, None);
        bench.record(name, &ms, bsz, Some(f));
        if let Some(peak) = mopt_train::memory::peak_rss_bytes() {
            let table = if bench.recording_plain {
                &mut bench.plain
            } else {
                &mut bench.results
            };
            table.get_mut(name).expect("recorded")["peak_rss_mb"] = json!(peak as f64 / 1048576.0);
        }
    }
    // Student, hard labels.
    if bench.wants("student_step") {
        let mut task = FinetuneTask::new(&ad);
        let ms = time_training(
            (warmup, steps),
            Precision::Fp32,
            &mut task,
            from_teacher_layers(&teacher_ad(), &p.layers, &p.student_config),
            adamw(),
            &batches,
            &index_chunks,
            clip,
            lr,
        );
        let f = step_flops(&p.student_config, None);
        bench.record("student_step", &ms, bsz, Some(f));
    }
    // Student, hard labels, with the products in bf16 and fp16 (Flex runs bf16 GEMMs through
    // f32 and f16 GEMMs on the `gemm` crate: this is about correctness on the CPU, speed on GPUs).
    for (name, precision) in [
        ("student_step_bf16", Precision::Bf16),
        ("student_step_fp16", Precision::Fp16),
    ] {
        if !bench.wants(name) {
            continue;
        }
        let mut task = FinetuneTask::new(&ad);
        let ms = time_training(
            (warmup, steps),
            precision,
            &mut task,
            from_teacher_layers(&teacher_ad(), &p.layers, &p.student_config),
            adamw(),
            &batches,
            &index_chunks,
            clip,
            lr,
        );
        let f = step_flops(&p.student_config, None);
        bench.record(name, &ms, bsz, Some(f));
    }
    // Distillation (distill_bert.toml's objective), cached and live teacher.
    for cached in [true, false] {
        let name = if cached {
            "distill_step_cached"
        } else {
            "distill_step_live"
        };
        if !bench.wants(name) {
            continue;
        }
        let source = if cached {
            TeacherSource::Cache(compute(
                &p.teacher,
                &p.subset,
                &p.plan.needs,
                &batcher,
                bsz,
                &device,
            ))
        } else {
            TeacherSource::Live {
                teacher: Box::new(p.teacher.clone()),
                examples: p.subset.clone(),
                batcher: batcher.clone(),
                device: device.clone(),
            }
        };
        let mut task = DistillTask::new(p.distill_spec.clone(), p.plan.clone(), source, &ad);
        let student = from_teacher_layers(&teacher_ad(), &p.layers, &p.student_config);
        let model = DistillModel::new(student, &p.plan.projections, &ad);
        let ms = time_training(
            (warmup, steps),
            Precision::Fp32,
            &mut task,
            model,
            adamw(),
            &batches,
            &index_chunks,
            clip,
            lr,
        );
        let f = step_flops(&p.student_config, (!cached).then_some(&p.teacher_config));
        bench.record(name, &ms, bsz, Some(f));
    }
    // Inference at a fixed length of 64 (as the distillation report measures latency).
    for (name, model, config) in [
        ("teacher", &p.teacher, &p.teacher_config),
        ("student", &p.student, &p.student_config),
    ] {
        for b in [1usize, 32] {
            if !bench.wants(&format!("{name}_forward_b{b}")) {
                continue;
            }
            let ids: Vec<&Encoded> = p
                .subset
                .iter()
                .filter(|e| e.ids.len() >= 8)
                .take(b)
                .collect();
            let batch = fixed_len_batch(&ids, 64, p.pad_id, &device);
            let runs = if b == 1 { 60 } else { 15 };
            let ms = time_ms(5, runs, |_| {
                let out = model.forward(
                    batch.input_ids.clone(),
                    batch.attention_mask.clone(),
                    batch.token_type_ids.clone(),
                );
                let _ = out.into_data();
            });
            let f = forward_flops(config, b, 64);
            bench.record(&format!("{name}_forward_b{b}"), &ms, b, Some(f));
        }
    }
    let peak = sgemm_gflops(&device, 2048);
    let ours = mopt_sgemm_gflops(2048);
    eprintln!("  sgemm 2048^3: Burn matmul {peak:.1} GFLOP/s, mopt GEMM {ours:.1} GFLOP/s");
    if !bench.recording_plain {
        bench
            .results
            .insert("sgemm_2048_gflops".into(), json!(peak));
        bench
            .results
            .insert("mopt_sgemm_2048_gflops".into(), json!(ours));
    }

    // Reference logits for the PyTorch side's identity check (eval mode, first batch).
    let b0 = batcher.batch(&chunks[0], &device);
    let reference = |m: &BertForSequenceClassification| -> Vec<f32> {
        m.forward(
            b0.input_ids.clone(),
            b0.attention_mask.clone(),
            b0.token_type_ids.clone(),
        )
        .into_data()
        .try_to_vec()
        .expect("f32")
    };
    let to_rows = |c: &[&Encoded], f: &dyn Fn(&Encoded) -> Vec<u32>| -> Vec<Vec<u32>> {
        c.iter().map(|e| f(e)).collect()
    };
    let spec = json!({
        "threads": bench.args.threads,
        // PyTorch's name for the same device.
        "device": bench.torch_device(),
        "warmup": warmup,
        "steps": steps,
        "lr": lr,
        "weight_decay": t.weight_decay,
        "clip": clip,
        "pad_id": p.pad_id,
        "teacher_dir": work.join("teacher-hf"),
        "student_dir": work.join("student-hf"),
        "distill": {
            "alpha": 0.5,
            "temperature": 4.0,
            "hidden_pairs": p.plan.matches.iter().flat_map(|m| m.pairs.iter().map(|p| (p.student, p.teacher))).collect::<Vec<_>>(),
        },
        "batches": chunks.iter().map(|c| json!({
            "ids": to_rows(c, &|e| e.ids.clone()),
            "labels": c.iter().map(|e| e.label).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "reference_logits": {
            "teacher": reference(&p.teacher),
            "student": reference(&p.student),
        },
        "sgemm_n": 2048,
        // `--only`: the PyTorch side skips the rows it does not name too.
        "only": bench.args.only,
    });
    std::fs::write(work.join("spec.json"), spec.to_string()).expect("spec.json");
}

/// Reset the process's peak RSS (`VmHWM`) so the next measurement reports its own peak
/// (Linux: write 5 to `/proc/self/clear_refs`).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn fixed_len_batch(items: &[&Encoded], len: usize, pad: u32, device: &Device) -> TextBatch {
    // Repeat each example's tokens up to `len` so every position is a real token.
    let stretched: Vec<Encoded> = items
        .iter()
        .map(|e| {
            let mut e = (*e).clone();
            let ids = e.ids.clone();
            e.ids = ids.iter().cycle().take(len).cloned().collect();
            e
        })
        .collect();
    let refs: Vec<&Encoded> = stretched.iter().collect();
    Batcher::new(pad).batch(&refs, device)
}

fn finish(bench: &Bench, work: &Path, out: &Path) {
    let torch = if bench.args.torch {
        let script = bench.root.join("benches").join("torch_reference.py");
        let torch_out = work.join("torch.json");
        let _ = std::fs::remove_file(&torch_out);
        eprintln!("running the PyTorch reference ({})", script.display());
        let status = Command::new(&bench.args.python)
            .arg(&script)
            .arg("--spec")
            .arg(work.join("spec.json"))
            .arg("--out")
            .arg(&torch_out)
            .status();
        match status {
            Ok(s) if s.success() => std::fs::read_to_string(&torch_out)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok()),
            Ok(s) => {
                eprintln!("the PyTorch reference failed ({s}); install it with `python3 -m pip install -r benches/requirements.txt`");
                None
            }
            Err(e) => {
                eprintln!("could not start {}: {e}", bench.args.python);
                None
            }
        }
    } else {
        None
    };
    let mut rows = Vec::new();
    println!();
    let with_plain = !bench.plain.is_empty();
    println!(
        "| step ({} threads) | mopt ms | PyTorch ms | mopt / PyTorch | mopt GFLOP/s | PyTorch GFLOP/s |{}",
        bench.args.threads,
        if with_plain { " Burn Flex ops ms | Burn ops / PyTorch |" } else { "" }
    );
    println!(
        "|---|---|---|---|---|---|{}",
        if with_plain { "---|---|" } else { "" }
    );
    for (name, v) in &bench.results {
        let Some(ms) = v.get("median_ms").and_then(Value::as_f64) else {
            continue;
        };
        let t = torch
            .as_ref()
            .and_then(|t| t["results"].get(name))
            .and_then(|r| r["median_ms"].as_f64());
        let tg = torch
            .as_ref()
            .and_then(|t| t["results"].get(name))
            .and_then(|r| r["gflops"].as_f64());
        let ratio = t.map(|t| ms / t);
        let fmt = |x: Option<f64>, p: usize| x.map_or("-".into(), |x| format!("{x:.p$}"));
        let plain = bench.plain.get(name).and_then(|p| p["median_ms"].as_f64());
        let extra = if with_plain {
            format!(
                " {} | {} |",
                fmt(plain, 1),
                plain
                    .zip(t)
                    .map_or("-".into(), |(p, t)| format!("{:.2}x", p / t))
            )
        } else {
            String::new()
        };
        println!(
            "| {name} | {ms:.1} | {} | {} | {} | {} |{extra}",
            fmt(t, 1),
            ratio.map_or("-".into(), |r| format!("{r:.2}x")),
            fmt(v["gflops"].as_f64(), 1),
            fmt(tg, 1)
        );
        rows.push(json!({"name": name, "mopt_ms": ms, "torch_ms": t, "ratio": ratio, "burn_plain_ms": plain}));
    }
    let flex_peak = bench.results["sgemm_2048_gflops"].as_f64();
    let mopt_peak = bench.results["mopt_sgemm_2048_gflops"].as_f64();
    let torch_peak = torch.as_ref().and_then(|t| t["sgemm_2048_gflops"].as_f64());
    println!(
        "\nSGEMM 2048^3: mopt GEMM {:.1} GFLOP/s, Burn Flex matmul {:.1} GFLOP/s, PyTorch {} GFLOP/s",
        mopt_peak.unwrap_or(f64::NAN),
        flex_peak.unwrap_or(f64::NAN),
        torch_peak.map_or("-".into(), |x| format!("{x:.1}"))
    );
    let report = json!({
        "cpu": cpu_info(),
        "threads": bench.args.threads,
        "mopt": { "backend": "burn-flex 0.22.1 + mopt-kernels", "results": bench.results },
        "burn_plain": { "backend": "burn-flex 0.22.1 (MOPT_KERNELS=plain)", "results": bench.plain },
        "torch": torch,
        "rows": rows,
    });
    std::fs::write(out, serde_json::to_string_pretty(&report).expect("json"))
        .expect("write results");
    println!("results: {}", out.display());
}
