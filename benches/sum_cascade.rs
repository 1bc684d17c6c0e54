//! Times a full f32 `sum`, a row `sum` and a compiled full `sum` with the
//! cascade on and off (`KILN_SUM_CASCADE=0` is the single-row kernel kiln
//! used before), alternating the two modes, and prints medians (with the
//! min-max spread: the machine may be shared) and the error of each against
//! the f64 sum. `cargo bench --bench sum_cascade [-- N]`.

use kiln::{DType, Tensor};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// `median ms (min-max)`.
fn spread(v: &[f64]) -> String {
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(0.0, f64::max);
    format!("{:.2} ms ({lo:.2}-{hi:.2})", median(v.to_vec()))
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20_000_000);
    let rows = 64;
    let x = Tensor::full(&[n], 0.1, DType::F32);
    let m = Tensor::full(&[rows, n / rows], 0.1, DType::F32);
    let exact = n as f64 * (0.1f32 as f64);
    let compiled = kiln::compile::compile_fn("sum", |t| Ok(vec![t[0].sum(None, false)?]));
    let mut times = [[vec![], vec![], vec![]], [vec![], vec![], vec![]]];
    let mut values = [0.0; 2];
    for rep in 0..11 {
        for (mode, on) in [(0, "1"), (1, "0")] {
            std::env::set_var("KILN_SUM_CASCADE", on);
            let t = Instant::now();
            let s = x.sum(None, false).unwrap();
            let full = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let r = m.sum(Some(&[1]), false).unwrap();
            let row = t.elapsed().as_secs_f64() * 1e3;
            drop(r);
            let t = Instant::now();
            let c = compiled.call(std::slice::from_ref(&x)).unwrap();
            let comp = t.elapsed().as_secs_f64() * 1e3;
            drop(c);
            if rep > 0 {
                times[mode][0].push(full);
                times[mode][1].push(row);
                times[mode][2].push(comp);
            }
            values[mode] = s.item().unwrap();
        }
    }
    for (mode, name) in [(0, "cascade"), (1, "single row (before)")] {
        let [full, row, comp] = &times[mode];
        println!(
            "sum of {n} f32, {name}: full {}, {rows} rows {}, compiled full {}; value {} (relative error {:.2e})",
            spread(full),
            spread(row),
            spread(comp),
            values[mode],
            ((values[mode] - exact) / exact).abs()
        );
    }
}
