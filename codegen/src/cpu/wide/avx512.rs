//! [`Lanes`] on AVX-512F: 16 f32 lanes in a `__m512`. Compares give k-masks,
//! widened here to all-ones lanes so masks are vectors as on the other ISAs.
//!
//! Only reachable from `#[target_feature(enable = "avx512f")]` code that runs
//! after `is_x86_feature_detected!("avx512f")` said yes (see `isa.rs`).

use super::lanes::Lanes;
use kiln_ir::scalar::Cmp;
use std::arch::x86_64::*;

pub(crate) struct Avx512;

#[inline(always)]
fn si(a: __m512) -> __m512i {
    unsafe { _mm512_castps_si512(a) }
}

#[inline(always)]
fn ps(a: __m512i) -> __m512 {
    unsafe { _mm512_castsi512_ps(a) }
}

#[inline(always)]
fn widen(k: __mmask16) -> __m512 {
    unsafe { ps(_mm512_maskz_set1_epi32(k, -1)) }
}

// SAFETY (every method): the caller runs with AVX-512F enabled.
impl Lanes for Avx512 {
    const N: usize = 16;
    type F = __m512;

    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn store_nt(p: *mut f32, v: __m512) {
        _mm512_stream_ps(p, v)
    }
    #[inline(always)]
    fn splat(x: f32) -> __m512 {
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    fn add(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn sqrt(a: __m512) -> __m512 {
        unsafe { _mm512_sqrt_ps(a) }
    }
    #[inline(always)]
    fn max_fast(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    fn floor(a: __m512) -> __m512 {
        // round toward -inf, exceptions suppressed
        unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    fn and(a: __m512, b: __m512) -> __m512 {
        unsafe { ps(_mm512_and_si512(si(a), si(b))) }
    }
    #[inline(always)]
    fn or(a: __m512, b: __m512) -> __m512 {
        unsafe { ps(_mm512_or_si512(si(a), si(b))) }
    }
    #[inline(always)]
    fn xor(a: __m512, b: __m512) -> __m512 {
        unsafe { ps(_mm512_xor_si512(si(a), si(b))) }
    }
    #[inline(always)]
    fn cmp(op: Cmp, a: __m512, b: __m512) -> __m512 {
        unsafe {
            widen(match op {
                Cmp::Eq => _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, b),
                Cmp::Ne => _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(a, b),
                Cmp::Lt => _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b),
                Cmp::Le => _mm512_cmp_ps_mask::<_CMP_LE_OQ>(a, b),
                Cmp::Gt => _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, b),
                Cmp::Ge => _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, b),
            })
        }
    }
    #[inline(always)]
    fn lt_or_unordered(a: __m512, b: __m512) -> __m512 {
        unsafe { widen(_mm512_cmp_ps_mask::<_CMP_NGE_UQ>(a, b)) }
    }
    #[inline(always)]
    fn select(m: __m512, a: __m512, b: __m512) -> __m512 {
        unsafe {
            let k = _mm512_test_epi32_mask(si(m), si(m));
            _mm512_mask_blend_ps(k, b, a)
        }
    }
    #[inline(always)]
    fn any(m: __m512) -> bool {
        unsafe { _mm512_test_epi32_mask(si(m), si(m)) != 0 }
    }
    #[inline(always)]
    fn iadd(a: __m512, b: __m512) -> __m512 {
        unsafe { ps(_mm512_add_epi32(si(a), si(b))) }
    }
    #[inline(always)]
    fn isub(a: __m512, b: __m512) -> __m512 {
        unsafe { ps(_mm512_sub_epi32(si(a), si(b))) }
    }
    #[inline(always)]
    fn shl23(a: __m512) -> __m512 {
        unsafe { ps(_mm512_slli_epi32::<23>(si(a))) }
    }
    #[inline(always)]
    fn ushr23(a: __m512) -> __m512 {
        unsafe { ps(_mm512_srli_epi32::<23>(si(a))) }
    }
    #[inline(always)]
    fn sshr1(a: __m512) -> __m512 {
        unsafe { ps(_mm512_srai_epi32::<1>(si(a))) }
    }
    #[inline(always)]
    fn i2f(a: __m512) -> __m512 {
        unsafe { _mm512_cvtepi32_ps(si(a)) }
    }
    const SCALEF: bool = true;
    #[inline(always)]
    fn scalef(a: __m512, n: __m512) -> __m512 {
        unsafe { _mm512_scalef_ps(a, n) }
    }
}
