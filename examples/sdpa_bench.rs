//! Times `scaled_dot_product_attention` fused against the composite
//! (`scaled_dot_product_attention_math`), eager and compiled, forward and
//! forward + backward, on batch 8, 4 heads, head dim 64, causal:
//!
//! ```sh
//! cargo run --release --example sdpa_bench -- [ITERS]
//! ```
//!
//! Prints one line per (L, path, mode) with the median milliseconds.

use kiln::compile::compile_fn;
use kiln::functional::{self as F, SdpaOpts};
use kiln::{Result, Tensor};
use std::time::Instant;

type Sdpa = fn(&Tensor, &Tensor, &Tensor, Option<&Tensor>, SdpaOpts) -> Result<Tensor>;

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
        .unwrap_or(5);
    let o = SdpaOpts {
        is_causal: true,
        ..Default::default()
    };
    for l in [128usize, 256, 512] {
        let dims = [8, 4, l, 64];
        let qkv: Vec<Tensor> = (0..3).map(|i| kiln::bench::randn(&dims, i)).collect();
        for (name, f) in [
            ("fused", F::scaled_dot_product_attention as Sdpa),
            ("composite", F::scaled_dot_product_attention_math),
        ] {
            let eager = {
                let _no = kiln::autograd::no_grad();
                median_ms(iters, || {
                    drop(f(&qkv[0], &qkv[1], &qkv[2], None, o).unwrap())
                })
            };
            let c = compile_fn(name, move |t: &[Tensor]| {
                Ok(vec![f(&t[0], &t[1], &t[2], None, o)?])
            });
            let compiled = {
                let _no = kiln::autograd::no_grad();
                median_ms(iters, || drop(c.call(&qkv).unwrap()))
            };
            let train: Vec<Tensor> = qkv
                .iter()
                .map(|t| t.detach().requires_grad_(true))
                .collect();
            let step = median_ms(iters, || {
                let y = f(&train[0], &train[1], &train[2], None, o).unwrap();
                y.sum(None, false).unwrap().backward().unwrap();
            });
            println!("L=S={l:4} {name:9}: eager {eager:8.2} ms, compiled {compiled:8.2} ms, eager forward+backward {step:8.2} ms");
        }
    }
    Ok(())
}
