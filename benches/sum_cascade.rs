//! Times a full f32 `sum` and a row `sum` with the cascade on and off
//! (`KILN_SUM_CASCADE=0` is the single-row kernel kiln used before),
//! alternating the two modes, and prints medians and the error of each
//! against the f64 sum. `cargo bench --bench sum_cascade [-- N]`.

use kiln::{DType, Tensor};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
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
    let mut times = [[vec![], vec![]], [vec![], vec![]]];
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
            if rep > 0 {
                times[mode][0].push(full);
                times[mode][1].push(row);
            }
            values[mode] = s.item().unwrap();
        }
    }
    for (mode, name) in [(0, "cascade"), (1, "single row (before)")] {
        let [full, row] = &times[mode];
        println!(
            "sum of {n} f32, {name}: full {:.2} ms, {rows} rows {:.2} ms; value {} (relative error {:.2e})",
            median(full.clone()),
            median(row.clone()),
            values[mode],
            ((values[mode] - exact) / exact).abs()
        );
    }
}
