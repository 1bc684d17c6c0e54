//! The x86-64 kernels: one microkernel body, two dot-product steps.
//!
//! A block of up to 4 rows times one 16-column panel keeps 8 int32
//! accumulators in registers; each step broadcasts 4 activation bytes of a
//! row and multiplies them with the panel's 4 weights per column:
//!
//! - AVX2: `vpmaddubsw` (u8 x s8, adjacent pairs summed to i16, saturating)
//!   then `vpmaddwd` with ones (pairs of i16 summed to i32). The i16 sum of
//!   two products saturates only when an activation exceeds 128, which is
//!   why fbgemm quantizes activations to 7 bits (`reduce_range`): with
//!   `x <= 128` and `w` in `[-128, 127]` a pair lies in `[-32768, 32512]`.
//! - AVX-512-VNNI: `vpdpbusd` does the 4 products and the add in one
//!   instruction, with no intermediate saturation (its 256-bit form, so both
//!   kernels share the packing).
//!
//! The epilogue runs on the accumulators while they are still in registers:
//! subtract `zero_point * colsum`, convert to f32, one fused multiply-add
//! with `act_scale * w_scale` and the bias, optionally ReLU — what PyTorch's
//! fbgemm computes (its fixtures match bit for bit only with the FMA).

use super::pack::NR;
use super::PanelTask;
use std::arch::x86_64::*;

macro_rules! panel_kernel {
    ($name:ident, $block:ident, $feat:literal, |$acc:ident, $a:ident, $b:ident, $ones:ident| $step:expr) => {
        /// Runs one panel over all rows of the task.
        ///
        /// # Safety
        /// The CPU must have the features named; the task's pointers must be
        /// valid for its geometry.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn $name(t: &PanelTask) {
            let mut i = 0;
            while i + 4 <= t.m {
                $block::<4>(t, i);
                i += 4;
            }
            match t.m - i {
                3 => $block::<3>(t, i),
                2 => $block::<2>(t, i),
                1 => $block::<1>(t, i),
                _ => {}
            }
        }

        #[target_feature(enable = $feat)]
        unsafe fn $block<const MR: usize>(t: &PanelTask, row0: usize) {
            let $ones = _mm256_set1_epi16(1);
            let mut acc = [[_mm256_setzero_si256(); 2]; MR];
            let a0 = t.a.add(row0 * t.lda);
            for g in 0..t.groups {
                let b0 = _mm256_loadu_si256(t.b.add(g * 64) as *const __m256i);
                let b1 = _mm256_loadu_si256(t.b.add(g * 64 + 32) as *const __m256i);
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let word = (a0.add(r * t.lda + g * 4) as *const i32).read_unaligned();
                    let $a = _mm256_set1_epi32(word);
                    let ($acc, $b) = (acc_r[0], b0);
                    acc_r[0] = $step;
                    let ($acc, $b) = (acc_r[1], b1);
                    acc_r[1] = $step;
                }
            }
            let zero = _mm256_setzero_ps();
            for h in 0..2 {
                let offs = _mm256_loadu_si256(t.offs.add(h * 8) as *const __m256i);
                let mult = _mm256_loadu_ps(t.mult.add(h * 8));
                let bias = _mm256_loadu_ps(t.bias.add(h * 8));
                for (r, acc_r) in acc.iter().enumerate() {
                    let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc_r[h], offs));
                    let mut f = _mm256_fmadd_ps(v, mult, bias);
                    if t.relu {
                        f = _mm256_max_ps(zero, f);
                    }
                    let dst = t.out.add((row0 + r) * t.ldo + h * 8);
                    let valid = t.ncols.saturating_sub(h * 8).min(8);
                    if valid == 8 {
                        _mm256_storeu_ps(dst, f);
                    } else if valid > 0 {
                        let mut tmp = [0f32; 8];
                        _mm256_storeu_ps(tmp.as_mut_ptr(), f);
                        std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, valid);
                    }
                }
            }
            debug_assert!(t.ncols <= NR);
        }
    };
}

panel_kernel!(panel_avx2, block_avx2, "avx2,fma", |acc, a, b, ones| {
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones))
});

panel_kernel!(
    panel_vnni,
    block_vnni,
    "avx2,fma,avx512f,avx512vl,avx512vnni",
    |acc, a, b, ones| {
        let _ = ones;
        _mm256_dpbusd_epi32(acc, a, b)
    }
);

/// `quantize_activations` for one row with AVX2+FMA (fbgemm's `QuantizeAvx2`:
/// `vfmadd`, clip at the largest float below 2^31, `vcvtps2dq` rounding half
/// to even, clamp to `[0, 255]`); the same bits as the scalar loop.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `dst.len() >= src.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_row_avx2(
    src: &[f32],
    dst: &mut [u8],
    inv_scale: f32,
    zero_point: f32,
) {
    let n = src.len();
    let inv = _mm256_set1_ps(inv_scale);
    let zp = _mm256_set1_ps(zero_point);
    let cap = _mm256_set1_ps(2147483520.0);
    let (lo, hi) = (_mm256_setzero_si256(), _mm256_set1_epi32(255));
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_loadu_ps(src.as_ptr().add(i));
        let t = _mm256_min_ps(_mm256_fmadd_ps(v, inv, zp), cap);
        let q = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(t), lo), hi);
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, q);
        for (d, l) in dst[i..i + 8].iter_mut().zip(lanes) {
            *d = l as u8;
        }
        i += 8;
    }
    for j in i..n {
        let t = src[j]
            .mul_add(inv_scale, zero_point)
            .min(2147483520.0)
            .round_ties_even();
        dst[j] = t.clamp(0.0, 255.0) as u8;
    }
}

/// `(min, max)` with AVX (fbgemm's `FindMinMax`).
///
/// # Safety
/// The CPU must have AVX2; `x` non-empty.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn min_max_avx2(x: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = (x[0], x[0]);
    let mut i = 0;
    if x.len() >= 8 {
        let (mut vlo, mut vhi) = (_mm256_set1_ps(x[0]), _mm256_set1_ps(x[0]));
        while i + 8 <= x.len() {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            vlo = _mm256_min_ps(vlo, v);
            vhi = _mm256_max_ps(vhi, v);
            i += 8;
        }
        let (mut a, mut b) = ([0f32; 8], [0f32; 8]);
        _mm256_storeu_ps(a.as_mut_ptr(), vlo);
        _mm256_storeu_ps(b.as_mut_ptr(), vhi);
        for k in 0..8 {
            lo = lo.min(a[k]);
            hi = hi.max(b[k]);
        }
    }
    for &v in &x[i..] {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    (lo, hi)
}
