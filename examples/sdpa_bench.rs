//! Times `scaled_dot_product_attention` fused against the composite
//! (`scaled_dot_product_attention_math`), eager and compiled, forward and
//! forward + backward, on batch 8, 4 heads, head dim 64, causal and not:
//!
//! ```sh
//! cargo run --release --example sdpa_bench -- [ITERS]
//! ```
//!
//! The two paths run alternately, one call each in turn, so a noisy,
//! shared machine slows both alike; each line prints the medians in
//! milliseconds and composite / fused (above 1: the fused kernel is faster).

use kiln::compile::compile_fn;
use kiln::functional::{self as F, SdpaOpts};
use kiln::{Result, Tensor};
use std::time::Instant;

type Sdpa = fn(&Tensor, &Tensor, &Tensor, Option<&Tensor>, SdpaOpts) -> Result<Tensor>;

const PATHS: [Sdpa; 2] = [
    F::scaled_dot_product_attention,
    F::scaled_dot_product_attention_math,
];

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// Medians of `fs[0]` and `fs[1]` over `iters` alternating calls (after
/// one warm-up call each).
fn ab_ms(iters: usize, fs: &mut [Box<dyn FnMut() + '_>; 2]) -> [f64; 2] {
    fs.iter_mut().for_each(|f| f());
    let mut t = [vec![], vec![]];
    for _ in 0..iters {
        for (f, t) in fs.iter_mut().zip(&mut t) {
            let s = Instant::now();
            f();
            t.push(s.elapsed().as_secs_f64() * 1e3);
        }
    }
    let [a, b] = t;
    [median(a), median(b)]
}

fn row(what: &str, l: usize, causal: bool, [fused, math]: [f64; 2]) {
    println!(
        "L=S={l:4} causal={causal:5} {what:16}: fused {fused:8.2} ms, composite {math:8.2} ms, composite/fused {:5.2}",
        math / fused
    );
}

fn main() -> Result<()> {
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    println!(
        "cpu isa: {}",
        kiln::runtime::externs::cpu_isa::detect().name()
    );
    for l in [128usize, 256, 512] {
        let dims = [8, 4, l, 64];
        let qkv: Vec<Tensor> = (0..3).map(|i| kiln::bench::randn(&dims, i)).collect();
        for causal in [true, false] {
            let o = SdpaOpts {
                is_causal: causal,
                ..Default::default()
            };
            let (q, k, v) = (&qkv[0], &qkv[1], &qkv[2]);
            let eager = {
                let _no = kiln::autograd::no_grad();
                ab_ms(
                    iters,
                    &mut PATHS.map(|f| {
                        Box::new(move || drop(f(q, k, v, None, o).unwrap())) as Box<dyn FnMut()>
                    }),
                )
            };
            row("eager", l, causal, eager);
            let compiled = PATHS.map(|f| {
                compile_fn("sdpa", move |t: &[Tensor]| {
                    Ok(vec![f(&t[0], &t[1], &t[2], None, o)?])
                })
            });
            let times = {
                let _no = kiln::autograd::no_grad();
                let qkv = &qkv;
                ab_ms(
                    iters,
                    &mut [0, 1].map(|i| {
                        let c = &compiled[i];
                        Box::new(move || drop(c.call(qkv).unwrap())) as Box<dyn FnMut()>
                    }),
                )
            };
            row("compiled", l, causal, times);
            let train: Vec<Tensor> = qkv
                .iter()
                .map(|t| t.detach().requires_grad_(true))
                .collect();
            let train = &train;
            let step = ab_ms(
                iters,
                &mut PATHS.map(|f| {
                    Box::new(move || {
                        let y = f(&train[0], &train[1], &train[2], None, o).unwrap();
                        y.sum(None, false).unwrap().backward().unwrap();
                    }) as Box<dyn FnMut()>
                }),
            );
            row("forward+backward", l, causal, step);
        }
    }
    Ok(())
}
