//! The Cranelift backend against the KernelIR interpreter: every unary and
//! binary op, every reduction, casts, several dtypes, contiguous / broadcast /
//! strided (permuted) layouts, rank 0..4, odd sizes (vector tails) and thread
//! splits of dim 0. NaN-aware, within f32 rtol 1e-5 / atol 1e-6.

mod common;

use common::*;
use kiln_ir::op::{BinaryDtype, UnaryDtype};
/// Every float unary op of the table, then a few non-default attributes.
fn all_unary() -> Vec<UnaryOp> {
    use UnaryOp::*;
    let mut v: Vec<UnaryOp> = UnaryOp::EXAMPLES
        .into_iter()
        .filter(|u| !matches!(u.dtype_rule(), UnaryDtype::Bool | UnaryDtype::Integer))
        .collect();
    v.extend([
        Softplus {
            beta: Float(2.0),
            threshold: Float(10.0),
        },
        Elu { alpha: Float(0.5) },
    ]);
    v
}

#[test]
fn unary_float_ops() {
    let layouts = [
        (1, Layout::Contiguous),
        (2, Layout::Contiguous),
        (2, Layout::Permuted),
        (3, Layout::Permuted),
        (2, Layout::Broadcast),
        (4, Layout::OuterBroadcast),
        (0, Layout::Contiguous),
    ];
    for (n, uop) in all_unary().into_iter().enumerate() {
        for dt in [F32, F64] {
            for &(rank, l) in &layouts {
                let body = |b: &mut KernelBuilder| {
                    let x = b.load(1, dt);
                    b.unary(uop, x, dt)
                };
                pointwise(
                    &body,
                    &[dt],
                    dt,
                    &[l],
                    rank,
                    (-10.0, 10.0),
                    &tol_for(dt),
                    7 + n as u64,
                );
            }
        }
    }
}

#[test]
fn unary_int_ops() {
    use UnaryOp::*;
    let keep = UnaryOp::EXAMPLES
        .into_iter()
        .filter(|u| matches!(u.dtype_rule(), UnaryDtype::Keep | UnaryDtype::KeepNoBool));
    for uop in keep {
        for dt in [I64, I32, I16, I8, U8] {
            for (rank, l) in [(1, Layout::Contiguous), (2, Layout::Permuted)] {
                let body = |b: &mut KernelBuilder| {
                    let x = b.load(1, dt);
                    b.unary(uop, x, dt)
                };
                pointwise(&body, &[dt], dt, &[l], rank, (0.0, 0.0), &EXACT, 3);
            }
        }
    }
    let body = |b: &mut KernelBuilder| {
        let x = b.load(1, Bool);
        b.unary(Not, x, Bool)
    };
    pointwise(
        &body,
        &[Bool],
        Bool,
        &[Layout::Contiguous],
        2,
        (0.0, 0.0),
        &EXACT,
        5,
    );
}

/// Every binary op of the table whose operands may be any numeric dtype.
fn all_binary() -> Vec<BinaryOp> {
    BinaryOp::ALL
        .into_iter()
        .filter(|b| {
            use BinaryDtype::*;
            matches!(b.dtype_rule(), Promote | PromoteNoBool | TrueDiv | Compare)
        })
        .collect()
}

#[test]
fn binary_ops() {
    let layouts = [
        (1, [Layout::Contiguous, Layout::Contiguous]),
        (2, [Layout::Contiguous, Layout::Broadcast]),
        (2, [Layout::Broadcast, Layout::Contiguous]),
        (3, [Layout::Permuted, Layout::Contiguous]),
        (4, [Layout::OuterBroadcast, Layout::Permuted]),
        (0, [Layout::Contiguous, Layout::Contiguous]),
    ];
    for (n, bop) in all_binary().into_iter().enumerate() {
        for dt in [F32, F64, I64, I32, I16, I8, U8] {
            let out_dt = if bop.is_comparison() { Bool } else { dt };
            for &(rank, l) in &layouts {
                let body = |b: &mut KernelBuilder| {
                    let x = b.load(1, dt);
                    let y = b.load(2, dt);
                    b.binary(bop, x, y, out_dt)
                };
                let range = if bop == BinaryOp::Pow {
                    (-3.0, 3.0)
                } else {
                    (-10.0, 10.0)
                };
                pointwise(
                    &body,
                    &[dt, dt],
                    out_dt,
                    &l,
                    rank,
                    range,
                    &tol_for(out_dt),
                    11 + n as u64,
                );
            }
        }
    }
    for bop in [
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Maximum,
    ] {
        let body = |b: &mut KernelBuilder| {
            let x = b.load(1, Bool);
            let y = b.load(2, Bool);
            b.binary(bop, x, y, Bool)
        };
        pointwise(
            &body,
            &[Bool, Bool],
            Bool,
            &[Layout::Contiguous, Layout::Broadcast],
            2,
            (0.0, 0.0),
            &EXACT,
            2,
        );
    }
}

/// The CPU JIT has no f16/bf16 (its callers widen half tensors to f32), and
/// says so instead of computing in the wrong type.
#[test]
fn cpu_jit_rejects_half_operands() {
    for dt in [F16, BF16] {
        let mut b = KernelBuilder::default();
        let x = b.load(1, dt);
        let y = b.unary(UnaryOp::Neg, x, F32);
        let k = pointwise_kernel(
            "neg",
            1,
            vec![op(F32, Inner::Contiguous), op(dt, Inner::Contiguous)],
            vec![],
            b.instrs,
            y,
        );
        let mut g = JIT.lock().unwrap_or_else(|e| e.into_inner());
        let jit = g.get_or_insert_with(|| CpuJit::new().unwrap());
        let e = jit.compile(&k).map(|_| ()).expect_err("half rejected");
        let e = e.to_string();
        assert!(e.contains("must be widened to f32"), "{e}");
    }
}

#[test]
fn casts_between_all_dtypes() {
    let dts = [F32, F64, I64, I32, I16, I8, U8, Bool];
    for &from in &dts {
        for &to in &dts {
            let body = |b: &mut KernelBuilder| {
                let x = b.load(1, from);
                b.push(Instr::Cast(x), to)
            };
            // floats across the integer ranges (and edges), to exercise truncation and wrapping
            pointwise(
                &body,
                &[from],
                to,
                &[Layout::Contiguous],
                1,
                (-400.0, 400.0),
                &EXACT,
                17,
            );
            pointwise(
                &body,
                &[from],
                to,
                &[Layout::Permuted],
                2,
                (-3e9, 3e9),
                &EXACT,
                19,
            );
        }
    }
}

#[test]
fn where_and_mixed_dtypes() {
    // out(f32) = where(a > b, a * 2, cast(c: i32)) with c strided
    let body = |b: &mut KernelBuilder| {
        let x = b.load(1, F32);
        let y = b.load(2, F32);
        let c = b.load(3, I32);
        let gt = b.binary(BinaryOp::Gt, x, y, Bool);
        let two = b.constant(2.0, F32);
        let x2 = b.binary(BinaryOp::Mul, x, two, F32);
        let cf = b.cast(c, F32);
        b.select(gt, x2, cf, F32)
    };
    for rank in 1..=3 {
        pointwise(
            &body,
            &[F32, F32, I32],
            F32,
            &[Layout::Contiguous, Layout::Broadcast, Layout::Permuted],
            rank,
            (-5.0, 5.0),
            &F32TOL,
            23,
        );
    }
    // vectorised where with a bool -> float cast: out = (x > 0) * x + where(x < y, y, x)
    let body = |b: &mut KernelBuilder| {
        let x = b.load(1, F64);
        let y = b.load(2, F64);
        let zero = b.constant(0.0, F64);
        let pos = b.binary(BinaryOp::Gt, x, zero, Bool);
        let pf = b.cast(pos, F64);
        let m = b.binary(BinaryOp::Mul, pf, x, F64);
        let lt = b.binary(BinaryOp::Lt, x, y, Bool);
        let w = b.select(lt, y, x, F64);
        b.binary(BinaryOp::Add, m, w, F64)
    };
    pointwise(
        &body,
        &[F64, F64],
        F64,
        &[Layout::Contiguous, Layout::OuterBroadcast],
        2,
        (-5.0, 5.0),
        &F64TOL,
        29,
    );
}

/// A row reduction of `value(x)` over the last dim, epilogue `epi(acc)`.
#[test]
fn scalars_and_w1_chain() {
    // W1: gelu(x * a + b) * 0.5 + x, a and b runtime scalars
    let mut b = KernelBuilder::default();
    let x = b.load(1, F32);
    let a = b.scalar(0, F32);
    let c = b.scalar(1, F32);
    let xa = b.binary(BinaryOp::Mul, x, a, F32);
    let y = b.binary(BinaryOp::Add, xa, c, F32);
    let g = b.unary(UnaryOp::Gelu, y, F32);
    let h = b.constant(0.5, F32);
    let gh = b.binary(BinaryOp::Mul, g, h, F32);
    let out = b.binary(BinaryOp::Add, gh, x, F32);
    let mut rng = Rng(5);
    for n in [1usize, 7, 8, 9, 1001] {
        let k = pointwise_kernel(
            "w1",
            1,
            vec![op(F32, Inner::Contiguous), op(F32, Inner::Contiguous)],
            vec![F32, F32],
            b.instrs.clone(),
            out,
        );
        let views = vec![
            (vec![1], vec![0u8; 4 * n]),
            (vec![1], gen(&mut rng, F32, n, -6.0, 6.0, true)),
        ];
        check(
            &k,
            &[n],
            &views,
            &[1.5f64.to_bits(), (-0.25f64).to_bits()],
            &F32TOL,
        );
        assert_eq!(compile(&k).lanes, 4);
    }
    // integer and bool scalars
    let mut b = KernelBuilder::default();
    let x = b.load(1, I32);
    let s = b.scalar(0, I32);
    let o = b.binary(BinaryOp::Mul, x, s, I32);
    let k = pointwise_kernel(
        "iscale",
        2,
        vec![op(I32, Inner::Contiguous), op(I32, Inner::Strided)],
        vec![I32],
        b.instrs,
        o,
    );
    let (st, len) = layout(&[4, 5], Layout::Permuted);
    let views = vec![
        (layout(&[4, 5], Layout::Contiguous).0, vec![0u8; 80]),
        (st, gen(&mut rng, I32, len, 0.0, 0.0, false)),
    ];
    check(&k, &[4, 5], &views, &[(-3i64) as u64], &EXACT);
}

#[test]
fn row_invariant_values_match_interp() {
    // x * sigmoid(s * a) + where(s > 0, exp(s), x), s one value per row (a
    // squeeze-excite gate's [N, C, 1, 1]), a a scalar: the sigmoid, exp and
    // comparison are computed once per row (`loops::hoisted`), in the vector
    // loop, the scalar tail and the wide tiles alike; each row must see its own s
    let mut b = KernelBuilder::default();
    let x = b.load(1, F32);
    let s = b.load(2, F32);
    let a = b.scalar(0, F32);
    let sa = b.binary(BinaryOp::Mul, s, a, F32);
    let g = b.unary(UnaryOp::Sigmoid, sa, F32);
    let xg = b.binary(BinaryOp::Mul, x, g, F32);
    let zero = b.constant(0.0, F32);
    let pos = b.binary(BinaryOp::Gt, s, zero, Bool);
    let e = b.unary(UnaryOp::Exp, s, F32);
    let pick = b.select(pos, e, x, F32);
    let out = b.binary(BinaryOp::Add, xg, pick, F32);
    let k = pointwise_kernel(
        "gate",
        2,
        vec![
            op(F32, Inner::Contiguous),
            op(F32, Inner::Contiguous),
            op(F32, Inner::Broadcast),
        ],
        vec![F32],
        b.instrs.clone(),
        out,
    );
    let mut rng = Rng(11);
    for n in [1usize, 7, 9, 300, 1001] {
        let rows = 5;
        let views = vec![
            (vec![n as isize, 1], vec![0u8; 4 * rows * n]),
            (
                vec![n as isize, 1],
                gen(&mut rng, F32, rows * n, -4.0, 4.0, true),
            ),
            (vec![1, 0], gen(&mut rng, F32, rows, -3.0, 3.0, true)),
        ];
        check(&k, &[rows, n], &views, &[0.75f64.to_bits()], &F32TOL);
    }
}

/// Dense sweeps of each f32 transcendental against the interpreter: prints the
/// worst errors (the accuracy figures) and asserts the tolerance.
#[test]
fn accuracy_sweeps() {
    use UnaryOp::*;
    let cases: Vec<(UnaryOp, f64, f64)> = vec![
        (Exp, -104.0, 89.0),
        (Log, 1e-38, 3e38),
        (Log1p, -0.999, 1e6),
        (Expm1, -20.0, 20.0),
        (Tanh, -10.0, 10.0),
        (Erf, -5.0, 5.0),
        (Sigmoid, -30.0, 30.0),
        (Gelu, -10.0, 10.0),
        (GeluTanh, -10.0, 10.0),
        (Silu, -30.0, 30.0),
        (
            Softplus {
                beta: Float(1.0),
                threshold: Float(20.0),
            },
            -30.0,
            30.0,
        ),
        (Elu { alpha: Float(1.0) }, -20.0, 5.0),
        (Sin, -1e4, 1e4),
        (Cos, -1e4, 1e4),
        (Sqrt, 0.0, 1e6),
    ];
    let n = 200_003;
    for (uop, lo, hi) in cases {
        let xs: Vec<f32> = (0..n)
            .map(|i| {
                let t = i as f64 / (n - 1) as f64;
                let v = if uop == Log {
                    (lo.ln() + t * (hi.ln() - lo.ln())).exp()
                } else {
                    lo + t * (hi - lo)
                };
                v as f32
            })
            .collect();
        let mut b = KernelBuilder::default();
        let x = b.load(1, F32);
        let out = b.unary(uop, x, F32);
        let k = pointwise_kernel(
            "sweep",
            1,
            vec![op(F32, Inner::Contiguous), op(F32, Inner::Contiguous)],
            vec![],
            b.instrs,
            out,
        );
        let ck = compile(&k);
        let mut got = vec![0f32; n];
        let mut want = vec![0f32; n];
        let mut ptrs = [got.as_mut_ptr() as *mut u8, xs.as_ptr() as *mut u8];
        unsafe { ck.call(&ptrs, &[1, 1], &[n], &[], 0, n) };
        ptrs[0] = want.as_mut_ptr() as *mut u8;
        unsafe { run_kernel(&k, &ptrs, &[1, 1], &[n], &[], 0, n) };
        let (mut max_abs, mut max_rel, mut worst) = (0f64, 0f64, 0f64);
        let mut max_score = 0f64;
        for i in 0..n {
            let (g, w) = (got[i] as f64, want[i] as f64);
            assert!(
                close(Val::F(g), Val::F(w), &F32TOL),
                "{uop}({}) = {g} want {w}",
                xs[i]
            );
            let e = (g - w).abs();
            max_abs = max_abs.max(e);
            if w.abs() > 1e-30 {
                max_rel = max_rel.max(e / w.abs());
            }
            let score = e / (1e-6 + 1e-5 * w.abs());
            if score > max_score {
                max_score = score;
                worst = xs[i] as f64;
            }
        }
        println!(
            "{:<40} max abs {max_abs:.2e}  max rel {max_rel:.2e}  worst/tol {max_score:.3} at x={worst}",
            uop.to_string()
        );
    }
}

/// W1 timing (print only): `cargo test -p kiln-codegen --release --test cpu_vs_interp -- --ignored --nocapture w1_timing`
#[test]
#[ignore]
fn w1_timing() {
    let mut b = KernelBuilder::default();
    let x = b.load(1, F32);
    let a = b.scalar(0, F32);
    let c = b.scalar(1, F32);
    let xa = b.binary(BinaryOp::Mul, x, a, F32);
    let y = b.binary(BinaryOp::Add, xa, c, F32);
    let g = b.unary(UnaryOp::Gelu, y, F32);
    let h = b.constant(0.5, F32);
    let gh = b.binary(BinaryOp::Mul, g, h, F32);
    let out = b.binary(BinaryOp::Add, gh, x, F32);
    let k = pointwise_kernel(
        "w1",
        1,
        vec![op(F32, Inner::Contiguous), op(F32, Inner::Contiguous)],
        vec![F32, F32],
        b.instrs,
        out,
    );
    let t0 = std::time::Instant::now();
    let ck = compile(&k);
    println!(
        "compile: {:.2} ms, {} bytes",
        t0.elapsed().as_secs_f64() * 1e3,
        ck.code_size
    );
    let n = 4 << 20;
    let xs: Vec<f32> = (0..n)
        .map(|i| ((i % 1000) as f32 - 500.0) / 100.0)
        .collect();
    let mut out = vec![0f32; n];
    let sc = [1.5f64.to_bits(), 0.1f64.to_bits()];
    let (po, px) = (out.as_mut_ptr() as usize, xs.as_ptr() as usize);
    for threads in [1usize, 2] {
        let mut best = f64::MAX;
        for _ in 0..20 {
            let t = std::time::Instant::now();
            std::thread::scope(|s| {
                for th in 0..threads {
                    let ck = &ck;
                    s.spawn(move || {
                        let ptrs = [po as *mut u8, px as *mut u8];
                        let (lo, hi) = (n * th / threads, n * (th + 1) / threads);
                        unsafe { ck.call(&ptrs, &[1, 1], &[n], &sc, lo, hi) };
                    });
                }
            });
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("W1 4M f32, {threads} thread(s): {:.3} ms", best * 1e3);
    }
}
