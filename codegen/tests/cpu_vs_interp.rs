//! The Cranelift backend against the KernelIR interpreter: every unary and
//! binary op, every reduction, casts, several dtypes, contiguous / broadcast /
//! strided (permuted) layouts, rank 0..4, odd sizes (vector tails) and thread
//! splits of dim 0. NaN-aware, within f32 rtol 1e-5 / atol 1e-6.

use kiln_codegen::cpu::CpuJit;
use kiln_codegen::interp::run_kernel;
use kiln_codegen::{Inner, Instr, Kernel, KernelBuilder, Operand, Reduction};
use kiln_ir::interp::Val;
use kiln_ir::{BinaryOp, DType, Float, ReduceKind, UnaryOp};
use std::sync::Mutex;
use DType::*;

static JIT: Mutex<Option<CpuJit>> = Mutex::new(None);

fn compile(k: &Kernel) -> kiln_codegen::cpu::CompiledKernel {
    let mut g = JIT.lock().unwrap_or_else(|e| e.into_inner());
    let jit = g.get_or_insert_with(|| CpuJit::new().unwrap());
    jit.compile(k)
        .unwrap_or_else(|e| panic!("{e}\n{}", k.to_text()))
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unif(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

const EDGES: [f64; 19] = [
    0.0,
    -0.0,
    1e-30,
    -1e-30,
    1e30,
    -1e30,
    88.0,
    -88.0,
    100.0,
    -100.0,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
    1.0,
    -1.0,
    0.5,
    -0.5,
    2.0,
    3.0,
];

/// Random storage of `n` elements of `dt` (floats in [lo, hi], a quarter edge values).
fn gen(rng: &mut Rng, dt: DType, n: usize, lo: f64, hi: f64, edges: bool) -> Vec<u8> {
    let mut out = vec![0u8; n * dt.size()];
    for i in 0..n {
        let v = if dt.is_float() {
            if edges && rng.next().is_multiple_of(4) {
                Val::F(EDGES[(rng.next() % EDGES.len() as u64) as usize])
            } else {
                Val::F(rng.unif(lo, hi))
            }
        } else if dt == Bool {
            Val::I((rng.next() % 2) as i64)
        } else {
            let (l, h) = if dt == U8 { (0, 255) } else { (-100, 100) };
            let mut v = l + (rng.next() % (h - l + 1) as u64) as i64;
            if rng.next().is_multiple_of(8) {
                v = [0, 1, -1, 127, -128][(rng.next() % 5) as usize];
            }
            Val::I(v)
        };
        v.write_le_bytes(dt, &mut out[i * dt.size()..]);
    }
    out
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    Contiguous,
    /// innermost stride 0 and dim 0 stride 0
    Broadcast,
    /// the dims in reverse order in storage (a permuted view)
    Permuted,
    /// broadcast along dim 0 only, contiguous innermost
    OuterBroadcast,
}

/// Strides (elements) and storage length of a view of `sizes`.
fn layout(sizes: &[usize], l: Layout) -> (Vec<isize>, usize) {
    let r = sizes.len();
    let mut st = vec![0isize; r];
    let order: Vec<usize> = match l {
        Layout::Permuted => (0..r).collect(),
        _ => (0..r).rev().collect(),
    };
    let mut acc = 1isize;
    for &d in &order {
        let zero = match l {
            Layout::Broadcast => d == r - 1 || d == 0,
            Layout::OuterBroadcast => d == 0 && r > 1,
            _ => false,
        };
        if !zero {
            st[d] = acc;
            acc *= sizes[d].max(1) as isize;
        }
    }
    (st, acc as usize)
}

fn inner_of(st: &[isize]) -> Inner {
    st.last()
        .map(|&s| Inner::of_stride(s))
        .unwrap_or(Inner::Contiguous)
}

struct Tol {
    rtol: f64,
    atol: f64,
}
const EXACT: Tol = Tol {
    rtol: 0.0,
    atol: 0.0,
};
const F32TOL: Tol = Tol {
    rtol: 1e-5,
    atol: 1e-6,
};
const F64TOL: Tol = Tol {
    rtol: 1e-12,
    atol: 1e-300,
};

fn tol_for(dt: DType) -> Tol {
    match dt {
        F32 => F32TOL,
        F64 => F64TOL,
        _ => EXACT,
    }
}

fn close(a: Val, b: Val, t: &Tol) -> bool {
    let (x, y) = (a.as_f64(), b.as_f64());
    if x.is_nan() || y.is_nan() {
        return x.is_nan() && y.is_nan();
    }
    if y.is_infinite() || x.is_infinite() {
        return x == y;
    }
    (x - y).abs() <= t.atol + t.rtol * y.abs()
}

/// Runs `k` with the interpreter and the JIT (dim 0 split in three calls) and compares.
/// `views[0]` is the output. Returns the number of elements compared.
fn check(
    k: &Kernel,
    sizes: &[usize],
    views: &[(Vec<isize>, Vec<u8>)],
    scalars: &[u64],
    t: &Tol,
) -> usize {
    let ck = compile(k);
    let out_dt = k.operands[0].dtype;
    let mut out_i = views[0].1.clone();
    let mut out_j = views[0].1.clone();
    let strides: Vec<isize> = views.iter().flat_map(|v| v.0.iter().copied()).collect();
    let n0 = if k.rank == 0 { 1 } else { sizes[0] };
    let ptrs = |out: &mut Vec<u8>| -> Vec<*mut u8> {
        std::iter::once(out.as_mut_ptr())
            .chain(views[1..].iter().map(|v| v.1.as_ptr() as *mut u8))
            .collect()
    };
    let pi = ptrs(&mut out_i);
    unsafe { run_kernel(k, &pi, &strides, sizes, scalars, 0, n0) };
    let pj = ptrs(&mut out_j);
    let cuts = [0, n0 / 3, (2 * n0) / 3, n0];
    for w in cuts.windows(2) {
        unsafe { ck.call(&pj, &strides, sizes, scalars, w[0], w[1]) };
    }
    let n = out_i.len() / out_dt.size();
    for e in 0..n {
        let a = Val::from_le_bytes(&out_j[e * out_dt.size()..], out_dt);
        let b = Val::from_le_bytes(&out_i[e * out_dt.size()..], out_dt);
        if !close(a, b, t) {
            let inputs: Vec<String> = views[1..]
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let dt = k.operands[i + 1].dtype;
                    let m = (v.1.len() / dt.size()).min(16);
                    let xs: Vec<f64> = (0..m)
                        .map(|j| Val::from_le_bytes(&v.1[j * dt.size()..], dt).as_f64())
                        .collect();
                    format!("in{}: {xs:?}", i + 1)
                })
                .collect();
            panic!(
                "element {e}: jit {a:?} vs interp {b:?} (sizes {sizes:?}, lanes {})\n{}\n{}",
                ck.lanes,
                k.to_text(),
                inputs.join("\n")
            );
        }
    }
    n
}

fn op(dtype: DType, inner: Inner) -> Operand {
    Operand { dtype, inner }
}

fn shapes(rank: usize) -> Vec<Vec<usize>> {
    match rank {
        0 => vec![vec![]],
        1 => vec![vec![1], vec![7], vec![37], vec![1000]],
        2 => vec![vec![3, 13], vec![5, 8], vec![2, 1]],
        3 => vec![vec![2, 3, 17], vec![3, 1, 9]],
        _ => vec![vec![2, 3, 2, 11]],
    }
}

/// out = f(in1 [, in2]) over every shape of `rank`, with in layouts as given.
#[allow(clippy::too_many_arguments)]
fn pointwise(
    body: &dyn Fn(&mut KernelBuilder) -> usize,
    in_dts: &[DType],
    out_dt: DType,
    layouts: &[Layout],
    rank: usize,
    range: (f64, f64),
    t: &Tol,
    seed: u64,
) {
    let mut b = KernelBuilder::default();
    let out = body(&mut b);
    let mut rng = Rng(seed | 1);
    for sizes in shapes(rank) {
        let mut views = vec![];
        let (ost, olen) = layout(&sizes, Layout::Contiguous);
        views.push((ost, vec![0u8; olen * out_dt.size()]));
        let mut operands = vec![op(out_dt, Inner::Contiguous)];
        for (i, &dt) in in_dts.iter().enumerate() {
            let (st, len) = layout(&sizes, layouts[i]);
            operands.push(op(dt, inner_of(&st)));
            views.push((st, gen(&mut rng, dt, len, range.0, range.1, true)));
        }
        let k = Kernel {
            name: "t".into(),
            rank,
            operands,
            scalars: vec![],
            body: b.instrs.clone(),
            reduce: None,
            epilogue: vec![],
            out,
        };
        check(&k, &sizes, &views, &[], t);
    }
}

fn all_unary() -> Vec<UnaryOp> {
    use UnaryOp::*;
    vec![
        Neg,
        Abs,
        Exp,
        Log,
        Log1p,
        Expm1,
        Sqrt,
        Rsqrt,
        Reciprocal,
        Square,
        Sin,
        Cos,
        Tanh,
        Erf,
        Floor,
        Sigmoid,
        Relu,
        Gelu,
        GeluTanh,
        Silu,
        Softplus {
            beta: Float(1.0),
            threshold: Float(20.0),
        },
        Softplus {
            beta: Float(2.0),
            threshold: Float(10.0),
        },
        LeakyRelu { slope: Float(0.01) },
        Elu { alpha: Float(1.0) },
        Elu { alpha: Float(0.5) },
    ]
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
    for uop in [Neg, Abs, Square, Relu] {
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

fn all_binary() -> Vec<BinaryOp> {
    use BinaryOp::*;
    vec![
        Add, Sub, Mul, Div, Pow, Maximum, Minimum, Remainder, Fmod, FloorDiv, Eq, Ne, Lt, Le, Gt,
        Ge,
    ]
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
fn reduction(
    kind: ReduceKind,
    dt: DType,
    acc_dt: DType,
    in_layout: Layout,
    rank: usize,
    softmax_body: bool,
    seed: u64,
) {
    let mut b = KernelBuilder::default();
    let x = b.load(1, dt);
    let value = if softmax_body {
        // exp(x - m) with m broadcast along the reduced dim
        let m = b.load(2, dt);
        let d = b.binary(BinaryOp::Sub, x, m, dt);
        b.unary(UnaryOp::Exp, d, dt)
    } else {
        x
    };
    let nb = b.instrs.len();
    let out_dt = if matches!(kind, ReduceKind::ArgMax | ReduceKind::ArgMin) {
        I64
    } else {
        acc_dt
    };
    let mut epilogue = vec![(Instr::Acc, acc_dt)];
    let mut out = nb;
    if softmax_body {
        // out = 1 / acc
        epilogue.push((Instr::Unary(UnaryOp::Reciprocal, nb), acc_dt));
        out = nb + 1;
    }
    let mut rng = Rng(seed | 1);
    let shapes: Vec<Vec<usize>> = match rank {
        1 => vec![vec![0], vec![1], vec![7], vec![37], vec![1000]],
        2 => vec![vec![3, 13], vec![5, 8], vec![2, 0], vec![4, 1], vec![2, 67]],
        _ => vec![vec![2, 3, 17], vec![3, 2, 9]],
    };
    for sizes in shapes {
        let outer = &sizes[..rank - 1];
        let (mut ost, olen) = layout(outer, Layout::Contiguous);
        ost.push(0);
        let mut views = vec![(ost, vec![0u8; olen * out_dt.size()])];
        let (st, len) = layout(&sizes, in_layout);
        let mut operands = vec![op(out_dt, Inner::Broadcast), op(dt, inner_of(&st))];
        let (lo, hi) = if softmax_body {
            (-20.0, 5.0)
        } else {
            (-3.0, 3.0)
        };
        let edges = !matches!(kind, ReduceKind::Sum | ReduceKind::Prod) && !softmax_body;
        views.push((st, gen(&mut rng, dt, len, lo, hi, edges)));
        if softmax_body {
            let (mut mst, mlen) = layout(outer, Layout::Contiguous);
            mst.push(0);
            operands.push(op(dt, Inner::Broadcast));
            views.push((mst, gen(&mut rng, dt, mlen, -1.0, 1.0, false)));
        }
        let k = Kernel {
            name: "r".into(),
            rank,
            operands,
            scalars: vec![],
            body: b.instrs.clone(),
            reduce: Some(Reduction {
                kind,
                value,
                dtype: acc_dt,
            }),
            epilogue: epilogue.clone(),
            out,
        };
        let t = match (kind, acc_dt) {
            (ReduceKind::Sum | ReduceKind::Prod, F32) => Tol {
                rtol: 1e-4,
                atol: 1e-4,
            },
            (ReduceKind::Sum | ReduceKind::Prod, F64) => Tol {
                rtol: 1e-12,
                atol: 1e-12,
            },
            _ => tol_for(out_dt),
        };
        check(&k, &sizes, &views, &[], &t);
    }
}

#[test]
fn reductions() {
    use ReduceKind::*;
    let mut seed = 1;
    for kind in [Sum, Prod, Max, Min, ArgMax, ArgMin] {
        for dt in [F32, F64, I64, I32, U8] {
            let acc = match kind {
                ArgMax | ArgMin => I64,
                Sum | Prod if !dt.is_float() => I64,
                _ => dt,
            };
            for (layout, rank) in [
                (Layout::Contiguous, 1),
                (Layout::Contiguous, 2),
                (Layout::Permuted, 2),
                (Layout::OuterBroadcast, 3),
                (Layout::Broadcast, 2),
            ] {
                seed += 1;
                reduction(kind, dt, acc, layout, rank, false, seed);
            }
        }
    }
    for dt in [F32, F64] {
        for rank in [1, 2, 3] {
            reduction(Sum, dt, dt, Layout::Contiguous, rank, true, 99);
            reduction(Max, dt, dt, Layout::Contiguous, rank, true, 98);
        }
    }
}

#[test]
fn argmax_first_index_and_nan() {
    let mut b = KernelBuilder::default();
    b.load(1, F32);
    let k = Kernel {
        name: "argmax".into(),
        rank: 1,
        operands: vec![op(I64, Inner::Broadcast), op(F32, Inner::Contiguous)],
        scalars: vec![],
        body: b.instrs,
        reduce: Some(Reduction {
            kind: ReduceKind::ArgMax,
            value: 0,
            dtype: I64,
        }),
        epilogue: vec![(Instr::Acc, I64)],
        out: 1,
    };
    let ck = compile(&k);
    for (xs, want) in [
        (vec![1.0f32, 3.0, 3.0, 2.0], 1i64),
        (vec![1.0, f32::NAN, 5.0, f32::NAN], 1),
        (vec![f32::NEG_INFINITY; 3], 0),
        (vec![], 0),
    ] {
        let mut out = -1i64;
        let ptrs = [&mut out as *mut i64 as *mut u8, xs.as_ptr() as *mut u8];
        unsafe { ck.call(&ptrs, &[0, 1], &[xs.len()], &[], 0, 1) };
        assert_eq!(out, want, "{xs:?}");
    }
}

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
        let k = Kernel {
            name: "w1".into(),
            rank: 1,
            operands: vec![op(F32, Inner::Contiguous), op(F32, Inner::Contiguous)],
            scalars: vec![F32, F32],
            body: b.instrs.clone(),
            reduce: None,
            epilogue: vec![],
            out,
        };
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
    let k = Kernel {
        name: "iscale".into(),
        rank: 2,
        operands: vec![op(I32, Inner::Contiguous), op(I32, Inner::Strided)],
        scalars: vec![I32],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out: o,
    };
    let (st, len) = layout(&[4, 5], Layout::Permuted);
    let views = vec![
        (layout(&[4, 5], Layout::Contiguous).0, vec![0u8; 80]),
        (st, gen(&mut rng, I32, len, 0.0, 0.0, false)),
    ];
    check(&k, &[4, 5], &views, &[(-3i64) as u64], &EXACT);
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
        let k = Kernel {
            name: "sweep".into(),
            rank: 1,
            operands: vec![op(F32, Inner::Contiguous), op(F32, Inner::Contiguous)],
            scalars: vec![],
            body: b.instrs,
            reduce: None,
            epilogue: vec![],
            out,
        };
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
    let k = Kernel {
        name: "w1".into(),
        rank: 1,
        operands: vec![op(F32, Inner::Contiguous), op(F32, Inner::Contiguous)],
        scalars: vec![F32, F32],
        body: b.instrs,
        reduce: None,
        epilogue: vec![],
        out,
    };
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
