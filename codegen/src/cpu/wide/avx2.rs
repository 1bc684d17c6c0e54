//! [`Lanes`] on AVX2 + FMA: 8 f32 lanes in a `__m256`.
//!
//! Only reachable from `#[target_feature(enable = "avx2,fma")]` code that
//! runs after `is_x86_feature_detected!` said yes (see `isa.rs`).

use super::lanes::Lanes;
use kiln_ir::scalar::Cmp;
use std::arch::x86_64::*;

pub(crate) struct Avx2;

#[inline(always)]
fn si(a: __m256) -> __m256i {
    unsafe { _mm256_castps_si256(a) }
}

#[inline(always)]
fn ps(a: __m256i) -> __m256 {
    unsafe { _mm256_castsi256_ps(a) }
}

// SAFETY (every method): the caller runs with AVX2 and FMA enabled.
impl Lanes for Avx2 {
    const N: usize = 8;
    type F = __m256;

    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    fn splat(x: f32) -> __m256 {
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    fn add(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn sqrt(a: __m256) -> __m256 {
        unsafe { _mm256_sqrt_ps(a) }
    }
    #[inline(always)]
    fn max_fast(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    fn floor(a: __m256) -> __m256 {
        unsafe { _mm256_floor_ps(a) }
    }
    #[inline(always)]
    fn and(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_and_ps(a, b) }
    }
    #[inline(always)]
    fn or(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_or_ps(a, b) }
    }
    #[inline(always)]
    fn xor(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_xor_ps(a, b) }
    }
    #[inline(always)]
    fn cmp(op: Cmp, a: __m256, b: __m256) -> __m256 {
        unsafe {
            match op {
                Cmp::Eq => _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b),
                Cmp::Ne => _mm256_cmp_ps::<_CMP_NEQ_UQ>(a, b),
                Cmp::Lt => _mm256_cmp_ps::<_CMP_LT_OQ>(a, b),
                Cmp::Le => _mm256_cmp_ps::<_CMP_LE_OQ>(a, b),
                Cmp::Gt => _mm256_cmp_ps::<_CMP_GT_OQ>(a, b),
                Cmp::Ge => _mm256_cmp_ps::<_CMP_GE_OQ>(a, b),
            }
        }
    }
    #[inline(always)]
    fn lt_or_unordered(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_cmp_ps::<_CMP_NGE_UQ>(a, b) }
    }
    #[inline(always)]
    fn select(m: __m256, a: __m256, b: __m256) -> __m256 {
        // masks are all-ones or zero per lane, so the sign bit decides
        unsafe { _mm256_blendv_ps(b, a, m) }
    }
    #[inline(always)]
    fn any(m: __m256) -> bool {
        unsafe { _mm256_movemask_ps(m) != 0 }
    }
    #[inline(always)]
    fn iadd(a: __m256, b: __m256) -> __m256 {
        unsafe { ps(_mm256_add_epi32(si(a), si(b))) }
    }
    #[inline(always)]
    fn isub(a: __m256, b: __m256) -> __m256 {
        unsafe { ps(_mm256_sub_epi32(si(a), si(b))) }
    }
    #[inline(always)]
    fn shl23(a: __m256) -> __m256 {
        unsafe { ps(_mm256_slli_epi32::<23>(si(a))) }
    }
    #[inline(always)]
    fn ushr23(a: __m256) -> __m256 {
        unsafe { ps(_mm256_srli_epi32::<23>(si(a))) }
    }
    #[inline(always)]
    fn sshr1(a: __m256) -> __m256 {
        unsafe { ps(_mm256_srai_epi32::<1>(si(a))) }
    }
    #[inline(always)]
    fn i2f(a: __m256) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(si(a)) }
    }
}
