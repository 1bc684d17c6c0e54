//! A pointwise row that is one chain around one wide op, in one pass.
//!
//! `y = gelu(x*a + b) * 0.5 + x` is a start value (`x`), binary steps each
//! taking one more operand (`* a`, `+ b`), an op held in registers (`gelu`,
//! or any other of [`CHAIN_OPS`]), and more steps (`* 0.5`, `+ x`). The
//! tiled rows of `tiles.rs` run such a row as two f32x4 loops around the
//! helper, each tile stored and read back; here the whole chain runs at
//! the helper's width, a block of four vectors at a time from load to
//! store, which is one pass over memory. The steps are the same IEEE adds,
//! subtracts, multiplies and divides in the same order as the f32x4 code,
//! and the op is the tiles' register form, so the bits are the Cranelift
//! code's. A launch larger than the last-level cache stores past it.
//!
//! ```text
//! per 4 x 16 elements (AVX-512):  v = x[i..]; v = v*a[i..]; v = v+b[i..];
//!                                  v = gelu(v); v = v*0.5; v = v+x[i..]; y[i..] = v
//! ```

use super::lanes::Lanes;
use super::{math, tile};
use kiln_ir::UnaryOp;

/// Elements ahead of the block at which a chain fetches its operand rows
/// into L1, when its output stays in the caches (a launch that streams
/// its output is left to the hardware: there prefetches slowed W1 on Zen
/// 5). W1 compiled on a Xeon (model 207, 260 MiB L3, so W1's 64 MiB are
/// cache traffic): 1.43 -> 1.32 ms, medians of 8 alternating runs, 256 and
/// 512 elements ahead alike.
const AHEAD: usize = 256;

/// Most steps (before and after the op together) a chain has.
pub const MAX_STEPS: usize = 8;
/// Most distinct sources (operand rows and splatted values) a chain reads.
pub const MAX_SRCS: usize = 8;

/// Step opcodes (the low 4 bits of a step word).
pub const ADD: u32 = 0;
pub const SUB: u32 = 1;
pub const MUL: u32 = 2;
pub const DIV: u32 = 3;
/// Step flag: `src op v` instead of `v op src`.
pub const FLIP: u32 = 1 << 4;
/// A step word's source index starts at this bit.
pub const SRC_SHIFT: u32 = 8;

/// The ops a chain can hold: every op with a wide helper, each in
/// registers (`tile.rs`'s compound ops, `math.rs`'s primitives).
pub const CHAIN_OPS: [UnaryOp; 10] = super::SUPPORTED;

/// The op index of a chain with no op: steps alone (a softmax's
/// `x * scale + mask` prologue, `chain.rs` in the JIT's `steps_of`).
pub const NO_OP: u32 = CHAIN_OPS.len() as u32;

/// One row's chain, built on the JIT code's stack: elements `lo..hi` of
/// `out` (a multiple of 64 elements) get `post(op(pre(first)))`.
#[repr(C)]
pub struct ChainRow {
    pub out: *mut f32,
    pub lo: u64,
    pub hi: u64,
    /// Elements of the whole launch (every row, every thread).
    pub launch: u64,
    /// Source of the start value.
    pub first: u32,
    /// Index of the op in [`CHAIN_OPS`], or [`NO_OP`].
    pub op: u32,
    /// Steps before the op; the rest of `steps[..npre + npost]` come after.
    pub npre: u32,
    pub npost: u32,
    /// `opcode | FLIP? | src << SRC_SHIFT`.
    pub steps: [u32; MAX_STEPS],
    /// Sources in `srcs`.
    pub nsrcs: u32,
    /// Bit `s`: source `s` is a value for every lane (its f32 bits in the
    /// low half of `srcs[s]`); otherwise `srcs[s]` is a row pointer.
    pub splats: u32,
    pub srcs: [u64; MAX_SRCS],
}

#[derive(Clone, Copy)]
enum Src<F> {
    Row(*const f32),
    Splat(F),
}

#[derive(Clone, Copy)]
struct Step<F> {
    op: u32,
    flip: bool,
    src: Src<F>,
}

/// Vectors per block: enough independent chains to hide the op's
/// latency, few enough to stay in registers.
const BLOCK: usize = 4;

/// Runs the row with `L`.
///
/// # Safety
/// `r`'s rows cover `hi` elements; `hi - lo` is a multiple of `4 * L::N`;
/// the CPU has `L`'s ISA.
#[inline(always)]
pub(crate) unsafe fn chain_row<L: Lanes>(r: &ChainRow) {
    match CHAIN_OPS.get(r.op as usize) {
        Some(UnaryOp::Gelu) => run::<L>(r, |v| tile::gelu::<L>(v)),
        Some(UnaryOp::GeluTanh) => run::<L>(r, |v| tile::gelu_tanh::<L>(v)),
        Some(UnaryOp::Silu) => run::<L>(r, |v| tile::silu::<L>(v)),
        Some(UnaryOp::Sigmoid) => run::<L>(r, |v| tile::sigmoid::<L>(v)),
        Some(UnaryOp::Exp) => run::<L>(r, |v| math::exp::<L>(v)),
        Some(UnaryOp::Log) => run::<L>(r, |v| math::log::<L>(v)),
        Some(UnaryOp::Log1p) => run::<L>(r, |v| math::log1p::<L>(v)),
        Some(UnaryOp::Expm1) => run::<L>(r, |v| math::expm1::<L>(v)),
        Some(UnaryOp::Tanh) => run::<L>(r, |v| math::tanh::<L>(v)),
        Some(UnaryOp::Erf) => run::<L>(r, |v| math::erf::<L>(v)),
        None if r.op == NO_OP => run::<L>(r, |v| v),
        _ => unreachable!("the JIT code only builds chains of CHAIN_OPS"),
    }
}

#[inline(always)]
unsafe fn run<L: Lanes>(r: &ChainRow, op: impl Fn(L::F) -> L::F) {
    let src = |s: usize| {
        if r.splats >> s & 1 == 1 {
            Src::Splat(L::splat(f32::from_bits(r.srcs[s] as u32)))
        } else {
            Src::Row(r.srcs[s] as *const f32)
        }
    };
    // only the steps the JIT code wrote are read
    let n = ((r.npre + r.npost) as usize).min(MAX_STEPS);
    let unused = Step {
        op: ADD,
        flip: false,
        src: Src::Splat(L::splat(0.0)),
    };
    let mut steps = [unused; MAX_STEPS];
    for (step, &w) in steps.iter_mut().zip(&r.steps[..n]) {
        *step = Step {
            op: w & 0xf,
            flip: w & FLIP != 0,
            src: src((w >> SRC_SHIFT) as usize % MAX_SRCS),
        };
    }
    let (pre, post) = steps[..n].split_at((r.npre as usize).min(n));
    let first = src(r.first as usize);
    let (lo, hi) = (r.lo as usize, r.hi as usize);
    debug_assert_eq!((hi - lo) % (BLOCK * L::N), 0);
    // the output streams past the caches when the launch moves more than
    // they hold (and the row's start is on a line)
    let rows = (0..r.nsrcs).filter(|&s| r.splats >> s & 1 == 0).count();
    let moved = (rows as u64 + 1) * r.launch * 4;
    let nt = super::streams(moved) && (r.out.add(lo) as usize).is_multiple_of(64);
    // the operand rows, fetched AHEAD elements early, streaming or not (W1
    // streaming on a Xeon model 207: 1.47-1.54 ms without, 1.27-1.33 with)
    let mut ahead = [std::ptr::null::<f32>(); MAX_SRCS];
    let mut fetched = 0;
    if super::prefetch::enabled() {
        for s in 0..(r.nsrcs as usize).min(MAX_SRCS) {
            if let Src::Row(p) = src(s) {
                ahead[fetched] = p.wrapping_add(AHEAD);
                fetched += 1;
            }
        }
    }
    let mut i = lo;
    while i < hi {
        for p in &ahead[..fetched] {
            for at in (0..BLOCK * L::N).step_by(super::prefetch::LINE_F32) {
                super::prefetch::line(p.wrapping_add(i + at));
            }
        }
        let mut v: [L::F; BLOCK] = std::array::from_fn(|u| read::<L>(first, i + u * L::N));
        for s in pre {
            apply::<L>(s, &mut v, i);
        }
        for x in &mut v {
            *x = op(*x);
        }
        for s in post {
            apply::<L>(s, &mut v, i);
        }
        for (u, x) in v.into_iter().enumerate() {
            if nt {
                L::store_nt(r.out.add(i + u * L::N), x);
            } else {
                L::store(r.out.add(i + u * L::N), x);
            }
        }
        i += BLOCK * L::N;
    }
}

#[inline(always)]
unsafe fn read<L: Lanes>(s: Src<L::F>, i: usize) -> L::F {
    match s {
        Src::Row(p) => L::load(p.add(i)),
        Src::Splat(v) => v,
    }
}

#[inline(always)]
unsafe fn apply<L: Lanes>(s: &Step<L::F>, v: &mut [L::F; BLOCK], i: usize) {
    for (u, x) in v.iter_mut().enumerate() {
        let o = read::<L>(s.src, i + u * L::N);
        let (a, b) = if s.flip { (o, *x) } else { (*x, o) };
        *x = match s.op {
            ADD => L::add(a, b),
            SUB => L::sub(a, b),
            MUL => L::mul(a, b),
            _ => L::div(a, b),
        };
    }
}
