//! Log-sum-exp and Welford rows folded tile by tile by the wide reduce
//! helper, against the one-pass f32x4 rows (`set_wide(false)`) and an f64
//! reference: softmax's (shift, logsum) and layer_norm's (mean, var, rstd)
//! are the same bits or no further from the truth than twice the one-pass
//! error plus 8 ulp, on odd row lengths, rows shorter and longer than a tile,
//! rows offset by 1000, and give the same special values on rows of -inf,
//! partly masked rows, rows with a +inf (midway or last) or a NaN, and empty
//! rows.

#[path = "online_kernels/mod.rs"]
mod online_kernels;

use kiln_codegen::cpu::{CompiledKernel, CpuJit};
use kiln_codegen::Kernel;
use online_kernels::{layer_norm_moments, softmax_lse};
use std::sync::Mutex;

static JITS: Mutex<Option<(CpuJit, CpuJit)>> = Mutex::new(None);

fn compile_both(k: &Kernel) -> (CompiledKernel, CompiledKernel) {
    let mut g = JITS.lock().unwrap_or_else(|e| e.into_inner());
    let (w, p) = g.get_or_insert_with(|| {
        let mut w = CpuJit::new().unwrap();
        w.set_wide(true);
        let mut p = CpuJit::new().unwrap();
        p.set_wide(false);
        (w, p)
    });
    (w.compile(k).unwrap(), p.compile(k).unwrap())
}

/// Runs a row kernel storing `outs` values per row over `rows` rows of `x`.
fn run(ck: &CompiledKernel, x: &[f32], rows: usize, cols: usize, outs: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * outs];
    let mut xs = x.to_vec();
    let ptrs = [out.as_mut_ptr() as *mut u8, xs.as_mut_ptr() as *mut u8];
    let strides = [outs as isize, 0, cols as isize, 1];
    let sizes = [rows, cols];
    let eps = 1e-5f64.to_bits();
    // SAFETY: the buffers cover every index.
    unsafe { ck.call(&ptrs, &strides, &sizes, &[eps], 0, rows) };
    out
}

fn rows_of(cols: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut s = seed | 1;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 20.0
    };
    let plain: Vec<f32> = (0..cols).map(|_| rnd()).collect();
    let offset: Vec<f32> = (0..cols).map(|_| rnd() + 1000.0).collect();
    let mut masked = plain.clone();
    for (i, v) in masked.iter_mut().enumerate() {
        if i % 3 != 1 {
            *v = f32::NEG_INFINITY;
        }
    }
    let mut rows = vec![plain.clone(), offset, masked, vec![f32::NEG_INFINITY; cols]];
    if cols > 0 {
        let mut inf = plain.clone();
        inf[cols / 2] = f32::INFINITY;
        let mut nan = plain.clone();
        nan[cols - 1] = f32::NAN;
        let mut inf_last = plain.clone();
        inf_last[cols - 1] = f32::INFINITY;
        rows.push(inf);
        rows.push(nan);
        rows.push(inf_last);
    }
    rows
}

/// The f64 truth of a row: lse (shift, logsum) or (mean, var, rstd).
fn reference(row: &[f32], lse: bool) -> Vec<f64> {
    let x: Vec<f64> = row.iter().map(|&v| v as f64).collect();
    if lse {
        let m = x.iter().fold(f32::MIN as f64, |a, &b| {
            if b.is_nan() || a.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        });
        let s: f64 = x.iter().map(|v| (v - m).exp()).sum();
        let logsum = if m == f64::INFINITY { f64::NAN } else { s.ln() };
        vec![m, logsum]
    } else {
        let n = x.len() as f64;
        let mean = x.iter().sum::<f64>() / n;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        vec![mean, var, 1.0 / (var + 1e-5).sqrt()]
    }
}

/// The wide value is the one-pass value's bits, or no further from the f64
/// truth than twice the one-pass error plus 8 ulp of the value.
fn agree(name: &str, wide: f32, one_pass: f32, truth: f64) {
    let same = wide.to_bits() == one_pass.to_bits() || (wide.is_nan() && one_pass.is_nan());
    if !truth.is_finite() {
        // inf or NaN rows: the one-pass special value (the one-pass mean of
        // a row holding inf is NaN where the f64 sum's is inf)
        assert!(
            same,
            "{name}: wide {wide:e}, one-pass {one_pass:e}, f64 {truth:e}"
        );
        return;
    }
    let ulp = f32::EPSILON as f64 * truth.abs().max(f32::MIN_POSITIVE as f64);
    let close = (wide as f64 - truth).abs() <= 2.0 * (one_pass as f64 - truth).abs() + 8.0 * ulp;
    assert!(
        same || close,
        "{name}: wide {wide:e}, one-pass {one_pass:e}, f64 {truth:e}"
    );
}

fn check(k: &Kernel, outs: usize, lse: bool) {
    let (w, p) = compile_both(k);
    for cols in [0, 1, 5, 255, 256, 257, 1000, 1024, 3001] {
        let rows = rows_of(cols, 3 + cols as u64);
        let x: Vec<f32> = rows.concat();
        let n = rows.len();
        let a = run(&w, &x, n, cols, outs);
        let b = run(&p, &x, n, cols, outs);
        for (r, row) in rows.iter().enumerate() {
            let truth = reference(row, lse);
            for o in 0..outs {
                let name = format!("row {r} of {cols} (lse: {lse}), output {o}");
                agree(&name, a[r * outs + o], b[r * outs + o], truth[o]);
            }
        }
    }
}

#[test]
fn tiled_log_sum_exp_rows_agree_with_one_pass() {
    check(&softmax_lse(), 2, true);
}

#[test]
fn tiled_welford_rows_agree_with_one_pass() {
    check(&layer_norm_moments(), 3, false);
}

#[test]
fn tiled_lse_row_clif_snapshot() {
    let text = CpuJit::clif_text_wide(&softmax_lse()).unwrap();
    assert!(text.contains("explicit_slot"), "{text}");
    insta::assert_snapshot!("tiled_lse_clif", text);
}

/// Not a test: one-thread times of softmax's log-sum-exp row and
/// layer_norm's moments row over 4096x1024, tiled vs one-pass, alternating
/// (`cargo test --release -p kiln-codegen --test cpu_wide_reduce -- --ignored --nocapture`).
#[test]
#[ignore]
fn time_tiled_vs_one_pass() {
    let (rows, cols) = (4096, 1024);
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
        .collect();
    for (name, k, outs) in [
        ("lse", softmax_lse(), 2),
        ("moments", layer_norm_moments(), 3),
    ] {
        let (w, p) = compile_both(&k);
        for round in 0..3 {
            let mut t = [0.0; 2];
            for (j, ck) in [&p, &w].into_iter().enumerate() {
                let mut ts: Vec<f64> = (0..9)
                    .map(|_| {
                        let s = std::time::Instant::now();
                        std::hint::black_box(run(ck, &x, rows, cols, outs));
                        s.elapsed().as_secs_f64() * 1e3
                    })
                    .collect();
                ts.sort_by(f64::total_cmp);
                t[j] = ts[4];
            }
            eprintln!(
                "{name} row ({rows}x{cols}, 1 thread, incl. a 16 MiB input copy) round {round}: one-pass {:.3} ms, tiled {:.3} ms, {:.2}x",
                t[0], t[1], t[0] / t[1]
            );
        }
    }
}
