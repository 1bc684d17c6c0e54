//! Shared harness of the compiled-vs-interpreter tests: random data with
//! edge values, layouts, NaN-aware comparison, and the checking loop.
#![allow(dead_code, unused_imports)]

pub use kiln_codegen::cpu::CpuJit;
pub use kiln_codegen::interp::run_kernel;
pub use kiln_codegen::{Inner, Instr, Kernel, KernelBuilder, Operand, Reduction};
pub use kiln_ir::interp::Val;
pub use kiln_ir::{BinaryOp, DType, Float, ReduceKind, UnaryOp};
pub use std::sync::Mutex;
pub use DType::*;

pub mod multi_out;
pub mod row_pass;

pub static JIT: Mutex<Option<CpuJit>> = Mutex::new(None);

pub fn compile(k: &Kernel) -> kiln_codegen::cpu::CompiledKernel {
    let mut g = JIT.lock().unwrap_or_else(|e| e.into_inner());
    let jit = g.get_or_insert_with(|| CpuJit::new().unwrap());
    jit.compile(k)
        .unwrap_or_else(|e| panic!("{e}\n{}", k.to_text()))
}

pub struct Rng(pub u64);
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

pub const EDGES: [f64; 19] = [
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
pub fn gen(rng: &mut Rng, dt: DType, n: usize, lo: f64, hi: f64, edges: bool) -> Vec<u8> {
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
pub enum Layout {
    Contiguous,
    /// innermost stride 0 and dim 0 stride 0
    Broadcast,
    /// the dims in reverse order in storage (a permuted view)
    Permuted,
    /// broadcast along dim 0 only, contiguous innermost
    OuterBroadcast,
}

/// Strides (elements) and storage length of a view of `sizes`.
pub fn layout(sizes: &[usize], l: Layout) -> (Vec<isize>, usize) {
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

pub fn inner_of(st: &[isize]) -> Inner {
    st.last()
        .map(|&s| Inner::of_stride(s))
        .unwrap_or(Inner::Contiguous)
}

pub struct Tol {
    pub rtol: f64,
    pub atol: f64,
}
pub const EXACT: Tol = Tol {
    rtol: 0.0,
    atol: 0.0,
};
pub const F32TOL: Tol = Tol {
    rtol: 1e-5,
    atol: 1e-6,
};
pub const F64TOL: Tol = Tol {
    rtol: 1e-12,
    atol: 1e-300,
};

/// One unit in the last place of f16 (relative, or the smallest subnormal).
pub const F16TOL: Tol = Tol {
    rtol: 1e-3,
    atol: 6e-8,
};
/// One unit in the last place of bf16.
pub const BF16TOL: Tol = Tol {
    rtol: 8e-3,
    atol: 1e-38,
};

pub fn tol_for(dt: DType) -> Tol {
    match dt {
        F32 => F32TOL,
        F64 => F64TOL,
        F16 => F16TOL,
        BF16 => BF16TOL,
        _ => EXACT,
    }
}

pub fn close(a: Val, b: Val, t: &Tol) -> bool {
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
pub fn check(
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

/// A pointwise kernel (output operand 0, no reduction) storing `out`.
pub fn pointwise_kernel(
    name: &str,
    rank: usize,
    operands: Vec<Operand>,
    scalars: Vec<DType>,
    body: Vec<(Instr, DType)>,
    out: usize,
) -> Kernel {
    Kernel::pointwise(name, rank, operands, scalars, body, out)
}

pub fn op(dtype: DType, inner: Inner) -> Operand {
    Operand { dtype, inner }
}

pub fn shapes(rank: usize) -> Vec<Vec<usize>> {
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
pub fn pointwise(
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
        let k = pointwise_kernel("t", rank, operands, vec![], b.instrs.clone(), out);
        check(&k, &sizes, &views, &[], t);
    }
}
