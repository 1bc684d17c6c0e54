//! A vector of channels for the conv kernels that put channels in the
//! lanes (`depthwise_channels.rs`, `direct_channels.rs`): sixteen f32 with
//! AVX-512, eight with AVX2 + FMA. Each instruction set's entry points are
//! `#[target_feature]` functions that run the kernels' generic bodies, so
//! the primitives below inline into that ISA's machine code.

use super::depthwise_channels::{self, Block};
use super::direct_channels::{self, Row};
use super::{as_f32, as_f32_mut, conv_shapes, is_f32, scratch, Epilogue};
use crate::externs::cpu_isa::{self, Isa};
use crate::externs::Elem;
use kiln_ir::op::conv::ConvGeometry;
use kiln_ir::Result;

/// One instruction set's vector of `N` channels. The primitives are only
/// called from inside its entry points.
pub(super) trait ChannelVec {
    /// Channels per vector.
    const N: usize;
    type V: Copy;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    unsafe fn splat(x: f32) -> Self::V;
    /// `a * b + c`, rounded once.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// Transposes the `N x N` matrix whose rows are `r[..N]`.
    unsafe fn transpose(r: &mut [Self::V; 16]);

    /// [`depthwise_channels::block`] compiled for this ISA.
    unsafe fn depthwise_block(b: &Block, xs: &mut [f32], ys: &mut [f32], o: *mut f32);
    /// [`direct_channels::row`] compiled for this ISA.
    unsafe fn stem_row(r: &Row, ys: &mut [f32], o: *mut f32);
}

/// A conv whose f32 body is generic over the channel vector.
pub(super) trait ChannelConv {
    fn conv2d_f32<C: ChannelVec>(
        g: &ConvGeometry,
        input: &[f32],
        weight: &[f32],
        bias: Option<&[f32]>,
        out: &mut [f32],
        epilogue: Option<Epilogue>,
    ) -> Result<()>;
}

/// `K`'s body with the detected ISA's channel vector when the operands are
/// f32 and the CPU has AVX-512 or AVX2 + FMA; `None` (nothing run)
/// otherwise.
pub(super) fn run<K: ChannelConv, T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epilogue: Option<Epilogue>,
) -> Option<Result<()>> {
    if !is_f32::<T>() {
        return None;
    }
    // SAFETY: T is f32 (checked above).
    let (x, w, b) = unsafe { (as_f32(input), as_f32(weight), bias.map(|b| as_f32(b))) };
    let o = unsafe { as_f32_mut(out) };
    match cpu_isa::detect() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => Some(K::conv2d_f32::<Avx512>(g, x, w, b, o, epilogue)),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some(K::conv2d_f32::<Avx2>(g, x, w, b, o, epilogue)),
        _ => None,
    }
}

/// `weight [C_out, k]` and `bias` as `[block][k][lane]` weight vectors,
/// each block followed by its bias vector (lanes past `C_out` zero).
pub(super) fn pack_weights(
    g: &ConvGeometry,
    weight: &[f32],
    bias: Option<&[f32]>,
    k: usize,
    n: usize,
) -> Result<Vec<f32>> {
    let mut packed = vec![];
    let shapes = || conv_shapes(g);
    scratch(
        &mut packed,
        g.c_out.div_ceil(n) * (k + 1) * n,
        "conv2d",
        &shapes,
    )?;
    for co in 0..g.c_out {
        let at = co / n * (k + 1) * n + co % n;
        for i in 0..k {
            packed[at + i * n] = weight[co * k + i];
        }
        packed[at + k * n] = bias.map_or(0.0, |b| b[co]);
    }
    Ok(packed)
}

/// `count` positions of `ys` (`[p][N]`) into the `N` rows `o + l * stride`,
/// `N` positions at a time through a register transpose.
///
/// # Safety
/// `ys` holds `count x N` values; each of the `N` rows `count` writable
/// values; inside an entry point of `C`.
#[inline(always)]
pub(super) unsafe fn unpack<C: ChannelVec>(
    ys: *const f32,
    o: *mut f32,
    count: usize,
    stride: usize,
) {
    let n = C::N;
    let mut r = [C::splat(0.0); 16];
    let mut p = 0;
    while p + n <= count {
        for (j, r) in r.iter_mut().enumerate().take(n) {
            *r = C::load(ys.add((p + j) * n));
        }
        C::transpose(&mut r);
        for (l, r) in r.iter().enumerate().take(n) {
            C::store(o.add(l * stride + p), *r);
        }
        p += n;
    }
    for q in p..count {
        for l in 0..n {
            *o.add(l * stride + q) = *ys.add(q * n + l);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// Sixteen channels, AVX-512F.
    pub(in super::super) struct Avx512;
    /// Eight channels, AVX2 + FMA.
    pub(in super::super) struct Avx2;

    impl ChannelVec for Avx512 {
        const N: usize = 16;
        type V = __m512;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            _mm512_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            _mm512_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m512 {
            _mm512_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
            _mm512_fmadd_ps(a, b, c)
        }
        /// Four rounds of interleaves: 32-bit, 64-bit, then 128-bit lanes twice.
        #[inline(always)]
        unsafe fn transpose(r: &mut [__m512; 16]) {
            let mut t = *r;
            for i in 0..8 {
                t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            let (pd, ps) = (_mm512_castps_pd, _mm512_castpd_ps);
            let mut u = t;
            for i in 0..4 {
                // no closure here: closures do not inherit the entry's
                // target features, and the casts would run out of line
                let (a, b) = (pd(t[4 * i]), pd(t[4 * i + 1]));
                let (c, d) = (pd(t[4 * i + 2]), pd(t[4 * i + 3]));
                u[4 * i] = ps(_mm512_unpacklo_pd(a, c));
                u[4 * i + 1] = ps(_mm512_unpackhi_pd(a, c));
                u[4 * i + 2] = ps(_mm512_unpacklo_pd(b, d));
                u[4 * i + 3] = ps(_mm512_unpackhi_pd(b, d));
            }
            let mut v = u;
            for i in 0..2 {
                for j in 0..4 {
                    let (a, b) = (u[8 * i + j], u[8 * i + j + 4]);
                    v[8 * i + j] = _mm512_shuffle_f32x4::<0x88>(a, b);
                    v[8 * i + j + 4] = _mm512_shuffle_f32x4::<0xdd>(a, b);
                }
            }
            for j in 0..8 {
                r[j] = _mm512_shuffle_f32x4::<0x88>(v[j], v[j + 8]);
                r[j + 8] = _mm512_shuffle_f32x4::<0xdd>(v[j], v[j + 8]);
            }
        }
        unsafe fn depthwise_block(b: &Block, xs: &mut [f32], ys: &mut [f32], o: *mut f32) {
            #[target_feature(enable = "avx512f")]
            unsafe fn go(b: &Block, xs: &mut [f32], ys: &mut [f32], o: *mut f32) {
                depthwise_channels::block::<Avx512>(b, xs, ys, o)
            }
            go(b, xs, ys, o)
        }
        unsafe fn stem_row(r: &Row, ys: &mut [f32], o: *mut f32) {
            #[target_feature(enable = "avx512f")]
            unsafe fn go(r: &Row, ys: &mut [f32], o: *mut f32) {
                direct_channels::row::<Avx512>(r, ys, o)
            }
            go(r, ys, o)
        }
    }

    impl ChannelVec for Avx2 {
        const N: usize = 8;
        type V = __m256;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            _mm256_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            _mm256_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m256 {
            _mm256_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
            _mm256_fmadd_ps(a, b, c)
        }
        /// Interleaves of 32-bit and 64-bit elements, then of 128-bit halves.
        #[inline(always)]
        unsafe fn transpose(r: &mut [__m256; 16]) {
            let mut t = *r;
            for i in 0..4 {
                t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            let mut u = t;
            for i in 0..2 {
                let (a, b, c, d) = (t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
                u[4 * i] = _mm256_shuffle_ps::<0x44>(a, c);
                u[4 * i + 1] = _mm256_shuffle_ps::<0xee>(a, c);
                u[4 * i + 2] = _mm256_shuffle_ps::<0x44>(b, d);
                u[4 * i + 3] = _mm256_shuffle_ps::<0xee>(b, d);
            }
            for j in 0..4 {
                r[j] = _mm256_permute2f128_ps::<0x20>(u[j], u[j + 4]);
                r[j + 4] = _mm256_permute2f128_ps::<0x31>(u[j], u[j + 4]);
            }
        }
        unsafe fn depthwise_block(b: &Block, xs: &mut [f32], ys: &mut [f32], o: *mut f32) {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn go(b: &Block, xs: &mut [f32], ys: &mut [f32], o: *mut f32) {
                depthwise_channels::block::<Avx2>(b, xs, ys, o)
            }
            go(b, xs, ys, o)
        }
        unsafe fn stem_row(r: &Row, ys: &mut [f32], o: *mut f32) {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn go(r: &Row, ys: &mut [f32], o: *mut f32) {
                direct_channels::row::<Avx2>(r, ys, o)
            }
            go(r, ys, o)
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use x86::{Avx2, Avx512};
