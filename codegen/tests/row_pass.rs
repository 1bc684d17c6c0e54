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
