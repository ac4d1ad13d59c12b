//! Dev: per-layer conv timings of the Fashion-MNIST teacher's shapes at batch 64.
use mopt_kernels::conv::{conv2d, conv2d_backward, ConvShape};
use std::time::Instant;

fn main() {
    if std::env::var("BN").is_ok() {
        bn_bench();
        old_bn_bench();
        return;
    }
    let b = 64;
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
    let (mut tf, mut tb) = (0.0, 0.0);
    for (c, side, o, k, st, pad, count) in shapes {
        let s = ConvShape {
            batch: b,
            channels: c,
            height: side,
            width: side,
            out_channels: o,
            kernel: k,
            stride: st,
            pad,
        };
        let x: Vec<f32> = (0..b * c * side * side)
            .map(|i| (i % 13) as f32 * 0.1)
            .collect();
        let w: Vec<f32> = (0..o * c * k * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let (oh, ow) = s.out_hw();
        let g: Vec<f32> = (0..b * o * oh * ow).map(|i| (i % 5) as f32 * 0.1).collect();
        let flops = 2.0 * (b * o * oh * ow * c * k * k) as f64;
        let reps = 10;
        for _ in 0..2 {
            let _ = conv2d(&x, &w, &s);
        }
        let t = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(conv2d(&x, &w, &s));
        }
        let f = t.elapsed().as_secs_f64() / reps as f64;
        let t = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(conv2d_backward(&x, &w, &g, &s, (c > 1, true)));
        }
        let bw = t.elapsed().as_secs_f64() / reps as f64;
        let bflops = if c > 1 { 2.0 * flops } else { flops };
        let t = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(conv2d_backward(&x, &w, &g, &s, (false, true)));
        }
        let dw = t.elapsed().as_secs_f64() / reps as f64;
        print!("dW {:6.2} ms {:6.1} GF/s  ", dw * 1e3, flops / dw / 1e9);
        println!("{c:>3}->{o:>3} k{k} s{st} {side:>2}px x{count}: fwd {:7.2} ms {:6.1} GF/s | bwd {:7.2} ms {:6.1} GF/s", f * 1e3, flops / f / 1e9, bw * 1e3, bflops / bw / 1e9);
        tf += f * count as f64;
        tb += bw * count as f64;
    }
    println!("total fwd {:.1} ms, bwd {:.1} ms", tf * 1e3, tb * 1e3);
}

#[allow(dead_code)]
fn bn_bench() {
    use mopt_kernels::batchnorm::{backward_fused, forward_fused, BnShape};
    let s = BnShape {
        batch: 64,
        channels: 32,
        plane: 784,
    };
    let n: usize = 64 * 32 * 784;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 2003) as f32 / 1000.0 - 1.0)
        .collect();
    let r = x.iter().rev().cloned().collect::<Vec<_>>();
    let gamma = vec![1.0f32; 32];
    let beta = vec![0.1f32; 32];
    for (res, relu) in [(false, false), (false, true), (true, true)] {
        let t = Instant::now();
        let mut out = None;
        for _ in 0..20 {
            out = Some(forward_fused(
                &x,
                (&gamma, &beta),
                1e-5,
                (res.then_some(&r[..]), relu),
                &s,
            ));
        }
        let f = t.elapsed().as_secs_f64() / 20.0;
        let (y, m, v) = out.unwrap();
        let t = Instant::now();
        for _ in 0..20 {
            std::hint::black_box(backward_fused(
                &x,
                &gamma,
                (&m, &v),
                1e-5,
                (&r, relu.then_some(&y[..])),
                res,
                &s,
            ));
        }
        let b = t.elapsed().as_secs_f64() / 20.0;
        println!(
            "bn res={res} relu={relu}: fwd {:.2} ms bwd {:.2} ms",
            f * 1e3,
            b * 1e3
        );
    }
}

#[allow(dead_code)]
mod oldbn {
    include!("/tmp/oldbn.rs");
}

#[allow(dead_code)]
fn old_bn_bench() {
    let s = oldbn::BnShape {
        batch: 64,
        channels: 32,
        plane: 784,
    };
    let n: usize = 64 * 32 * 784;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 2003) as f32 / 1000.0 - 1.0)
        .collect();
    let gamma = vec![1.0f32; 32];
    let beta = vec![0.1f32; 32];
    let t = Instant::now();
    let mut out = None;
    for _ in 0..20 {
        out = Some(oldbn::forward(&x, &gamma, &beta, 1e-5, &s));
    }
    let f = t.elapsed().as_secs_f64() / 20.0;
    let (y, m, v) = out.unwrap();
    let t = Instant::now();
    for _ in 0..20 {
        std::hint::black_box(oldbn::backward(&x, &gamma, (&m, &v), 1e-5, &y, &s));
    }
    let b = t.elapsed().as_secs_f64() / 20.0;
    println!("old bn: fwd {:.2} ms bwd {:.2} ms", f * 1e3, b * 1e3);
}
