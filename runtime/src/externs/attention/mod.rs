//! Fused scaled-dot-product attention on the CPU, flash-attention style:
//! per (batch, head, block of query rows) the kernel walks the keys in
//! blocks, computes `q . k * scale` (+ mask, causal triangle) into a small
//! tile, folds the tile into an online softmax (running max and sum, one
//! exp per score) and accumulates the weighted sum of V. The `[L, S]` score
//! matrix is never stored; besides the output, each row's logsumexp is kept
//! for the backward pass (`backward.rs`), which recomputes the scores.
//!
//! Conventions are PyTorch's (and those of kiln's composite): a NaN score
//! makes its row NaN, a `+inf` one too (`inf - inf`), and a row whose every
//! score is `-inf` gives zeros when the call has a mask (PyTorch's CPU
//! kernel) and NaN otherwise (a plain softmax); its logsumexp is `-inf`
//! (masked) or NaN.
//!
//! The products of a tile (scores `Q K^T`, the weighted sum `P V`, and in
//! backward `P^T dO`, `dO V^T`, `dS K`, `dS^T Q`) are GEMMs on the `gemm`
//! crate's register-tiled microkernels (AVX-512/AVX2 chosen by the crate at
//! run time), one tile at a time with no threading of their own: the
//! composite's matmuls run on the same kernels, so the fused path no longer
//! trades them for one-row dot products. The softmax between the products
//! is compiled three times (AVX-512, AVX2 + FMA, portable) and picked at run
//! time by [`cpu_isa::detect`], and the f32 exps of a tile go through the
//! wide helpers of `kiln_codegen`.
//!
//! ```
//! use kiln_ir::op::attention::AttentionDims;
//! use kiln_runtime::externs::attention::{attention_forward, AttnCall, MaskRef};
//! let d = AttentionDims { n: 1, h: 1, hk: 1, l: 1, s: 2, e: 1, ev: 1 };
//! let call = AttnCall { dims: d, scale: 1.0, is_causal: false };
//! let (q, k, v) = ([1.0f32], [1.0f32, 1.0], [2.0f32, 4.0]);
//! let (mut out, mut lse) = ([0.0f32], [0.0f32]);
//! attention_forward(&call, &q, &k, &v, &MaskRef::None, &mut out, &mut lse);
//! assert!((out[0] - 3.0).abs() < 1e-6 && (lse[0] - (1.0 + 2f32.ln())).abs() < 1e-6);
//! ```

mod backward;
mod block;

pub use backward::attention_backward;

use super::cpu_isa::{self, Isa};
use super::gemm::{gemm_with, Parallelism};
use super::Elem;
use kiln_ir::op::attention::AttentionDims;

/// Query rows one worker handles (its tile is `BQ x BK` scores): 64 rows
/// give the GEMM microkernels several full register blocks per tile.
pub(crate) const BQ: usize = 64;
/// Keys per tile (a `BQ x BK` f32 tile is 16 KiB, half an L1 cache).
pub(crate) const BK: usize = 64;

/// The sizes and scalar arguments of one attention call. Query, key, value
/// and output are contiguous `[N, H, L, E]`, `[N, Hk, S, E]`,
/// `[N, Hk, S, Ev]` and `[N, H, L, Ev]`; query head `h` reads key/value head
/// `h / (H / Hk)`.
#[derive(Debug, Clone, Copy)]
pub struct AttnCall {
    pub dims: AttentionDims,
    pub scale: f64,
    /// Top-left causal triangle: query `i` sees keys `j <= i`.
    pub is_causal: bool,
}

/// A mask read through strides over `[N, H, L, S]` (0 for broadcast dims),
/// from the start of `data`.
#[derive(Debug, Clone, Copy)]
pub struct Strided<'a, T> {
    pub data: &'a [T],
    pub strides: [usize; 4],
}

/// The optional mask of an attention call.
#[derive(Debug, Clone, Copy)]
pub enum MaskRef<'a, T> {
    None,
    /// Bool bytes: nonzero = may attend.
    Bool(Strided<'a, u8>),
    /// Added to the scaled scores.
    Float(Strided<'a, T>),
}

impl<T: AttnElem> MaskRef<'_, T> {
    pub(crate) fn present(&self) -> bool {
        !matches!(self, MaskRef::None)
    }

    /// Applies the mask at `(n, h, i, j)` to the scaled score `s`.
    #[inline(always)]
    pub(crate) fn apply(&self, nh: [usize; 2], i: usize, j: usize, s: T) -> T {
        let at = |st: &[usize; 4]| nh[0] * st[0] + nh[1] * st[1] + i * st[2] + j * st[3];
        match self {
            MaskRef::None => s,
            MaskRef::Bool(m) if m.data[at(&m.strides)] == 0 => T::NEG_INFINITY,
            MaskRef::Bool(_) => s,
            MaskRef::Float(m) => s + m.data[at(&m.strides)],
        }
    }
}

/// f32 or f64 with the few transcendental functions attention needs.
pub trait AttnElem: Elem {
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn max(self, o: Self) -> Self;
    const NAN: Self;
    /// `xs[i] = exp(xs[i])` for a tile (f32: the wide helper of `isa`).
    fn exp_tile(isa: Isa, xs: &mut [Self]);
}

impl AttnElem for f32 {
    fn exp(self) -> f32 {
        f32::exp(self)
    }
    fn ln(self) -> f32 {
        f32::ln(self)
    }
    fn max(self, o: f32) -> f32 {
        f32::max(self, o)
    }
    const NAN: f32 = f32::NAN;
    fn exp_tile(isa: Isa, xs: &mut [f32]) {
        let wide = match isa {
            Isa::Avx512 => Some(kiln_codegen::cpu::wide::WideIsa::Avx512),
            Isa::Avx2 => Some(kiln_codegen::cpu::wide::WideIsa::Avx2),
            Isa::Scalar => None,
        };
        let ok = wide.is_some()
            && kiln_codegen::cpu::wide::apply(wide, kiln_ir::UnaryOp::Exp, xs).is_ok();
        if !ok {
            xs.iter_mut().for_each(|x| *x = x.exp());
        }
    }
}

impl AttnElem for f64 {
    fn exp(self) -> f64 {
        f64::exp(self)
    }
    fn ln(self) -> f64 {
        f64::ln(self)
    }
    fn max(self, o: f64) -> f64 {
        f64::max(self, o)
    }
    const NAN: f64 = f64::NAN;
    fn exp_tile(_: Isa, xs: &mut [f64]) {
        xs.iter_mut().for_each(|x| *x = x.exp());
    }
}

/// `out = softmax(q k^T * scale + mask) v` and each row's logsumexp, for
/// contiguous operands laid out as [`AttnCall`] says.
///
/// # Panics
/// When a slice is shorter than the dims say (the caller checks shapes with
/// `kiln_ir::op::attention::attention_dims` first).
pub fn attention_forward<T: AttnElem>(
    call: &AttnCall,
    q: &[T],
    k: &[T],
    v: &[T],
    mask: &MaskRef<'_, T>,
    out: &mut [T],
    lse: &mut [T],
) {
    let d = call.dims;
    let nh = d.n * d.h;
    assert!(q.len() >= nh * d.l * d.e && out.len() >= nh * d.l * d.ev && lse.len() >= nh * d.l);
    assert!(k.len() >= d.n * d.hk * d.s * d.e && v.len() >= d.n * d.hk * d.s * d.ev);
    if nh * d.l == 0 {
        return;
    }
    let isa = cpu_isa::detect();
    // one task per (head, block of query rows); a block never crosses a head
    let mut tasks = Vec::with_capacity(nh * d.l.div_ceil(BQ));
    let heads = out[..nh * d.l * d.ev]
        .chunks_mut((d.l * d.ev).max(1))
        .zip(lse[..nh * d.l].chunks_mut(d.l));
    for (head, (o, ls)) in heads.enumerate() {
        let blocks = o.chunks_mut((BQ * d.ev).max(1)).zip(ls.chunks_mut(BQ));
        for (qb, (ob, lb)) in blocks.enumerate() {
            tasks.push((head, qb * BQ, ob, lb));
        }
    }
    let task = |(head, i0, o, ls): &mut (usize, usize, &mut [T], &mut [T])| {
        let (head, i0) = (*head, *i0);
        let blk = block::QueryBlock {
            call,
            n: head / d.h,
            h: head % d.h,
            i0,
            rows: ls.len(),
        };
        block::run_forward(isa, &blk, q, k, v, mask, o, ls);
    };
    let work = nh * d.l * d.s * (d.e + d.ev);
    if work < super::PAR_MIN_WORK || super::threads() == 1 {
        tasks.iter_mut().for_each(task);
    } else {
        crate::par::for_each_piece(&mut tasks, 1, || (), |_, _, t| task(&mut t[0]));
    }
}

/// Defines `$name`, which calls the `#[inline(always)]` generic `$body`
/// compiled for AVX-512, for AVX2 + FMA or portably, as `isa` says: the
/// body's loops vectorise for each ISA (closures would not inherit the
/// target features, so the wrappers are plain fns).
macro_rules! isa_dispatch {
    ($(#[$m:meta])* $vis:vis fn $name:ident => $body:ident($($arg:ident: $ty:ty),* $(,)?)) => {
        $(#[$m])*
        $vis fn $name<T: AttnElem>(isa: Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn wide<T: AttnElem>(isa: Isa, $($arg: $ty),*) {
                    $body::<T>(isa, $($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn narrow<T: AttnElem>(isa: Isa, $($arg: $ty),*) {
                    $body::<T>(isa, $($arg),*)
                }
                match isa {
                    // SAFETY: `cpu_isa::detect` saw these features.
                    Isa::Avx512 => return unsafe { wide::<T>(isa, $($arg),*) },
                    Isa::Avx2 => return unsafe { narrow::<T>(isa, $($arg),*) },
                    Isa::Scalar => {}
                }
            }
            $body::<T>(isa, $($arg),*)
        }
    };
}
pub(crate) use isa_dispatch;

/// A strided read-only matrix operand of [`tile_gemm`].
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a, T> {
    pub data: &'a [T],
    pub rs: isize,
    pub cs: isize,
}

impl<'a, T> Mat<'a, T> {
    /// Row-major with leading dimension `ld`.
    pub(crate) fn rows(data: &'a [T], ld: usize) -> Self {
        Mat {
            data,
            rs: ld as isize,
            cs: 1,
        }
    }

    /// The transpose of a row-major matrix with leading dimension `ld`.
    pub(crate) fn cols(data: &'a [T], ld: usize) -> Self {
        Mat {
            data,
            rs: 1,
            cs: ld as isize,
        }
    }
}

/// `out (+)= a b` for one `m x k x n` tile, `out` row-major with leading
/// dimension `out_ld`; single-threaded (the caller's tasks are the
/// parallelism).
#[inline(always)]
pub(crate) fn tile_gemm<T: AttnElem>(
    (m, k, n): (usize, usize, usize),
    a: Mat<'_, T>,
    b: Mat<'_, T>,
    out: &mut [T],
    out_ld: usize,
    accumulate: bool,
) {
    gemm_with(
        m,
        k,
        n,
        a.data,
        a.rs,
        a.cs,
        b.data,
        b.rs,
        b.cs,
        out,
        out_ld as isize,
        1,
        accumulate,
        Parallelism::None,
    );
}

/// `sum a[i] * b[i]` with 8 partial sums (a vector's worth of lanes).
#[inline(always)]
pub(crate) fn dot<T: AttnElem>(a: &[T], b: &[T]) -> T {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [T::ZERO; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = T::ZERO;
    for (x, y) in ar.iter().zip(br) {
        s += *x * *y;
    }
    let half = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (half[0] + half[2]) + (half[1] + half[3]) + s
}
