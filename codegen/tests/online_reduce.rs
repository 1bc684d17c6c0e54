//! The one-pass reductions (online log-sum-exp, Welford): the interpreter
//! against f64 references with PyTorch's edge cases, and compiled kernels
//! (vector lanes merged at the end) against the interpreter, with every part
//! of the result stored as a tuple.

mod common;

use common::*;
use kiln_codegen::AccPart;

/// `reduce kind %0` over the last dim of a `[rows, n]` f32/f64 input, storing
/// for lse `(acc, acc.shift, acc.logsum)` and for welford
/// `(acc.mean, acc, rsqrt(acc + 1e-5))`.
fn kernel(kind: ReduceKind, dt: DType, inner: Inner, rank: usize) -> Kernel {
    let mut b = KernelBuilder::default();
    let x = b.load(1, dt);
    let mut epi = KernelBuilder::default();
    let acc = epi.push(Instr::Acc, dt);
    let outs = if kind == ReduceKind::LogSumExp {
        let s = epi.push(Instr::AccPart(AccPart::Shift), dt);
        let l = epi.push(Instr::AccPart(AccPart::LogSum), dt);
        vec![acc, s, l]
    } else {
        let m = epi.push(Instr::AccPart(AccPart::Mean), dt);
        let eps = epi.constant(1e-5, dt);
        let ve = epi.binary(BinaryOp::Add, acc, eps, dt);
        let r = epi.unary(UnaryOp::Rsqrt, ve, dt);
        vec![m, acc, r]
    };
    let nb = b.instrs.len();
    Kernel {
        name: kind.name().into(),
        rank,
        operands: vec![op(dt, Inner::Broadcast), op(dt, inner)],
        scalars: vec![],
        body: b.instrs,
        reduce: Some(Reduction {
            kind,
            value: x,
            dtype: dt,
        }),
        epilogue: shift_ids(epi.instrs, nb),
        out: outs[0] + nb,
        extra_out: outs[1..].iter().map(|v| v + nb).collect(),
        rows: None,
    }
}

/// Renumbers epilogue instructions built from 0 to start after the body.
fn shift_ids(instrs: Vec<(Instr, DType)>, nb: usize) -> Vec<(Instr, DType)> {
    instrs
        .into_iter()
        .map(|(i, d)| {
            let i = match i {
                Instr::Unary(op, a) => Instr::Unary(op, a + nb),
                Instr::Binary(op, a, b) => Instr::Binary(op, a + nb, b + nb),
                other => other,
            };
            (i, d)
        })
        .collect()
}

/// Runs `k` on contiguous `rows` with the interpreter (or the JIT) and returns the 3-tuples.
fn run(k: &Kernel, rows: &[Vec<f64>], jit: bool) -> Vec<[f64; 3]> {
    let n = rows[0].len();
    let dt = k.operands[1].dtype;
    let mut input = vec![0u8; rows.len() * n * dt.size()];
    for (i, v) in rows.iter().flatten().enumerate() {
        Val::F(*v).write_le_bytes(dt, &mut input[i * dt.size()..]);
    }
    let mut out = vec![0u8; rows.len() * 3 * dt.size()];
    let ptrs = [out.as_mut_ptr(), input.as_mut_ptr()];
    let strides = [3, 0, n as isize, 1];
    let sizes = [rows.len(), n];
    unsafe {
        if jit {
            compile(k).call(&ptrs, &strides, &sizes, &[], 0, rows.len());
        } else {
            run_kernel(k, &ptrs, &strides, &sizes, &[], 0, rows.len());
        }
    }
    (0..rows.len())
        .map(|r| {
            std::array::from_fn(|t| {
                Val::from_le_bytes(&out[(r * 3 + t) * dt.size()..], dt).as_f64()
            })
        })
        .collect()
}

/// PyTorch's logsumexp: max, masked to 0 where infinite, log(sum(exp(x - m))) + m.
fn torch_lse(xs: &[f64]) -> f64 {
    let m = xs.iter().fold(f64::NEG_INFINITY, |a, &b| {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.max(b)
        }
    });
    let c = if m.is_infinite() { 0.0 } else { m };
    xs.iter().map(|x| (x - c).exp()).sum::<f64>().ln() + c
}

/// PyTorch's softmax of the row (NaN rows when the max is infinite).
fn torch_softmax(xs: &[f64]) -> Vec<f64> {
    let m = xs.iter().fold(f64::NEG_INFINITY, |a, &b| {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.max(b)
        }
    });
    let s: f64 = xs.iter().map(|x| (x - m).exp()).sum();
    xs.iter().map(|x| (x - m).exp() / s).collect()
}

/// `x` as stored in `dt`.
fn round(x: f64, dt: DType) -> f64 {
    if dt == F32 {
        x as f32 as f64
    } else {
        x
    }
}

fn same(a: f64, b: f64, tol: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol * (1.0 + b.abs())
}

const INF: f64 = f64::INFINITY;

/// Edge rows, each padded to `n` with `pad` (so long rows take the vector path).
fn edge_rows(n: usize) -> Vec<Vec<f64>> {
    let mut rng = 7u64;
    let mut rand = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64 * 6.0 - 3.0
    };
    let base: Vec<f64> = (0..n).map(|_| rand()).collect();
    let with = |i: usize, v: f64| {
        let mut r = base.clone();
        r[i % n] = v;
        r
    };
    vec![
        base.clone(),
        vec![-INF; n],
        with(n / 2, INF),
        with(n - 1, f64::NAN),
        with(0, -INF),
        {
            let mut r = vec![-INF; n];
            r[n / 3] = 2.5;
            r
        },
        {
            let mut r = with(1, INF);
            r[n / 2] = INF;
            r
        },
        base.iter().map(|x| x * 3e3 + 1e4).collect(),
        vec![f32::MIN as f64; n],
    ]
}

#[test]
fn lse_matches_pytorch_semantics() {
    for dt in [F32, F64] {
        for n in [1, 2, 7, 37, 1000] {
            let k = kernel(ReduceKind::LogSumExp, dt, Inner::Contiguous, 2);
            let rows = edge_rows(n);
            let tol = if dt == F32 { 2e-6 } else { 1e-13 };
            for jit in [false, true] {
                let got = run(&k, &rows, jit);
                for (row, g) in rows.iter().zip(&got) {
                    let row: &Vec<f64> = &row.iter().map(|&x| round(x, dt)).collect();
                    let want = torch_lse(row);
                    assert!(
                        same(g[0], want, tol),
                        "{dt} n={n} jit={jit}: lse {} vs {want}\n{row:?}",
                        g[0]
                    );
                    // softmax from the parts, as the decomposition computes it
                    let sm = torch_softmax(row);
                    for (x, w) in row.iter().zip(&sm) {
                        let p = ((x - g[1]) - g[2]).exp();
                        assert!(
                            same(p, *w, 20.0 * tol),
                            "{dt} n={n} jit={jit}: softmax {p} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn welford_matches_two_pass() {
    for dt in [F32, F64] {
        for n in [1, 2, 7, 37, 1000] {
            let k = kernel(ReduceKind::Welford, dt, Inner::Contiguous, 2);
            let mut rows = edge_rows(n);
            rows.truncate(1);
            // mean/std ~ 600: Welford keeps ~5 digits in f32, sum-of-squares ~2
            rows.push(rows[0].iter().map(|x| x + 1e3).collect());
            rows.push(vec![5.0; n]);
            rows.push({
                let mut r = rows[0].clone();
                r[n / 2] = f64::NAN;
                r
            });
            let tol = if dt == F32 { 1e-4 } else { 1e-10 };
            for jit in [false, true] {
                for (row, g) in rows.iter().zip(run(&k, &rows, jit)) {
                    let row: Vec<f64> = row.iter().map(|&x| round(x, dt)).collect();
                    let mean = row.iter().sum::<f64>() / n as f64;
                    let var = row.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
                    assert!(same(g[0], mean, tol), "{dt} n={n}: mean {} vs {mean}", g[0]);
                    assert!(
                        same(g[1], var, tol),
                        "{dt} n={n} jit={jit}: var {} vs {var}",
                        g[1]
                    );
                    assert!(g[1].is_nan() || g[1] >= 0.0);
                }
            }
        }
    }
}

#[test]
fn empty_rows() {
    for (kind, want) in [
        (ReduceKind::LogSumExp, [-INF, f32::MIN as f64, -INF]),
        (ReduceKind::Welford, [f64::NAN, f64::NAN, f64::NAN]),
    ] {
        let k = kernel(kind, F32, Inner::Contiguous, 2);
        for jit in [false, true] {
            let mut out = [7f32; 6];
            let input = [0f32; 1];
            let ptrs = [out.as_mut_ptr() as *mut u8, input.as_ptr() as *mut u8];
            let (strides, sizes) = ([3, 0, 0, 1], [2, 0]);
            unsafe {
                if jit {
                    compile(&k).call(&ptrs, &strides, &sizes, &[], 0, 2);
                } else {
                    run_kernel(&k, &ptrs, &strides, &sizes, &[], 0, 2);
                }
            }
            for (g, w) in out.iter().zip(want.iter().cycle()) {
                assert!(same(*g as f64, *w, 0.0), "{kind} jit={jit}: {out:?}");
            }
        }
    }
}

/// Compiled against the interpreter over layouts, ranks and random data (with edge values for lse).
#[test]
fn compiled_vs_interp() {
    let mut rng = Rng(11);
    for kind in [ReduceKind::LogSumExp, ReduceKind::Welford] {
        for dt in [F32, F64] {
            for (lay, rank) in [
                (Layout::Contiguous, 1),
                (Layout::Contiguous, 2),
                (Layout::Permuted, 2),
                (Layout::OuterBroadcast, 3),
                (Layout::Broadcast, 2),
            ] {
                let shapes: Vec<Vec<usize>> = match rank {
                    1 => vec![vec![0], vec![1], vec![7], vec![37], vec![1000]],
                    2 => vec![
                        vec![3, 13],
                        vec![5, 8],
                        vec![2, 0],
                        vec![4, 1],
                        vec![2, 67],
                        vec![3, 1024],
                    ],
                    _ => vec![vec![2, 3, 17], vec![3, 2, 9]],
                };
                for sizes in shapes {
                    let outer = &sizes[..rank - 1];
                    let (ost, olen) = layout(outer, Layout::Contiguous);
                    let mut ost: Vec<isize> = ost.iter().map(|s| s * 3).collect();
                    ost.push(0);
                    let (st, len) = layout(&sizes, lay);
                    let k = kernel(kind, dt, inner_of(&st), rank);
                    let edges = kind == ReduceKind::LogSumExp;
                    let views = vec![
                        (ost, vec![0u8; olen.max(1) * 3 * dt.size()]),
                        (st, gen(&mut rng, dt, len, -3.0, 3.0, edges)),
                    ];
                    let t = match dt {
                        F32 => Tol {
                            rtol: 1e-5,
                            atol: 1e-5,
                        },
                        _ => Tol {
                            rtol: 1e-12,
                            atol: 1e-12,
                        },
                    };
                    check(&k, &sizes, &views, &[], &t);
                }
            }
        }
    }
}

#[test]
fn contiguous_rows_run_on_vectors() {
    for kind in [ReduceKind::LogSumExp, ReduceKind::Welford] {
        assert_eq!(compile(&kernel(kind, F32, Inner::Contiguous, 2)).lanes, 4);
        assert_eq!(compile(&kernel(kind, F64, Inner::Contiguous, 2)).lanes, 2);
        assert_eq!(compile(&kernel(kind, F32, Inner::Strided, 2)).lanes, 1);
    }
}

#[test]
fn validation() {
    let mut k = kernel(ReduceKind::Welford, F32, Inner::Contiguous, 2);
    k.epilogue[1].0 = Instr::AccPart(AccPart::Shift);
    let e = kiln_codegen::interp::validate(&k).unwrap_err().to_string();
    assert!(e.contains("acc.shift") && e.contains("lse"), "{e}");
    let mut k = kernel(ReduceKind::LogSumExp, F32, Inner::Contiguous, 2);
    k.reduce.as_mut().unwrap().dtype = I64;
    assert!(kiln_codegen::interp::validate(&k).is_err());
    let text = kernel(ReduceKind::LogSumExp, F32, Inner::Contiguous, 2).to_text();
    assert!(text.contains("reduce lse %0 over dim 1 : f32"), "{text}");
    assert!(
        text.contains("= acc.logsum : f32") && text.contains("store %1, %2, %3"),
        "{text}"
    );
}
