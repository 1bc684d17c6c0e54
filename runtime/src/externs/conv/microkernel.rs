//! The register tile of the direct convolution (`direct.rs`): `MR` output
//! channels by `NR` consecutive output columns, accumulated over the whole
//! reduction `k = (c, i, j)` without leaving registers. Row `r` of the tile
//! reads the packed weights `a[p * MR + r]`; column `q` reads the input at
//! `b + koff[p] + q`, so the "B matrix" is the (padded, phase-split) input
//! itself, addressed through one offset per reduction step, and no column
//! matrix is ever written.
//!
//! For f32 the widest body the CPU has runs: AVX-512 (12 `zmm` accumulators,
//! 6 broadcasts and 2 loads per 12 FMAs), or AVX2+FMA (the same tile as two
//! 16-column halves of 12 `ymm` accumulators each); a portable body, which
//! must agree with them to rounding, runs otherwise. Every body adds the
//! reduction steps in the same order, so all three give the same bits
//! wherever FMA contraction does not differ.

use crate::externs::cpu_isa::{self, Isa};
use crate::externs::Elem;

/// Output channels per register tile.
pub const MR: usize = 6;
/// Output columns per register tile: two 16-lane AVX-512 vectors (an AVX2
/// machine runs it as two halves of two 8-lane vectors). AVX-512 FMA is
/// twice AVX2's rate on the cores that have it, so the tile is sized for it.
pub const NR: usize = 32;

/// `tile[r * NR + q] = sum_p a[p * MR + r] * b[koff[p] + q]` for `r < MR`, `q < NR`.
///
/// # Safety
/// `a` must hold `koff.len() * MR` elements and `b.offset(koff[p] + q)` must
/// be readable for every `p` and `q < NR`.
pub unsafe fn tile<T: Elem>(a: *const T, koff: &[isize], b: *const T, tile: &mut [T; MR * NR]) {
    #[cfg(target_arch = "x86_64")]
    if super::is_f32::<T>() {
        let (a, b) = (a as *const f32, b as *const f32);
        let t = &mut *(tile as *mut [T; MR * NR] as *mut [f32; MR * NR]);
        match cpu_isa::detect() {
            // SAFETY: T is f32 (checked above); the CPU has the ISA.
            Isa::Avx512 => return tile_avx512(a, koff, b, t),
            Isa::Avx2 => {
                tile_avx2_half(a, koff, b, t, 0);
                return tile_avx2_half(a, koff, b, t, NR / 2);
            }
            Isa::Scalar => {}
        }
    }
    tile_portable(a, koff, b, tile)
}

/// Two panels' tiles over the same columns: `t0` from the weights `a0`,
/// `t1` from `a1`, as two [`tile`] calls would give (same bits). With
/// AVX-512 one pass loads each input vector once for both panels: 24
/// accumulators, twice the FMAs per load of a single tile.
///
/// # Safety
/// As [`tile`], for both `a0` and `a1`.
pub unsafe fn tile_pair<T: Elem>(
    a0: *const T,
    a1: *const T,
    koff: &[isize],
    b: *const T,
    t0: &mut [T; MR * NR],
    t1: &mut [T; MR * NR],
) {
    #[cfg(target_arch = "x86_64")]
    if super::is_f32::<T>() && cpu_isa::detect() == Isa::Avx512 {
        let f = |t: &mut [T; MR * NR]| &mut *(t as *mut [T; MR * NR] as *mut [f32; MR * NR]);
        // SAFETY: T is f32 (checked above); the CPU has AVX-512F.
        return tile_pair_avx512(
            a0 as *const f32,
            a1 as *const f32,
            koff,
            b as *const f32,
            f(t0),
            f(t1),
        );
    }
    tile(a0, koff, b, t0);
    tile(a1, koff, b, t1);
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

/// Columns `q0..q0 + 16` of [`tile`] with AVX2 + FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2_half(
    a: *const f32,
    koff: &[isize],
    b: *const f32,
    tile: &mut [f32; MR * NR],
    q0: usize,
) {
    use std::arch::x86_64::*;
    // Constant-index arrays of vectors: LLVM keeps all 12 in registers.
    let mut lo = [_mm256_setzero_ps(); MR];
    let mut hi = [_mm256_setzero_ps(); MR];
    let b = b.add(q0);
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
    let t = tile.as_mut_ptr().add(q0);
    for r in 0..MR {
        _mm256_storeu_ps(t.add(r * NR), lo[r]);
        _mm256_storeu_ps(t.add(r * NR + 8), hi[r]);
    }
}

/// [`tile`] with AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tile_avx512(a: *const f32, koff: &[isize], b: *const f32, tile: &mut [f32; MR * NR]) {
    use std::arch::x86_64::*;
    let mut lo = [_mm512_setzero_ps(); MR];
    let mut hi = [_mm512_setzero_ps(); MR];
    for (p, &off) in koff.iter().enumerate() {
        let bp = b.offset(off);
        let b0 = _mm512_loadu_ps(bp);
        let b1 = _mm512_loadu_ps(bp.add(16));
        let ap = a.add(p * MR);
        for r in 0..MR {
            let av = _mm512_set1_ps(*ap.add(r));
            lo[r] = _mm512_fmadd_ps(av, b0, lo[r]);
            hi[r] = _mm512_fmadd_ps(av, b1, hi[r]);
        }
    }
    let t = tile.as_mut_ptr();
    for r in 0..MR {
        _mm512_storeu_ps(t.add(r * NR), lo[r]);
        _mm512_storeu_ps(t.add(r * NR + 16), hi[r]);
    }
}

/// [`tile_pair`] with AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tile_pair_avx512(
    a0: *const f32,
    a1: *const f32,
    koff: &[isize],
    b: *const f32,
    t0: &mut [f32; MR * NR],
    t1: &mut [f32; MR * NR],
) {
    use std::arch::x86_64::*;
    let mut lo = [[_mm512_setzero_ps(); MR]; 2];
    let mut hi = [[_mm512_setzero_ps(); MR]; 2];
    for (p, &off) in koff.iter().enumerate() {
        let bp = b.offset(off);
        let b0 = _mm512_loadu_ps(bp);
        let b1 = _mm512_loadu_ps(bp.add(16));
        for (h, a) in [a0, a1].into_iter().enumerate() {
            let ap = a.add(p * MR);
            for r in 0..MR {
                let av = _mm512_set1_ps(*ap.add(r));
                lo[h][r] = _mm512_fmadd_ps(av, b0, lo[h][r]);
                hi[h][r] = _mm512_fmadd_ps(av, b1, hi[h][r]);
            }
        }
    }
    for (h, t) in [t0, t1].into_iter().enumerate() {
        let t = t.as_mut_ptr();
        for r in 0..MR {
            _mm512_storeu_ps(t.add(r * NR), lo[h][r]);
            _mm512_storeu_ps(t.add(r * NR + 16), hi[h][r]);
        }
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
        let mut bodies: Vec<(&str, [f32; MR * NR])> = vec![];
        // SAFETY: offsets + NR stay inside b; a holds kk * MR values; each
        // ISA body runs only where the CPU has it.
        unsafe {
            let (a, b) = (a.as_ptr(), b.as_ptr());
            let mut t = [0.0f32; MR * NR];
            tile(a, &koff, b, &mut t);
            bodies.push(("dispatched", t));
            tile_portable(a, &koff, b, &mut t);
            bodies.push(("portable", t));
            #[cfg(target_arch = "x86_64")]
            {
                let isa = cpu_isa::detect();
                if isa >= Isa::Avx2 {
                    let mut t = [0.0f32; MR * NR];
                    tile_avx2_half(a, &koff, b, &mut t, 0);
                    tile_avx2_half(a, &koff, b, &mut t, NR / 2);
                    bodies.push(("avx2", t));
                }
                if isa >= Isa::Avx512 {
                    let mut t = [0.0f32; MR * NR];
                    tile_avx512(a, &koff, b, &mut t);
                    bodies.push(("avx512", t));
                }
            }
        }
        // a pair of panels: the second panel is the first's weights reversed
        let a1: Vec<f32> = a.iter().rev().copied().collect();
        let (mut p0, mut p1, mut want1) = ([0.0f32; MR * NR], [0.0f32; MR * NR], [0.0f32; MR * NR]);
        // SAFETY: as above, for both weight panels.
        unsafe {
            tile_pair(a.as_ptr(), a1.as_ptr(), &koff, b.as_ptr(), &mut p0, &mut p1);
            tile_portable(a1.as_ptr(), &koff, b.as_ptr(), &mut want1);
        }
        bodies.push(("pair, first panel", p0));
        assert_eq!(p1, want1, "pair, second panel");
        // small integers and quarters: every partial sum is exact in f32
        for (name, t) in &bodies {
            for i in 0..MR * NR {
                assert_eq!(t[i] as f64, want[i], "{name} tile element {i}");
            }
        }
    }
}
