//! Softmax rows with one exp per element (`cpu/softmax_row.rs`): the row's
//! reduced value stored to the output, rewritten to `exp(x - shift)` by the
//! wide helper, then scaled by `1 / s`. Against the one-pass kernel
//! (`set_wide(false)`, two exps) and an f64 softmax: the per-row shift is
//! the same bits, the log-sum is as close to the truth, and every softmax
//! value's relative error is at most twice the one-pass kernel's worst on
//! that row plus 4 ulp; rows of -inf, partly masked rows, rows with +inf or NaN, and empty
//! rows give the one-pass kernel's special values. The helper itself is
//! checked against the portable one on every ISA this CPU has.

mod common;

use common::row_pass::{kernel, Norm};
use common::{op, BinaryOp, Inner, Instr, Kernel, ReduceKind, Reduction, UnaryOp, F32};
use kiln_codegen::cpu::{wide, wide::Uses, CompiledKernel, CpuJit};
use kiln_codegen::{AccPart, RowPass};

/// Runs a softmax row kernel over `rows` rows of `cols`: (parts, softmax).
fn run(ck: &CompiledKernel, x: &[f32], rows: usize, cols: usize) -> (Vec<f32>, Vec<f32>) {
    let mut parts = vec![0f32; rows * 2];
    let mut out = vec![0f32; rows * cols];
    let mut xs = x.to_vec();
    let ptrs = [
        parts.as_mut_ptr() as *mut u8,
        out.as_mut_ptr() as *mut u8,
        xs.as_mut_ptr() as *mut u8,
    ];
    let c = cols as isize;
    let strides = [2, 0, c, 1, c, 1];
    // SAFETY: the buffers cover every index.
    unsafe { ck.call(&ptrs, &strides, &[rows, cols], &[], 0, rows) };
    (parts, out)
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
    let offset: Vec<f32> = plain.iter().map(|v| v + 1000.0).collect();
    let mut masked = plain.clone();
    for (i, v) in masked.iter_mut().enumerate() {
        if i % 3 != 1 {
            *v = f32::NEG_INFINITY;
        }
    }
    let mut rows = vec![plain.clone(), offset, masked, vec![f32::NEG_INFINITY; cols]];
    if cols > 0 {
        for special in [f32::INFINITY, f32::NAN] {
            let mut r = plain.clone();
            r[cols / 2] = special;
            rows.push(r);
        }
    }
    rows
}

/// The f64 softmax of `row`.
fn truth(row: &[f32]) -> Vec<f64> {
    let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
    row.iter().map(|&v| (v as f64 - m).exp() / s).collect()
}

#[test]
fn stored_exp_softmax_rows_match_one_pass_and_f64() {
    let k = kernel(Norm::Softmax, F32, Inner::Contiguous);
    let mut stored_jit = CpuJit::new().unwrap();
    stored_jit.set_wide(true);
    let mut one_pass_jit = CpuJit::new().unwrap();
    one_pass_jit.set_wide(false);
    let (a, b) = (
        stored_jit.compile(&k).unwrap(),
        one_pass_jit.compile(&k).unwrap(),
    );
    let mut compared = 0;
    for cols in [0, 1, 3, 7, 8, 9, 255, 256, 257, 1000, 1024, 3001] {
        let rows = rows_of(cols, 5 + cols as u64);
        let x = rows.concat();
        let (pa, sa) = run(&a, &x, rows.len(), cols);
        let (pb, sb) = run(&b, &x, rows.len(), cols);
        for (r, row) in rows.iter().enumerate() {
            let what = format!("row {r} of {cols}");
            let (shift, logsum) = ((pa[2 * r], pb[2 * r]), (pa[2 * r + 1], pb[2 * r + 1]));
            assert!(
                shift.0.to_bits() == shift.1.to_bits() || shift.0.is_nan() && shift.1.is_nan(),
                "{what}: shift {shift:?}"
            );
            // log(s) of sums in another order: within n ulp of s, plus log's rounding
            let bound = (cols as f32 + 4.0) * f32::EPSILON * logsum.1.abs().max(1.0);
            let near = (logsum.0 - logsum.1).abs() <= bound;
            assert!(
                near || logsum.0 == logsum.1 || logsum.0.is_nan() && logsum.1.is_nan(),
                "{what}: logsum {logsum:?}"
            );
            let want = truth(row);
            let rel = |v: f32, t: f64| (v as f64 - t).abs() / t.max(f32::MIN_POSITIVE as f64);
            // the one-pass kernel's worst relative error on the row: its
            // log-sum's rounding is shared by the whole row
            let one_pass = (0..cols)
                .filter(|&e| !sb[r * cols + e].is_nan())
                .map(|e| rel(sb[r * cols + e], want[e]))
                .fold(0.0, f64::max);
            for e in 0..cols {
                let (got, one, t) = (sa[r * cols + e], sb[r * cols + e], want[e]);
                if one.is_nan() || got.is_nan() {
                    assert!(
                        got.is_nan() && one.is_nan(),
                        "{what}[{e}]: {got} vs one-pass {one}"
                    );
                    continue;
                }
                assert!(
                    rel(got, t) <= 2.0 * one_pass + 4.0 * f32::EPSILON as f64,
                    "{what}[{e}]: stored {got:e}, one-pass {one:e}, f64 {t:e} (one-pass row error {one_pass:e})"
                );
                compared += 1;
            }
        }
    }
    assert!(compared > 15_000, "compared {compared} values");
}

#[test]
fn lse_store_helper_agrees_across_isas() {
    let isas = [wide::WideIsa::Avx2, wide::WideIsa::Avx512];
    for cols in [0, 1, 9, 64, 257, 3001] {
        for row in rows_of(cols, 11 + cols as u64) {
            let mut portable = row.clone();
            let p = wide::lse_store_row(None, &mut portable).unwrap();
            for isa in isas.into_iter().filter(|i| i.available()) {
                let mut xs = row.clone();
                let st = wide::lse_store_row(Some(isa), &mut xs).unwrap();
                assert!(
                    st[0].to_bits() == p[0].to_bits() || st[0].is_nan() && p[0].is_nan(),
                    "{isa:?} shift of {cols}: {st:?} vs {p:?}"
                );
                for (e, (a, b)) in xs.iter().zip(&portable).enumerate() {
                    // the exp is the Cranelift code's bits on every ISA
                    assert!(
                        a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(),
                        "{isa:?} exp[{e}] of {cols}: {a} vs {b}"
                    );
                }
                // sums of positive terms in another order: within n ulp
                let near = (st[1] - p[1]).abs() <= cols as f32 * f32::EPSILON * p[1];
                assert!(
                    near || st[1].is_nan() && p[1].is_nan(),
                    "{isa:?} sum of {cols}: {st:?} vs {p:?}"
                );
            }
        }
    }
}

#[test]
fn stored_exp_softmax_clif_snapshot() {
    let text = CpuJit::clif_text_wide(&kernel(Norm::Softmax, F32, Inner::Contiguous)).unwrap();
    insta::assert_snapshot!("stored_exp_softmax_clif", text);
}

/// `softmax(x * 0.125 + mask)` over rows (an attention score's softmax):
/// operands parts, out, x, mask.
fn scaled_masked_softmax() -> Kernel {
    let value = [
        Instr::Load(2),
        Instr::Const(0.125f64.to_bits()),
        Instr::Binary(BinaryOp::Mul, 0, 1),
        Instr::Load(3),
        Instr::Binary(BinaryOp::Add, 2, 3),
    ];
    let epilogue = [
        Instr::Acc,
        Instr::AccPart(AccPart::Shift),
        Instr::AccPart(AccPart::LogSum),
    ];
    // the row pass recomputes the value (ids 8..=12), then its exp
    let first = value.len() + epilogue.len();
    let mut rows = value.to_vec();
    for i in &mut rows {
        if let Instr::Binary(_, a, b) = i {
            (*a, *b) = (*a + first, *b + first);
        }
    }
    let v = first + 4;
    rows.extend([
        Instr::Binary(BinaryOp::Sub, v, 6),
        Instr::Binary(BinaryOp::Sub, v + 1, 7),
        Instr::Unary(UnaryOp::Exp, v + 2),
    ]);
    let typed = |is: &[Instr]| is.iter().map(|&i| (i, F32)).collect();
    Kernel {
        name: "scaled_masked_softmax".into(),
        rank: 2,
        operands: vec![
            op(F32, Inner::Broadcast),
            op(F32, Inner::Contiguous),
            op(F32, Inner::Contiguous),
            op(F32, Inner::Contiguous),
        ],
        scalars: vec![],
        body: typed(&value),
        reduce: Some(Reduction {
            kind: ReduceKind::LogSumExp,
            value: 4,
            dtype: F32,
        }),
        epilogue: typed(&epilogue),
        out: 6,
        extra_out: vec![7],
        rows: Some(RowPass {
            instrs: typed(&rows),
            out: first + rows.len() - 1,
        }),
    }
}

/// A softmax fed by steps alone stores its value row with the chain
/// helper (`NO_OP`): the same bits as the f32x4 loop it replaces, on rows
/// shorter and longer than a tile, with and without a tail. The snapshot
/// shows the call (a `ChainRow` of launch 0: never streamed).
#[test]
fn steps_before_a_softmax_row_run_as_a_chain_with_the_same_bits() {
    let k = scaled_masked_softmax();
    let jit = |u: Uses| {
        let mut j = CpuJit::new().unwrap();
        j.set_wide_uses(u);
        j
    };
    let mut with = jit(Uses::all(true));
    let mut without = jit(Uses {
        chains: false,
        ..Uses::all(true)
    });
    insta::assert_snapshot!(
        "scaled_masked_softmax_clif",
        CpuJit::clif_text_wide(&k).unwrap()
    );
    if with.wide_isa().is_none() {
        return; // no wide ISA: neither build calls a helper
    }
    let (a, b) = (with.compile(&k).unwrap(), without.compile(&k).unwrap());
    for cols in [255, 256, 257, 1024, 3001] {
        let rows = rows_of(cols, 21 + cols as u64);
        let n = rows.len();
        let x = rows.concat();
        let mask: Vec<f32> = (0..n * cols)
            .map(|i| {
                if i % 5 == 2 {
                    f32::NEG_INFINITY
                } else {
                    (i % 13) as f32 * 0.25
                }
            })
            .collect();
        let run = |ck: &CompiledKernel| {
            let (mut parts, mut out) = (vec![0f32; n * 2], vec![0f32; n * cols]);
            let (mut xs, mut ms) = (x.clone(), mask.clone());
            let ptrs = [
                parts.as_mut_ptr(),
                out.as_mut_ptr(),
                xs.as_mut_ptr(),
                ms.as_mut_ptr(),
            ]
            .map(|p| p as *mut u8);
            let c = cols as isize;
            // SAFETY: the buffers cover every index.
            unsafe { ck.call(&ptrs, &[2, 0, c, 1, c, 1, c, 1], &[n, cols], &[], 0, n) };
            (parts, out)
        };
        let (got, want) = (run(&a), run(&b));
        let same = |p: &[f32], q: &[f32]| {
            p.iter()
                .zip(q)
                .all(|(u, v)| u.to_bits() == v.to_bits() || u.is_nan() && v.is_nan())
        };
        assert!(same(&got.0, &want.0), "parts of {cols} columns differ");
        assert!(same(&got.1, &want.1), "softmax of {cols} columns differs");
        assert!(got.1.iter().any(|v| *v > 0.0 && v.is_finite()));
    }
}
