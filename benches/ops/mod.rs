//! Per-op breakdown: forward, and forward + backward, of each op at the teacher's shapes
//! (batch 32 × 64 tokens, hidden 384, 12 heads of 32, FFN 1536, vocabulary 30,522), in mopt and
//! in PyTorch (`torch_reference.py --ops`), side by side.

use std::path::Path;
use std::process::Command;

use burn::nn::LayerNormConfig;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;
use burn::tensor::activation::{gelu, softmax};
use burn::tensor::Distribution;
use mopt_models::bert::{BertConfig, BertForSequenceClassification};
use mopt_train::clip::clip_global_norm;
use serde_json::{json, Value};

use crate::{cpu_info, median, time_ms, Args};

const B: usize = 32;
const S: usize = 64;
const H: usize = 384;
const HEADS: usize = 12;
const D: usize = 32;
const F: usize = 1536;
const V: usize = 30522;

struct Ops {
    runs: usize,
    plain: Device,
    ad: Device,
    rows: Vec<Value>,
}

impl Ops {
    fn rand<const N: usize>(&self, shape: [usize; N]) -> Tensor<N> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), &self.plain)
    }

    fn leaf<const N: usize>(&self, t: &Tensor<N>) -> Tensor<N> {
        Tensor::from_data(t.to_data(), &self.ad).require_grad()
    }

    fn push(&mut self, name: &str, fwd: &[f64], fwd_bwd: &[f64]) {
        let (f, fb) = (median(fwd), median(fwd_bwd));
        eprintln!("  {name:<34} fwd {f:>8.2} ms   fwd+bwd {fb:>8.2} ms");
        self.rows
            .push(json!({"name": name, "fwd_ms": f, "fwd_bwd_ms": fb}));
    }

    /// An op of one float input, reduced by `sum` so that backward starts from ones.
    fn unary<const N: usize, const E: usize>(
        &mut self,
        name: &str,
        shape: [usize; N],
        f: impl Fn(Tensor<N>) -> Tensor<E>,
    ) {
        let x = self.rand(shape);
        let fwd = time_ms(3, self.runs, |_| {
            let _: f32 = f(x.clone()).sum().into_scalar();
        });
        let xa = self.leaf(&x);
        let fb = time_ms(3, self.runs, |_| {
            let g = f(xa.clone()).sum().backward();
            let _ = xa.grad(&g).expect("grad");
        });
        self.push(name, &fwd, &fb);
    }

    /// An op of two float inputs (both get gradients).
    fn binary<const N: usize, const M: usize, const E: usize>(
        &mut self,
        name: &str,
        a: [usize; N],
        b: [usize; M],
        f: impl Fn(Tensor<N>, Tensor<M>) -> Tensor<E>,
    ) {
        let (x, y) = (self.rand(a), self.rand(b));
        let fwd = time_ms(3, self.runs, |_| {
            let _: f32 = f(x.clone(), y.clone()).sum().into_scalar();
        });
        let (xa, ya) = (self.leaf(&x), self.leaf(&y));
        let fb = time_ms(3, self.runs, |_| {
            let g = f(xa.clone(), ya.clone()).sum().backward();
            let _ = (xa.grad(&g).expect("grad"), ya.grad(&g).expect("grad"));
        });
        self.push(name, &fwd, &fb);
    }
}

/// Self-attention core from Q, K, V projections: head split, QKᵀ/√d + mask, softmax, ·V, merge.
fn attention_core(q: Tensor<3>, k: Tensor<3>, v: Tensor<3>) -> Tensor<3> {
    attention_core_with(q, k, v, |s| softmax(s, 3))
}

fn attention_core_with(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    softmax: impl Fn(Tensor<4>) -> Tensor<4>,
) -> Tensor<3> {
    let split = |t: Tensor<3>| t.reshape([B, S, HEADS, D]).swap_dims(1, 2);
    let scores = split(q)
        .matmul(split(k).swap_dims(2, 3))
        .div_scalar((D as f32).sqrt());
    let probs = softmax(scores);
    probs
        .matmul(split(v))
        .swap_dims(1, 2)
        .reshape([B, S, HEADS * D])
}

const FUSED: &str = " [mopt fused]";

fn fused(name: &str) -> String {
    format!("{name}{FUSED}")
}

pub fn run(args: &Args, work: &Path, out: &Path) {
    let plain = Device::flex();
    let ad = plain.clone().autodiff();
    let mut o = Ops {
        runs: 15,
        plain,
        ad,
        rows: Vec::new(),
    };
    let t = B * S;
    eprintln!(
        "per-op breakdown, {} threads (medians of {} runs)",
        args.threads, o.runs
    );
    for (name, k, n) in [
        ("matmul 2048x384 @ 384x384", H, H),
        ("matmul 2048x384 @ 384x1536", H, F),
        ("matmul 2048x1536 @ 1536x384", F, H),
    ] {
        o.binary(name, [t, k], [k, n], |x, w| x.matmul(w));
    }
    for (name, k, n) in [
        ("matmul 2048x384 @ 384x384", H, H),
        ("matmul 2048x384 @ 384x1536", H, F),
        ("matmul 2048x1536 @ 1536x384", F, H),
    ] {
        let bias = Tensor::<1>::zeros([n], &o.plain);
        let bias_a = o.leaf(&bias);
        o.binary(&fused(name), [t, k], [k, n], |x, w| {
            let b = if x.device().is_autodiff() {
                bias_a.clone()
            } else {
                bias.clone()
            };
            mopt_kernels::linear(x, w, b)
        });
    }
    o.binary(
        "linear as batched matmul [32,64,384] @ 384x1536",
        [B, S, H],
        [H, F],
        |x, w| x.matmul(w.unsqueeze()),
    );
    {
        let drop = burn::nn::DropoutConfig::new(0.1).init();
        o.unary("dropout 0.1 [32,64,384]", [B, S, H], |x| drop.forward(x));
        o.unary("dropout 0.1 [32,12,64,64]", [B, HEADS, S, S], |x| {
            drop.forward(x)
        });
        o.unary(&fused("dropout 0.1 [32,64,384]"), [B, S, H], |x| {
            mopt_kernels::dropout(x, 0.1)
        });
        o.unary(&fused("dropout 0.1 [32,12,64,64]"), [B, HEADS, S, S], |x| {
            mopt_kernels::dropout(x, 0.1)
        });
    }
    o.unary("gelu [32,64,1536]", [B, S, F], gelu);
    o.unary(&fused("gelu [32,64,1536]"), [B, S, F], mopt_kernels::gelu);
    o.unary("softmax [32,12,64,64]", [B, HEADS, S, S], |x| softmax(x, 3));
    o.unary(&fused("softmax [32,12,64,64]"), [B, HEADS, S, S], |x| {
        mopt_kernels::softmax(x, 3)
    });
    {
        let ln = LayerNormConfig::new(H).with_epsilon(1e-12).init(&o.ad);
        let ln_plain = LayerNormConfig::new(H).with_epsilon(1e-12).init(&o.plain);
        let x = o.rand([B, S, H]);
        let fwd = time_ms(3, o.runs, |_| {
            let _: f32 = ln_plain.forward(x.clone()).sum().into_scalar();
        });
        let xa = o.leaf(&x);
        let fb = time_ms(3, o.runs, |_| {
            let g = ln.forward(xa.clone()).sum().backward();
            let _ = xa.grad(&g).expect("grad");
            let _ = ln.gamma.val().grad(&g).expect("gamma grad");
        });
        o.push("layer_norm [32,64,384] (+gamma,beta)", &fwd, &fb);
        let (g, b) = (ln.gamma.val(), ln.beta.clone().expect("beta").val());
        let (gp, bp) = (
            ln_plain.gamma.val(),
            ln_plain.beta.clone().expect("beta").val(),
        );
        let fwd = time_ms(3, o.runs, |_| {
            let y = mopt_kernels::layer_norm(x.clone(), gp.clone(), bp.clone(), 1e-12);
            let _: f32 = y.sum().into_scalar();
        });
        let fb = time_ms(3, o.runs, |_| {
            let y = mopt_kernels::layer_norm(xa.clone(), g.clone(), b.clone(), 1e-12);
            let grads = y.sum().backward();
            let _ = xa.grad(&grads).expect("grad");
            let _ = g.grad(&grads).expect("gamma grad");
        });
        o.push(&fused("layer_norm [32,64,384] (+gamma,beta)"), &fwd, &fb);
    }
    {
        let ids: Tensor<2, Int> =
            Tensor::random([B, S], Distribution::Uniform(0.0, V as f64), &o.plain);
        let table = o.rand([V, H]).mul_scalar(0.02);
        let fwd = time_ms(3, o.runs, |_| {
            let _: f32 = burn::tensor::module::embedding(table.clone(), ids.clone())
                .sum()
                .into_scalar();
        });
        let ta = o.leaf(&table);
        let ids_a: Tensor<2, Int> = Tensor::from_data(ids.to_data(), &o.ad);
        let fb = time_ms(3, o.runs, |_| {
            let g = burn::tensor::module::embedding(ta.clone(), ids_a.clone())
                .sum()
                .backward();
            let _ = ta.grad(&g).expect("grad");
        });
        o.push("embedding 30522x384, ids [32,64]", &fwd, &fb);
        let fwd = time_ms(3, o.runs, |_| {
            let _: f32 = mopt_kernels::embedding(table.clone(), ids.clone())
                .sum()
                .into_scalar();
        });
        let fb = time_ms(3, o.runs, |_| {
            let g = mopt_kernels::embedding(ta.clone(), ids_a.clone())
                .sum()
                .backward();
            let _ = ta.grad(&g).expect("grad");
        });
        o.push(&fused("embedding 30522x384, ids [32,64]"), &fwd, &fb);
    }
    o.binary(
        "batched QK^T [32,12,64,32]x[32,12,32,64]",
        [B, HEADS, S, D],
        [B, HEADS, D, S],
        |q, k| q.matmul(k),
    );
    {
        let (q, k, v) = (o.rand([B, S, H]), o.rand([B, S, H]), o.rand([B, S, H]));
        let fwd = time_ms(3, o.runs, |_| {
            let _: f32 = attention_core(q.clone(), k.clone(), v.clone())
                .sum()
                .into_scalar();
        });
        let (qa, ka, va) = (o.leaf(&q), o.leaf(&k), o.leaf(&v));
        let fb = time_ms(3, o.runs, |_| {
            let g = attention_core(qa.clone(), ka.clone(), va.clone())
                .sum()
                .backward();
            let _ = (qa.grad(&g), ka.grad(&g), va.grad(&g));
        });
        o.push("attention core (split, QK, softmax, PV, merge)", &fwd, &fb);
        let fb = time_ms(3, o.runs, |_| {
            let g = attention_core_with(qa.clone(), ka.clone(), va.clone(), |s| {
                mopt_kernels::softmax(s, 3)
            })
            .sum()
            .backward();
            let _ = (qa.grad(&g), ka.grad(&g), va.grad(&g));
        });
        let fwd = time_ms(3, o.runs, |_| {
            let _: f32 = attention_core_with(q.clone(), k.clone(), v.clone(), |s| {
                mopt_kernels::softmax(s, 3)
            })
            .sum()
            .into_scalar();
        });
        o.push(
            &fused("attention core (split, QK, softmax, PV, merge)"),
            &fwd,
            &fb,
        );
        // The fused attention kernel on the unsplit projections (mask of zeros, no dropout).
        let mask = Tensor::<2>::zeros([B, S], &o.plain);
        let mask_a = Tensor::<2>::zeros([B, S], &o.ad);
        let fwd = time_ms(3, o.runs, |_| {
            let y =
                mopt_kernels::attention(q.clone(), k.clone(), v.clone(), mask.clone(), HEADS, 0.0);
            let _: f32 = y.sum().into_scalar();
        });
        let fb = time_ms(3, o.runs, |_| {
            let y = mopt_kernels::attention(
                qa.clone(),
                ka.clone(),
                va.clone(),
                mask_a.clone(),
                HEADS,
                0.0,
            );
            let g = y.sum().backward();
            let _ = (qa.grad(&g), ka.grad(&g), va.grad(&g));
        });
        o.push(
            "attention core (split, QK, softmax, PV, merge) [mopt fused kernel]",
            &fwd,
            &fb,
        );
    }
    optimizer_rows(&mut o);

    let torch = if args.torch {
        let torch_out = work.join("torch-ops.json");
        let _ = std::fs::remove_file(&torch_out);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/torch_reference.py");
        let ok = Command::new(&args.python)
            .arg(&script)
            .args(["--ops", "--threads", &args.threads.to_string(), "--out"])
            .arg(&torch_out)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| std::fs::read_to_string(&torch_out).ok())
            .flatten()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    } else {
        None
    };
    println!("\n| op ({} threads) | mopt fwd ms | PyTorch fwd ms | mopt fwd+bwd ms | PyTorch fwd+bwd ms | fwd+bwd ratio |", args.threads);
    println!("|---|---|---|---|---|---|");
    for r in &o.rows {
        let name = r["name"].as_str().unwrap_or_default();
        let tr = torch.as_ref().and_then(|t| {
            t["ops"]
                .as_array()?
                .iter()
                .find(|x| {
                    x["name"].as_str()
                        == Some(
                            name.trim_end_matches(" [mopt fused kernel]")
                                .trim_end_matches(FUSED)
                                .trim_end_matches(" [mopt]"),
                        )
                })
                .cloned()
        });
        let f = |v: &Value| v.as_f64().map_or("-".into(), |x| format!("{x:.2}"));
        let (tf, tfb) = tr.as_ref().map_or(("-".into(), "-".into()), |t| {
            (f(&t["fwd_ms"]), f(&t["fwd_bwd_ms"]))
        });
        let ratio = tr
            .as_ref()
            .and_then(|t| Some(r["fwd_bwd_ms"].as_f64()? / t["fwd_bwd_ms"].as_f64()?))
            .map_or("-".into(), |x| format!("{x:.2}x"));
        println!(
            "| {name} | {} | {tf} | {} | {tfb} | {ratio} |",
            f(&r["fwd_ms"]),
            f(&r["fwd_bwd_ms"])
        );
    }
    let report =
        json!({"cpu": cpu_info(), "threads": args.threads, "mopt": o.rows, "torch": torch});
    std::fs::write(out, serde_json::to_string_pretty(&report).expect("json")).expect("write");
    println!("results: {}", out.display());
}

/// AdamW step and global-norm clipping over the teacher's 22.7M parameters (fixed gradients).
fn optimizer_rows(o: &mut Ops) {
    let mut c = BertConfig::tiny(V, 2);
    c.hidden_size = H;
    c.num_hidden_layers = 6;
    c.num_attention_heads = HEADS;
    c.intermediate_size = F;
    c.max_position_embeddings = 512;
    let mut model = Some(BertForSequenceClassification::new(&c, &o.ad));
    let ids: Tensor<2, Int> = Tensor::random([B, S], Distribution::Uniform(0.0, V as f64), &o.ad);
    let mask: Tensor<2> = Tensor::ones([B, S], &o.ad);
    let types: Tensor<2, Int> = Tensor::zeros([B, S], &o.ad);
    let grads_of = |m: &BertForSequenceClassification| {
        let loss = m.forward(ids.clone(), mask.clone(), types.clone()).sum();
        GradientsParams::from_grads(loss.backward(), m)
    };
    let mut optim = AdamWConfig::new().with_weight_decay(0.01).init();
    let mut fused_optim = mopt_kernels::FusedAdamW::new(0.9, 0.999, 1e-5, 0.01).init();
    // Time clipping and the optimizer alone (the forward/backward above is excluded).
    let mut clip_ms = Vec::new();
    for (name, optim) in [
        ("AdamW step (22.7M params)".to_string(), &mut optim),
        (fused("AdamW step (22.7M params)"), &mut fused_optim),
    ] {
        let mut step_ms = Vec::new();
        for _ in 0..o.runs.min(8) {
            let m = model.take().expect("model");
            let mut g = grads_of(&m);
            let t = std::time::Instant::now();
            clip_global_norm(&m, &mut g, 1.0);
            clip_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let t = std::time::Instant::now();
            let m = optim.step(1e-5, m, g);
            let _: f32 = m.classifier.weight.val().sum().into_scalar();
            step_ms.push(t.elapsed().as_secs_f64() * 1e3);
            model = Some(m);
        }
        o.push(&name, &step_ms, &step_ms);
    }
    o.push("clip_global_norm (22.7M params) [mopt]", &clip_ms, &clip_ms);
}
