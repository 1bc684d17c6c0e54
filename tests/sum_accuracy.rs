//! f32 sums and means of long rows against the f64 sum, eager and compiled
//! (cold and warm calls): the cascade keeps the relative error near 1e-7
//! where one accumulator row drifted by 0.6% at 20M elements. 1M and 20M
//! run here; `KILN_SUM_100M=1` adds 100M (400 MB per tensor).

use kiln::compile::compile_fn;
use kiln::{DType, Tensor};

/// Relative errors of (sum, mean) of `n` f32 values 0.1, eager then compiled
/// twice; then (fused-prologue sum, worst row sum) compiled twice.
fn errors(n: usize) -> Vec<(String, f64, f64)> {
    let x = Tensor::full(&[n], 0.1, DType::F32);
    let exact = n as f64 * (0.1f32 as f64);
    let rel = |v: f64, want: f64| ((v - want) / want).abs();
    let mut out = vec![];
    let eager_sum = x.sum(None, false).unwrap().item().unwrap();
    let eager_mean = x.mean(None, false).unwrap().item().unwrap();
    out.push((
        "eager".to_string(),
        rel(eager_sum, exact),
        rel(eager_mean, exact / n as f64),
    ));
    let f = compile_fn("sum_mean", |t| {
        Ok(vec![t[0].sum(None, false)?, t[0].mean(None, false)?])
    });
    for call in ["compiled (cold)", "compiled (warm)"] {
        let r = f.call(&[x.clone()]).unwrap();
        out.push((
            call.to_string(),
            rel(r[0].item().unwrap(), exact),
            rel(r[1].item().unwrap(), exact / n as f64),
        ));
    }
    // a fused prologue (the sum reads x * 2 - 0.1, never stored) and row sums
    let g = compile_fn("fused_rows", |t| {
        let y = (&(&t[0] * 2.0) - 0.1).sum(None, false)?;
        let rows = t[0].reshape(&[4, -1])?.sum(Some(&[1]), false)?;
        Ok(vec![y, rows])
    });
    for call in [
        "compiled prologue+rows (cold)",
        "compiled prologue+rows (warm)",
    ] {
        let r = g.call(&[x.clone()]).unwrap();
        let fused = (0.1f32 as f64 * 2.0 - 0.1) * n as f64;
        let rows = r[1].to_f64_vec();
        let row_err = rows
            .iter()
            .map(|&v| rel(v, exact / 4.0))
            .fold(0.0, f64::max);
        out.push((call.to_string(), rel(r[0].item().unwrap(), fused), row_err));
    }
    // both ran compiled, not eagerly after a graph break
    for c in [&f, &g] {
        let r = c.explain();
        assert!(r.entries.iter().all(|e| e.graph_break.is_none()), "{r}");
        assert!(!r.entries[0].kernels.is_empty(), "{r}");
    }
    out
}

#[test]
fn long_f32_sums_stay_accurate_eager_and_compiled() {
    let mut sizes = vec![1_000_000, 20_000_000];
    if std::env::var_os("KILN_SUM_100M").is_some() {
        sizes.push(100_000_000);
    }
    for n in sizes {
        for (how, sum, mean) in errors(n) {
            println!("n={n} {how}: relative errors {sum:.2e}, {mean:.2e}");
            // one accumulator row was off by 6e-3 at 20M; PyTorch ~1e-7
            assert!(sum < 1e-5, "n={n} {how}: sum off by {sum:.2e}");
            assert!(mean < 1e-5, "n={n} {how}: mean off by {mean:.2e}");
        }
    }
}
