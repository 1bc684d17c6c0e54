//! The register tile of the direct convolution (`direct.rs`): `MR` output
//! channels by `NR` consecutive output columns, accumulated over the whole
//! reduction `k = (c, i, j)` without leaving registers. Row `r` of the tile
//! reads the packed weights `a[p * MR + r]`; column `q` reads the input at
//! `b + koff[p] + q`, so the "B matrix" is the (padded, phase-split) input
//! itself, addressed through one offset per reduction step, and no column
//! matrix is ever written.
//!
//! The AVX2+FMA body (12 `ymm` accumulators: 6 broadcasts and 2 loads per 12
//! FMAs) runs for f32 where the CPU has it; a portable body, which must
//! agree with it to rounding, runs otherwise.

use crate::externs::cpu_isa::{self, Isa};
use crate::externs::Elem;
use std::any::TypeId;

/// Output channels per register tile.
pub const MR: usize = 6;
/// Output columns per register tile (two 8-lane vectors).
pub const NR: usize = 16;

/// `tile[r * NR + q] = sum_p a[p * MR + r] * b[koff[p] + q]` for `r < MR`, `q < NR`.
///
/// # Safety
/// `a` must hold `koff.len() * MR` elements and `b.offset(koff[p] + q)` must
/// be readable for every `p` and `q < NR`.
pub unsafe fn tile<T: Elem>(a: *const T, koff: &[isize], b: *const T, tile: &mut [T; MR * NR]) {
    #[cfg(target_arch = "x86_64")]
    if TypeId::of::<T>() == TypeId::of::<f32>() && cpu_isa::detect() >= Isa::Avx2 {
        // SAFETY: T is f32 (checked above); the CPU has AVX2 and FMA.
        return tile_avx2(
            a as *const f32,
            koff,
            b as *const f32,
            &mut *(tile as *mut [T; MR * NR] as *mut [f32; MR * NR]),
        );
    }
    tile_portable(a, koff, b, tile)
}

/// The portable body of [`tile`].
///
/// # Safety
/// As [`tile`].
pub unsafe fn tile_portable<T: Elem>(
    a: *const T,
    koff: &[isize],
    b: *const T,
    tile: &mut [T; MR * NR],
) {
    let mut acc = [T::ZERO; MR * NR];
    for (p, &off) in koff.iter().enumerate() {
        let bp = b.offset(off);
        let mut row = [T::ZERO; NR];
        for (q, v) in row.iter_mut().enumerate() {
            *v = *bp.add(q);
        }
        for r in 0..MR {
            let av = *a.add(p * MR + r);
            for q in 0..NR {
                acc[r * NR + q] += av * row[q];
            }
        }
    }
    *tile = acc;
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(a: *const f32, koff: &[isize], b: *const f32, tile: &mut [f32; MR * NR]) {
    use std::arch::x86_64::*;
    // Constant-index arrays of vectors: LLVM keeps all 12 in registers.
    let mut lo = [_mm256_setzero_ps(); MR];
    let mut hi = [_mm256_setzero_ps(); MR];
    for (p, &off) in koff.iter().enumerate() {
        let bp = b.offset(off);
        let b0 = _mm256_loadu_ps(bp);
        let b1 = _mm256_loadu_ps(bp.add(8));
        let ap = a.add(p * MR);
        for r in 0..MR {
            let av = _mm256_broadcast_ss(&*ap.add(r));
            lo[r] = _mm256_fmadd_ps(av, b0, lo[r]);
            hi[r] = _mm256_fmadd_ps(av, b1, hi[r]);
        }
    }
    let t = tile.as_mut_ptr();
    for r in 0..MR {
        _mm256_storeu_ps(t.add(r * NR), lo[r]);
        _mm256_storeu_ps(t.add(r * NR + 8), hi[r]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_body_computes_the_tile_product() {
        let kk = 37;
        let a: Vec<f32> = (0..kk * MR)
            .map(|i| ((i * 7919) % 13) as f32 - 6.0)
            .collect();
        let b: Vec<f32> = (0..600)
            .map(|i| ((i * 104729) % 17) as f32 * 0.25)
            .collect();
        // non-monotone offsets, as the phase-split input gives
        let koff: Vec<isize> = (0..kk).map(|p| ((p * 31) % 500) as isize).collect();
        let mut want = [0.0f64; MR * NR];
        for p in 0..kk {
            for r in 0..MR {
                for q in 0..NR {
                    want[r * NR + q] += a[p * MR + r] as f64 * b[koff[p] as usize + q] as f64;
                }
            }
        }
        let mut fast = [0.0f32; MR * NR];
        let mut portable = [0.0f32; MR * NR];
        // SAFETY: offsets + NR stay inside b; a holds kk * MR values.
        unsafe {
            tile(a.as_ptr(), &koff, b.as_ptr(), &mut fast);
            tile_portable(a.as_ptr(), &koff, b.as_ptr(), &mut portable);
        }
        // small integers and quarters: every partial sum is exact in f32
        for i in 0..MR * NR {
            assert_eq!(fast[i] as f64, want[i], "tile element {i}");
            assert_eq!(portable[i] as f64, want[i], "portable element {i}");
        }
    }
}
