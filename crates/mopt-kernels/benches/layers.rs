//! Kernel-level timings on this CPU, without PyTorch (the speed harness at the workspace root
//! compares whole steps against it): every convolution shape of the Fashion-MNIST ResNet teacher
//! at batch 64 (forward, weight gradient, whole backward), the fused BatchNorm (+ residual +
//! ReLU) at its largest activation, and the GEMM on a square and the BERT layers' shapes.
//!
//! ```sh
//! cargo bench --profile dev -p mopt-kernels --bench layers
//! ```

use std::time::Instant;

use mopt_kernels::batchnorm::{backward, forward_fused, BnShape, Mask};
use mopt_kernels::conv::{conv2d, conv2d_backward, ConvShape};
use mopt_kernels::gemm::{sgemm, View};

/// Median milliseconds of `runs` calls after two warm-ups.
fn time(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    f();
    let mut ms: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    ms[runs / 2]
}

fn values(n: usize, m: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % m) as f32 / m as f32 - 0.5)
        .collect()
}

fn convolutions() {
    println!("convolutions, batch 64 (ms, GFLOP/s):");
    // (input channels, side, output channels, kernel, stride, padding, layers of this shape)
    let shapes = [
        (1, 28, 32, 3, 1, 1, 1usize),
        (32, 28, 32, 3, 1, 1, 4),
        (32, 28, 64, 3, 2, 1, 1),
        (32, 28, 64, 1, 2, 0, 1),
        (64, 14, 64, 3, 1, 1, 3),
        (64, 14, 128, 3, 2, 1, 1),
        (64, 14, 128, 1, 2, 0, 1),
        (128, 7, 128, 3, 1, 1, 3),
    ];
    let (mut fwd, mut bwd) = (0.0, 0.0);
    for (c, side, o, k, stride, pad, layers) in shapes {
        let s = ConvShape {
            batch: 64,
            channels: c,
            height: side,
            width: side,
            out_channels: o,
            kernel: k,
            stride,
            pad,
        };
        let (oh, ow) = s.out_hw();
        let x = values(64 * c * side * side, 13);
        let w = values(o * c * k * k, 7);
        let g = values(64 * o * oh * ow, 5);
        let gf = 2.0 * (64 * o * oh * ow * c * k * k) as f64 / 1e9;
        let want_dx = c > 1;
        let f = time(9, || drop(conv2d(&x, &w, &s)));
        let dw = time(9, || drop(conv2d_backward(&x, &w, &g, &s, (false, true))));
        let b = time(9, || drop(conv2d_backward(&x, &w, &g, &s, (want_dx, true))));
        let bgf = if want_dx { 2.0 * gf } else { gf };
        println!(
            "  {c:>3} -> {o:>3}, {k}x{k} /{stride}, {side:>2}px (x{layers}): forward {f:6.2} ({:5.1}) | dW {dw:6.2} ({:5.1}) | backward {b:6.2} ({:5.1})",
            gf / f * 1e3,
            gf / dw * 1e3,
            bgf / b * 1e3
        );
        fwd += f * layers as f64;
        bwd += b * layers as f64;
    }
    println!("  all of the network's convolutions: forward {fwd:.1} ms, backward {bwd:.1} ms");
}

fn batch_norm() {
    let s = BnShape {
        batch: 64,
        channels: 32,
        plane: 28 * 28,
    };
    let n = 64 * 32 * 28 * 28;
    let (x, r) = (values(n, 2003), values(n, 1009));
    let (gamma, beta) = (vec![1.1f32; 32], vec![0.1f32; 32]);
    println!("BatchNorm (training) on [64, 32, 28, 28] (ms):");
    for (res, relu) in [(false, false), (false, true), (true, true)] {
        let epilogue = (res.then_some(&r[..]), relu);
        let (y, m, v) = forward_fused(&x, (&gamma, &beta), 1e-5, epilogue, &s);
        let f = time(9, || {
            drop(forward_fused(&x, (&gamma, &beta), 1e-5, epilogue, &s))
        });
        // As the network runs it: the output's mask kept for the residual's gradient, the
        // input's recomputed mask and dx over g without one. One gradient buffer serves every
        // repetition (overwritten by dx, it stays finite over the eleven runs).
        let mask = match (res, relu) {
            (true, true) => Mask::Output(&y),
            (false, true) => Mask::Input,
            _ => Mask::None,
        };
        let mut g = r.clone();
        let b = time(9, || {
            let grad = (&mut g[..], mask, res);
            drop(backward(&x, (&gamma, &beta), (&m, &v), 1e-5, grad, &s));
        });
        println!("  residual {res:5}, ReLU {relu:5}: forward {f:.2}, backward {b:.2}");
    }
}

/// mopt's GEMM beside Burn Flex's matmul (the `gemm` crate) on the same shapes: the square
/// product and the BERT layers' (tokens × hidden × FFN both ways) and a conv-sized one.
fn products() {
    use burn::prelude::*;
    println!(
        "GEMM (GFLOP/s, mopt path {} | Burn Flex matmul | mopt bf16 path {}):",
        mopt_kernels::gemm::path(),
        mopt_kernels::bf16::path()
    );
    let device = Device::flex();
    let shapes = [
        (2048, 2048, 2048),
        (2048, 384, 1536),
        (2048, 1536, 384),
        (2048, 384, 384),
        (128, 1152, 3136),
    ];
    for (m, k, n) in shapes {
        let (a, b) = (values(m * k, 17), values(k * n, 13));
        let mut c = vec![0.0f32; m * n];
        let ms = time(5, || {
            sgemm(
                View::row_major(&a, m, k),
                View::row_major(&b, k, n),
                &mut c,
                1.0,
                false,
            )
        });
        let ta = Tensor::<2>::from_data(TensorData::new(a.clone(), [m, k]), &device);
        let tb = Tensor::<2>::from_data(TensorData::new(b.clone(), [k, n]), &device);
        let burn_ms = time(5, || {
            let _ = ta.clone().matmul(tb.clone()).into_data();
        });
        let bf16_ms = time(5, || {
            mopt_kernels::bf16::gemm(
                View::row_major(&a, m, k),
                View::row_major(&b, k, n),
                &mut c,
                false,
            )
        });
        let rate = |ms: f64| 2.0 * (m * k * n) as f64 / ms / 1e6;
        println!(
            "  {m} x {k} x {n}: {:.1} | {:.1} | bf16 {:.1}",
            rate(ms),
            rate(burn_ms),
            rate(bf16_ms)
        );
    }
}

/// Batch-1 inference's products: 64 token rows against a BERT layer's weight matrices, each
/// weight from L3 as in a forward pass (the product cycles through 8 copies of B, more than L2
/// holds), mopt's f32 GEMM beside the `gemm` crate called through Burn Flex's matmul.
fn few_rows() {
    use burn::prelude::*;
    println!(
        "few rows, B from L3 (GFLOP/s, mopt {} | Burn Flex matmul):",
        mopt_kernels::gemm::path()
    );
    let device = Device::flex();
    for (m, k, n) in [
        (64, 384, 1152),
        (64, 384, 384),
        (64, 384, 1536),
        (64, 1536, 384),
    ] {
        let a = values(m * k, 17);
        let bs: Vec<Vec<f32>> = (0..8).map(|i| values(k * n, 13 + i)).collect();
        let mut c = vec![0.0f32; m * n];
        let mut i = 0;
        let ms = time(41, || {
            i += 1;
            sgemm(
                View::row_major(&a, m, k),
                View::row_major(&bs[i % 8], k, n),
                &mut c,
                1.0,
                false,
            )
        });
        let ta = Tensor::<2>::from_data(TensorData::new(a.clone(), [m, k]), &device);
        let tbs: Vec<Tensor<2>> = bs
            .iter()
            .map(|b| Tensor::<2>::from_data(TensorData::new(b.clone(), [k, n]), &device))
            .collect();
        let burn_ms = time(41, || {
            i += 1;
            let _ = ta.clone().matmul(tbs[i % 8].clone()).into_data();
        });
        let rate = |ms: f64| 2.0 * (m * k * n) as f64 / ms / 1e6;
        println!("  {m} x {k} x {n}: {:.1} | {:.1}", rate(ms), rate(burn_ms));
    }
}

/// bf16 products with a transposed operand, as a linear layer's backward runs them: dW = Xᵀ·G
/// (A transposed) and dX = G·Wᵀ (B transposed), X `[2048, 384]`, W `[384, 1536]`.
fn backward_products() {
    let (m, k, n) = (2048, 384, 1536);
    let (x, w, g) = (values(m * k, 3), values(k * n, 5), values(m * n, 7));
    let mut dw = vec![0.0f32; k * n];
    let mut dx = vec![0.0f32; m * k];
    let rate = |ms: f64| 2.0 * (m * k * n) as f64 / ms / 1e6;
    let gv = View::row_major(&g, m, n);
    for bf16 in [false, true] {
        let product = |a: View, b: View, c: &mut [f32]| match bf16 {
            true => mopt_kernels::bf16::gemm(a, b, c, false),
            false => sgemm(a, b, c, 1.0, false),
        };
        let dw_ms = time(5, || product(View::row_major(&x, m, k).t(), gv, &mut dw));
        let dx_ms = time(5, || product(gv, View::row_major(&w, k, n).t(), &mut dx));
        println!(
            "  {}: dW = X^T G {:.1}, dX = G W^T {:.1}",
            if bf16 { "bf16" } else { "f32" },
            rate(dw_ms),
            rate(dx_ms)
        );
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    mopt_kernels::tune_allocator();
    mopt_kernels::init_pool(None).expect("rayon pool");
    println!("{} threads", rayon::current_num_threads());
    // `--only products` (or `convolutions`, `batch-norm`): one group.
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1));
    let run = |name: &str| only.is_none_or(|o| o == name);
    if run("convolutions") {
        convolutions();
    }
    if run("batch-norm") {
        batch_norm();
    }
    if run("products") {
        products();
        backward_products();
    }
    if run("products") || run("few-rows") {
        few_rows();
    }
}
