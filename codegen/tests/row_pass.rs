//! Reduction kernels with a row pass (softmax, log_softmax and layer_norm in
//! one kernel): the JIT against the interpreter, both outputs compared, over
//! rows with and without a vector tail, f32 and f64, a strided input; and
//! the kernel text, reviewed as a snapshot.

mod common;

use common::row_pass::{kernel, views, Norm};
use common::*;

/// Runs `k` over `rows x n` with the interpreter and the JIT (dim 0 in three
/// calls); returns both outputs of each.
fn run_both(k: &Kernel, rows: usize, n: usize, strided: bool, seed: u64) -> [[Vec<u8>; 2]; 2] {
    let dt = k.operands[1].dtype;
    let mut rng = Rng(seed | 1);
    let all = views(k, rows, n, (strided, true), &mut rng);
    let ins = &all[2..];
    let strides: Vec<isize> = all.iter().flat_map(|v| v.0.iter().copied()).collect();
    let parts = 1 + k.extra_out.len();
    let sizes = [rows, n];
    let ck = compile(k);
    let mut outs = vec![];
    for jit in [false, true] {
        let mut o0 = vec![0u8; rows * parts * dt.size()];
        let mut o1 = vec![0u8; rows * n * dt.size()];
        let mut ptrs = vec![o0.as_mut_ptr(), o1.as_mut_ptr()];
        ptrs.extend(ins.iter().map(|v| v.1.as_ptr() as *mut u8));
        let cuts = [0, rows / 3, 2 * rows / 3, rows];
        for w in cuts.windows(2) {
            unsafe {
                if jit {
                    ck.call(&ptrs, &strides, &sizes, &[], w[0], w[1]);
                } else {
                    run_kernel(k, &ptrs, &strides, &sizes, &[], w[0], w[1]);
                }
            }
        }
        outs.push([o0, o1]);
    }
    let j = outs.pop().unwrap();
    let i = outs.pop().unwrap();
    [i, j]
}

#[test]
fn row_pass_jit_matches_interpreter() {
    let mut seed = 7;
    let mut checked = 0;
    for norm in [Norm::Softmax, Norm::LogSoftmax, Norm::LayerNorm] {
        for dt in [F32, F64] {
            for (n, strided) in [
                (1, false),
                (5, false),
                (8, false),
                (37, false),
                (300, false),
                (37, true),
            ] {
                let inner = if strided {
                    Inner::Strided
                } else {
                    Inner::Contiguous
                };
                let k = kernel(norm, dt, inner);
                kiln_codegen::interp::validate(&k).unwrap();
                seed += 1;
                let [i, j] = run_both(&k, 6, n, strided, seed);
                for o in 0..2 {
                    let m = i[o].len() / dt.size();
                    for e in 0..m {
                        let a = Val::from_le_bytes(&j[o][e * dt.size()..], dt);
                        let b = Val::from_le_bytes(&i[o][e * dt.size()..], dt);
                        assert!(
                            close(a, b, &tol_for(dt)),
                            "{norm:?} {dt} n={n} strided={strided} out{o}[{e}]: jit {a:?} vs interp {b:?}\n{}",
                            k.to_text()
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 10_000, "compared {checked} values");
}

#[test]
fn softmax_row_pass_is_exact_against_its_definition() {
    // the interpreter's row pass is exp((x - shift) - logsum): check it
    // against that formula in f64 on a row with a large spread
    let k = kernel(Norm::Softmax, F64, Inner::Contiguous);
    let [i, _] = run_both(&k, 3, 37, false, 3);
    let x: Vec<f64> = {
        let mut rng = Rng(3 | 1);
        let raw = gen(&mut rng, F64, 3 * 37, -6.0, 6.0, true);
        (0..3 * 37)
            .map(|e| Val::from_le_bytes(&raw[e * 8..], F64).as_f64())
            .collect()
    };
    for r in 0..3 {
        let row = &x[r * 37..(r + 1) * 37];
        let shift = Val::from_le_bytes(&i[0][(r * 2) * 8..], F64).as_f64();
        let logsum = Val::from_le_bytes(&i[0][(r * 2 + 1) * 8..], F64).as_f64();
        for (e, &xv) in row.iter().enumerate() {
            let want = ((xv - shift) - logsum).exp();
            let got = Val::from_le_bytes(&i[1][(r * 37 + e) * 8..], F64).as_f64();
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "row {r} elem {e}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn normalised_rows_are_exact_against_their_moments() {
    // the row pass is `((x - mean) * rstd) * w + b` in f32 with the mean and
    // rstd the kernel stores: the wide affine helper (whole vectors, then one
    // lane) and the f32x4 code both give exactly that, on rows with edge
    // values (NaN rows stay NaN) and lengths around the vector widths
    let f32s = |b: &[u8]| -> Vec<f32> {
        b.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let mut rng = Rng(11);
    let mut checked = 0;
    for wide in [false, true] {
        let mut jit = kiln_codegen::cpu::CpuJit::new().unwrap();
        jit.set_wide(wide);
        for norm in Norm::MOMENTS {
            let k = kernel(norm, F32, Inner::Contiguous);
            let ck = jit.compile(&k).unwrap();
            for n in [1, 15, 16, 17, 300, 1027] {
                let rows = 5;
                let mut v = views(&k, rows, n, (false, true), &mut rng);
                let strides: Vec<isize> = v.iter().flat_map(|v| v.0.iter().copied()).collect();
                let ptrs: Vec<*mut u8> = v.iter_mut().map(|v| v.1.as_mut_ptr()).collect();
                // SAFETY: the views cover every index of a rows x n launch.
                unsafe { ck.call(&ptrs, &strides, &[rows, n], &[], 0, rows) };
                let (moments, out, x) = (f32s(&v[0].1), f32s(&v[1].1), f32s(&v[2].1));
                let affine = (k.operands.len() > 3).then(|| (f32s(&v[3].1), f32s(&v[4].1)));
                for r in 0..rows {
                    let (mean, rstd) = (moments[3 * r], moments[3 * r + 2]);
                    for i in 0..n {
                        let mut want = (x[r * n + i] - mean) * rstd;
                        if let Some((w, b)) = &affine {
                            want = want * w[i] + b[i];
                        }
                        let got = out[r * n + i];
                        assert!(
                            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                            "{norm:?} wide={wide} n={n} row {r} [{i}]: {got:e} vs {want:e}"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 40_000, "compared {checked} values");
}

#[test]
fn layer_norm_row_pass_calls_the_affine_helper() {
    // with the wide helpers the whole row pass is one call (the last import),
    // no f32x4 loop; reviewed as a snapshot
    let k = kernel(Norm::LayerNorm, F32, Inner::Contiguous);
    let text = kiln_codegen::cpu::CpuJit::clif_text_wide(&k).unwrap();
    insta::assert_snapshot!(text);
}

#[test]
fn row_pass_text() {
    insta::assert_snapshot!(kernel(Norm::LayerNorm, F32, Inner::Contiguous).to_text());
}

#[test]
fn validate_rejects_bad_row_passes() {
    let mut k = kernel(Norm::Softmax, F32, Inner::Contiguous);
    k.rows.as_mut().unwrap().instrs[0].0 = Instr::Load(1);
    assert!(kiln_codegen::interp::validate(&k)
        .unwrap_err()
        .to_string()
        .contains("loads operand 1"));
    let mut k = kernel(Norm::Softmax, F32, Inner::Contiguous);
    // a body value (per element of the reduction) is not a row-pass operand
    k.rows.as_mut().unwrap().instrs[1].0 = Instr::Binary(BinaryOp::Sub, 0, 2);
    assert!(kiln_codegen::interp::validate(&k)
        .unwrap_err()
        .to_string()
        .contains("only epilogue values"));
    let mut k = kernel(Norm::Softmax, F32, Inner::Contiguous);
    k.reduce = None;
    k.epilogue.clear();
    k.out = 0;
    k.extra_out.clear();
    assert!(kiln_codegen::interp::validate(&k).is_err());
}

/// `cargo test --release --test row_pass time_ -- --ignored --nocapture`:
/// a transformer-sized layer_norm whose rows stay in cache (on Zen 5 with
/// AVX-512, 9.9 us with the f32x4 row pass, 6.3 us with the affine helper).
#[test]
#[ignore]
fn time_layer_norm_in_cache() {
    let k = kernel(Norm::LayerNorm, F32, Inner::Contiguous);
    let mut jit = kiln_codegen::cpu::CpuJit::new().unwrap();
    jit.set_wide(true);
    let ck = jit.compile(&k).unwrap();
    let (rows, n) = (64, 768);
    let mut v = views(&k, rows, n, (false, false), &mut Rng(3));
    let strides: Vec<isize> = v.iter().flat_map(|v| v.0.iter().copied()).collect();
    let ptrs: Vec<*mut u8> = v.iter_mut().map(|v| v.1.as_mut_ptr()).collect();
    let mut ts = vec![];
    for _ in 0..50 {
        let t = std::time::Instant::now();
        for _ in 0..100 {
            unsafe { ck.call(&ptrs, &strides, &[rows, n], &[], 0, rows) };
        }
        ts.push(t.elapsed().as_secs_f64() / 100.0);
    }
    ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("layer_norm 64x768 in cache: {:.2} us", ts[25] * 1e6);
}
