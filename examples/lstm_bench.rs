//! Times a compiled LSTM forward (no grad), T=64, B=8, IN=H=256, one layer,
//! batch first, against eager:
//!
//! ```sh
//! cargo run --release --example lstm_bench -- [ITERS]
//! KILN_MULTI_OUT=0 cargo run --release --example lstm_bench -- [ITERS]   # one root per kernel
//! ```
//!
//! Prints the compiled kernel count and the median milliseconds of each mode.

use kiln::compile::compile_fn;
use kiln::nn::{Module, RnnOptions, LSTM};
use kiln::{Result, Tensor};
use std::time::Instant;

fn median_ms(iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..iters)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() -> Result<()> {
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let (t, b, h) = (64, 8, 256);
    kiln::manual_seed(0);
    let opts = RnnOptions {
        batch_first: true,
        ..Default::default()
    };
    let lstm = LSTM::new(h, h, opts)?;
    let ins = vec![
        kiln::bench::randn(&[b, t, h], 1),
        kiln::bench::randn(&[1, b, h], 2),
        kiln::bench::randn(&[1, b, h], 3),
    ];
    let fwd = |x: &[Tensor]| {
        let ins: Vec<Option<&Tensor>> = x.iter().map(Some).collect();
        lstm.forward_many(&ins)
    };
    let _no = kiln::autograd::no_grad();
    let c = compile_fn("lstm", fwd);
    c.call(&ins)?;
    let kernels = c.explain().entries[0].kernels.len();
    let compiled = median_ms(iters, || drop(c.call(&ins).unwrap()));
    let eager = median_ms(iters, || drop(fwd(&ins).unwrap()));
    let multi = std::env::var("KILN_MULTI_OUT").map_or(true, |v| v != "0");
    println!(
        "lstm T={t} B={b} H={h} multi_out={multi}: {kernels} kernels, compiled {compiled:.3} ms, eager {eager:.3} ms"
    );
    Ok(())
}
