use mopt_kernels::conv::{conv2d, conv2d_backward, ConvShape};
use std::time::Instant;
fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (c, side, o, mode) = (args[0], args[1], args[2], args[3]);
    let s = ConvShape {
        batch: 64,
        channels: c,
        height: side,
        width: side,
        out_channels: o,
        kernel: 3,
        stride: 1,
        pad: 1,
    };
    let x: Vec<f32> = (0..64 * c * side * side)
        .map(|i| ((i * 7919) % 13) as f32 / 13.0 - 0.5)
        .collect();
    let w: Vec<f32> = (0..o * c * 9)
        .map(|i| ((i * 7919) % 7) as f32 / 7.0 - 0.5)
        .collect();
    let g: Vec<f32> = (0..64 * o * side * side)
        .map(|i| ((i * 7919) % 5) as f32 / 5.0 - 0.5)
        .collect();
    let gf = 2.0 * (64 * o * side * side * c * 9) as f64 / 1e9;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..20 {
            match mode {
                0 => drop(conv2d(&x, &w, &s)),
                1 => drop(conv2d_backward(&x, &w, &g, &s, (false, true))),
                _ => drop(conv2d_backward(&x, &w, &g, &s, (true, false))),
            }
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / 20.0;
        println!("{ms:.2} ms {:.1} GFLOP/s", gf / ms * 1e3);
    }
}
