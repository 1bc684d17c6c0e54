//! Whole-tile operations and the tile interpreter.
//!
//! The loops (`unary`, `binary`, ...) run one primitive over a tile of `n`
//! f32 lanes; they are generic over [`Lanes`] and always inlined into an
//! ISA's `#[target_feature]` entry points (`isa.rs`). [`TileOps`] implements
//! [`ScalarOps`] with a tile as its value, so [`lower_unary`] — the one
//! definition of gelu, sigmoid, ... that the interpreter, Cranelift and CUDA
//! share — runs here unchanged, one tile-wide primitive at a time, while the
//! transcendental primitives are single register-resident loops.

use super::lanes::Lanes;
use super::math;
use kiln_ir::scalar::{lower_unary, Cmp, Prim1, Prim2, ScalarOps};
use kiln_ir::{DType, UnaryOp};
use std::mem::MaybeUninit;

/// `N` tiles of scratch, cache-line aligned: an unaligned arena splits
/// every 64-byte AVX-512 store across two lines.
#[repr(C, align(64))]
pub(crate) struct Arena<const N: usize>(pub [MaybeUninit<[f32; TILE]>; N]);

impl<const N: usize> Arena<N> {
    pub fn new() -> Self {
        Arena([MaybeUninit::uninit(); N])
    }
    pub fn base(&mut self) -> *mut f32 {
        self.0.as_mut_ptr() as *mut f32
    }
}

/// Elements per tile: a few tiles of it stay in L1 beside the kernel's rows.
pub const TILE: usize = 256;
/// Intermediate tiles one lowering may use (gelu_tanh, the largest, needs 9).
const MAX_TILES: usize = 16;

/// A tile operand: `TILE`-sized memory, or one value in every lane.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Src {
    Tile(*const f32),
    Splat(f32),
}

#[inline(always)]
unsafe fn get<L: Lanes>(s: Src, i: usize) -> L::F {
    match s {
        Src::Tile(p) => L::load(p.add(i)),
        Src::Splat(v) => L::splat(v),
    }
}

#[inline(always)]
unsafe fn map1<L: Lanes>(x: Src, out: *mut f32, n: usize, f: impl Fn(L::F) -> L::F) {
    let mut i = 0;
    while i < n {
        L::store(out.add(i), f(get::<L>(x, i)));
        i += L::N;
    }
}

#[inline(always)]
unsafe fn map2<L: Lanes>(a: Src, b: Src, out: *mut f32, n: usize, f: impl Fn(L::F, L::F) -> L::F) {
    let mut i = 0;
    while i < n {
        L::store(out.add(i), f(get::<L>(a, i), get::<L>(b, i)));
        i += L::N;
    }
}

/// NaN-propagating max (`max`) or min, with -0 below +0 (Cranelift's fmax/fmin).
#[inline(always)]
fn max_min<L: Lanes>(a: L::F, b: L::F, max: bool) -> L::F {
    let pick = if max {
        L::cmp(Cmp::Gt, a, b)
    } else {
        L::cmp(Cmp::Lt, a, b)
    };
    let r = L::select(pick, a, b);
    let zeros = if max { L::and(a, b) } else { L::or(a, b) };
    let r = L::select(L::cmp(Cmp::Eq, a, b), zeros, r);
    let nan = L::cmp(Cmp::Ne, a, a);
    let nan = L::or(nan, L::cmp(Cmp::Ne, b, b));
    L::select(nan, L::add(a, b), r)
}

// `map1`/`map2` take fn items, never closures (see `compare`).
#[inline(always)]
fn is_zero<L: Lanes>(v: L::F) -> L::F {
    L::cmp(Cmp::Eq, v, L::splat(0.0))
}
#[inline(always)]
fn max<L: Lanes>(a: L::F, b: L::F) -> L::F {
    max_min::<L>(a, b, true)
}
#[inline(always)]
fn min<L: Lanes>(a: L::F, b: L::F) -> L::F {
    max_min::<L>(a, b, false)
}

/// `out = op(x)` over `n` lanes (`n` a multiple of `L::N`).
#[inline(always)]
pub(crate) unsafe fn unary<L: Lanes>(op: Prim1, x: Src, out: *mut f32, n: usize) {
    match op {
        Prim1::Neg => map1::<L>(x, out, n, math::neg::<L>),
        Prim1::Abs => map1::<L>(x, out, n, math::abs::<L>),
        Prim1::Sqrt => map1::<L>(x, out, n, L::sqrt),
        Prim1::Floor => map1::<L>(x, out, n, L::floor),
        Prim1::Exp => map1::<L>(x, out, n, math::exp::<L>),
        Prim1::Log => map1::<L>(x, out, n, math::log::<L>),
        Prim1::Log1p => map1::<L>(x, out, n, math::log1p::<L>),
        Prim1::Expm1 => map1::<L>(x, out, n, math::expm1::<L>),
        Prim1::Tanh => map1::<L>(x, out, n, math::tanh::<L>),
        Prim1::Erf => map1::<L>(x, out, n, math::erf::<L>),
        // `x == 0` (on a mask: all-ones is a NaN, so not equal)
        Prim1::Not => map1::<L>(x, out, n, is_zero::<L>),
        // not among the supported ops' lowerings (see `SUPPORTED`)
        Prim1::Sin | Prim1::Cos | Prim1::Ceil | Prim1::Trunc | Prim1::Round | Prim1::Tan => {
            map1::<L>(x, out, n, |_| L::splat(f32::NAN))
        }
        Prim1::Asin | Prim1::Acos | Prim1::Atan | Prim1::Sinh | Prim1::Cosh => {
            map1::<L>(x, out, n, |_| L::splat(f32::NAN))
        }
    }
}

/// `out = a op b`; `And`/`Or` act on masks bit by bit.
#[inline(always)]
pub(crate) unsafe fn binary<L: Lanes>(op: Prim2, a: Src, b: Src, out: *mut f32, n: usize) {
    match op {
        Prim2::Add => map2::<L>(a, b, out, n, L::add),
        Prim2::Sub => map2::<L>(a, b, out, n, L::sub),
        Prim2::Mul => map2::<L>(a, b, out, n, L::mul),
        Prim2::Div => map2::<L>(a, b, out, n, L::div),
        Prim2::Max => map2::<L>(a, b, out, n, max::<L>),
        Prim2::Min => map2::<L>(a, b, out, n, min::<L>),
        Prim2::And => map2::<L>(a, b, out, n, L::and),
        Prim2::Or => map2::<L>(a, b, out, n, L::or),
        // not among the supported ops' lowerings (see `SUPPORTED`)
        Prim2::Pow | Prim2::Fmod | Prim2::Xor | Prim2::Atan2 | Prim2::Hypot => {
            map2::<L>(a, b, out, n, |_, _| L::splat(f32::NAN))
        }
    }
}

/// `out = mask(a op b)`.
#[inline(always)]
pub(crate) unsafe fn compare<L: Lanes>(op: Cmp, a: Src, b: Src, out: *mut f32, n: usize) {
    // a loop of its own, not `map2` with a closure: closures do not inherit
    // the ISA entry's `#[target_feature]` and would run out of line
    let mut i = 0;
    while i < n {
        L::store(out.add(i), L::cmp(op, get::<L>(a, i), get::<L>(b, i)));
        i += L::N;
    }
}

/// `out = c ? a : b` (c a mask).
#[inline(always)]
pub(crate) unsafe fn select<L: Lanes>(c: Src, a: Src, b: Src, out: *mut f32, n: usize) {
    let mut i = 0;
    while i < n {
        let v = L::select(get::<L>(c, i), get::<L>(a, i), get::<L>(b, i));
        L::store(out.add(i), v);
        i += L::N;
    }
}

// The compound ops of `SUPPORTED` in registers: `lower_unary`'s primitives
// (activation.rs) in its order, one vector at a time; the same IEEE
// operations on the same values give the same bits, and a tile is loaded
// and stored once instead of once per primitive. The wide tests hold every
// one to the interpreter bit for bit.
#[inline(always)]
pub(crate) fn sigmoid<L: Lanes>(x: L::F) -> L::F {
    let e = math::exp::<L>(math::neg::<L>(x));
    let one = L::splat(1.0);
    L::div(one, L::add(one, e))
}
#[inline(always)]
pub(crate) fn silu<L: Lanes>(x: L::F) -> L::F {
    let e = math::exp::<L>(math::neg::<L>(x));
    L::div(x, L::add(L::splat(1.0), e))
}
#[inline(always)]
pub(crate) fn gelu<L: Lanes>(x: L::F) -> L::F {
    let u = L::mul(x, L::splat(std::f64::consts::FRAC_1_SQRT_2 as f32));
    let t = L::add(L::splat(1.0), math::erf::<L>(u));
    L::mul(L::mul(x, L::splat(0.5)), t)
}
#[inline(always)]
pub(crate) fn gelu_tanh<L: Lanes>(x: L::F) -> L::F {
    let x3 = L::mul(L::mul(x, x), x);
    let inner = L::add(x, L::mul(x3, L::splat(0.044715)));
    let u = L::mul(inner, L::splat((2.0 / std::f64::consts::PI).sqrt() as f32));
    let t1 = L::add(L::splat(1.0), math::tanh::<L>(u));
    L::mul(L::mul(x, L::splat(0.5)), t1)
}

/// `p[..n] = op(p[..n])` in registers when `op` is one of the compound ops
/// above (false, nothing written, otherwise).
#[inline(always)]
pub(crate) unsafe fn fused<L: Lanes>(op: UnaryOp, p: *mut f32, n: usize) -> bool {
    let x = Src::Tile(p);
    match op {
        UnaryOp::Sigmoid => map1::<L>(x, p, n, sigmoid::<L>),
        UnaryOp::Silu => map1::<L>(x, p, n, silu::<L>),
        UnaryOp::Gelu => map1::<L>(x, p, n, gelu::<L>),
        UnaryOp::GeluTanh => map1::<L>(x, p, n, gelu_tanh::<L>),
        _ => return false,
    }
    true
}

/// The tile loops of one instruction set (see `isa.rs`).
pub(crate) trait TileIsa {
    /// # Safety
    /// Tiles hold `n` f32 (a multiple of the ISA's lanes); the CPU has the ISA.
    unsafe fn unary(op: Prim1, x: Src, out: *mut f32, n: usize);
    /// # Safety
    /// As [`TileIsa::unary`].
    unsafe fn binary(op: Prim2, a: Src, b: Src, out: *mut f32, n: usize);
    /// # Safety
    /// As [`TileIsa::unary`].
    unsafe fn compare(op: Cmp, a: Src, b: Src, out: *mut f32, n: usize);
    /// # Safety
    /// As [`TileIsa::unary`].
    unsafe fn select(c: Src, a: Src, b: Src, out: *mut f32, n: usize);
    /// [`fused`] for this ISA.
    ///
    /// # Safety
    /// As [`TileIsa::unary`], `p` read and written.
    unsafe fn fused(op: UnaryOp, p: *mut f32, n: usize) -> bool;
}

/// [`ScalarOps`] over tiles of `n` f32 lanes (bools are masks).
struct TileOps<I> {
    arena: *mut f32,
    used: usize,
    n: usize,
    isa: std::marker::PhantomData<I>,
}

impl<I: TileIsa> TileOps<I> {
    fn alloc(&mut self) -> *mut f32 {
        // SUPPORTED's lowerings fit (tests run every one); wrap rather than overrun
        let t = self.used % MAX_TILES;
        self.used += 1;
        unsafe { self.arena.add(t * TILE) }
    }
    fn out(&mut self, f: impl FnOnce(*mut f32, usize)) -> Src {
        let o = self.alloc();
        f(o, self.n);
        Src::Tile(o)
    }
}

impl<I: TileIsa> ScalarOps for TileOps<I> {
    type V = Src;
    fn constant(&mut self, value: f64, dt: DType) -> Src {
        match dt {
            DType::Bool if value != 0.0 => Src::Splat(f32::from_bits(u32::MAX)),
            DType::Bool => Src::Splat(0.0),
            _ => Src::Splat(value as f32),
        }
    }
    fn unary(&mut self, op: Prim1, x: Src, _dt: DType) -> Src {
        self.out(|o, n| unsafe { I::unary(op, x, o, n) })
    }
    fn binary(&mut self, op: Prim2, a: Src, b: Src, _dt: DType) -> Src {
        self.out(|o, n| unsafe { I::binary(op, a, b, o, n) })
    }
    fn compare(&mut self, op: Cmp, a: Src, b: Src, _dt: DType) -> Src {
        self.out(|o, n| unsafe { I::compare(op, a, b, o, n) })
    }
    fn select(&mut self, c: Src, a: Src, b: Src, _dt: DType) -> Src {
        self.out(|o, n| unsafe { I::select(c, a, b, o, n) })
    }
    fn cast(&mut self, x: Src, from: DType, to: DType) -> Src {
        match (from, to) {
            (DType::Bool, DType::F32) => {
                let one = Src::Splat(1.0);
                self.out(|o, n| unsafe { I::binary(Prim2::And, x, one, o, n) })
            }
            (DType::F32, DType::Bool) => {
                let z = Src::Splat(0.0);
                self.out(|o, n| unsafe { I::compare(Cmp::Ne, x, z, o, n) })
            }
            _ => x,
        }
    }
}

/// The unary ops the wide helpers compute (f32), by op code: the ops whose
/// lowering spends its time in a transcendental.
pub const SUPPORTED: [UnaryOp; 10] = [
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Log1p,
    UnaryOp::Expm1,
    UnaryOp::Tanh,
    UnaryOp::Erf,
    UnaryOp::Sigmoid,
    UnaryOp::Silu,
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
];

/// The op code of `op` for [`run`], if the wide helpers compute it.
pub fn op_code(op: UnaryOp) -> Option<usize> {
    SUPPORTED.iter().position(|&s| s == op)
}

/// `buf[..n] = op(buf[..n])` with the ISA `I` on whole tiles of `I`'s lanes
/// (`lanes` of them) and `J` (one lane) on the rest.
///
/// # Safety
/// `buf` is valid for `n` f32 reads and writes; the CPU has `I`'s ISA.
pub(crate) unsafe fn run<I: TileIsa, J: TileIsa>(
    op: UnaryOp,
    buf: *mut f32,
    n: usize,
    lanes: usize,
) {
    let mut arena = Arena::<MAX_TILES>::new();
    let arena = arena.base();
    let mut at = 0;
    while at < n {
        let len = (n - at).min(TILE);
        let main = len - len % lanes;
        let p = buf.add(at);
        if main > 0 {
            run_tile::<I>(op, p, main, arena);
        }
        if main < len {
            run_tile::<J>(op, p.add(main), len - main, arena);
        }
        at += len;
    }
}

unsafe fn run_tile<I: TileIsa>(op: UnaryOp, p: *mut f32, n: usize, arena: *mut f32) {
    if I::fused(op, p, n) {
        return;
    }
    let mut ops = TileOps::<I> {
        arena,
        used: 0,
        n,
        isa: std::marker::PhantomData,
    };
    match lower_unary(&mut ops, op, Src::Tile(p), DType::F32) {
        Src::Tile(r) if r == p as *const f32 => {}
        Src::Tile(r) => std::ptr::copy_nonoverlapping(r, p, n),
        Src::Splat(v) => std::slice::from_raw_parts_mut(p, n).fill(v),
    }
}
