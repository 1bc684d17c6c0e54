//! The Winograd transforms for f32 on AVX-512F: sixteen tiles a vector.
//!
//! The portable transforms (`super`) stage each input row's even and odd
//! columns and each row transform in scratch rows of `tw` tiles, which
//! AVX-512 only half fills on common planes (28 or 14 tiles a row) and
//! which leaves scalar loops around every edge. Here one vector holds 16
//! consecutive tiles: the four input rows of a tile row are read straight
//! from the image with masked loads (lanes outside the image read as zero,
//! as the padding does) and split into even and odd columns with one
//! `vpermt2ps` each; the whole `B^T d B` stays in registers and its 16
//! values are stored with the tile mask. The output transform interleaves
//! its two output columns the same way. Every value is computed by the same
//! additions in the same order as the portable transforms, so both give the
//! same bits.

use super::Tiling;
use kiln_ir::op::conv::ConvGeometry;
use std::arch::x86_64::*;

/// Lanes `l` of a 16-lane run starting at `start` with `0 <= start + l < len`.
#[inline(always)]
fn lanes_inside(start: isize, len: isize) -> u16 {
    let lo = (-start).clamp(0, 16) as u32;
    let hi = (len - start).clamp(0, 16) as u32;
    if hi <= lo {
        return 0;
    }
    (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u16
}

/// `idx` selecting lanes `first, first + 2, ...` of the 32 lanes `[a, b]`.
#[inline(always)]
unsafe fn every_other(first: i32) -> __m512i {
    _mm512_setr_epi32(
        first,
        first + 2,
        first + 4,
        first + 6,
        first + 8,
        first + 10,
        first + 12,
        first + 14,
        first + 16,
        first + 18,
        first + 20,
        first + 22,
        first + 24,
        first + 26,
        first + 28,
        first + 30,
    )
}

/// Input columns `start + 2l + [0, 1, 2, 3]` of `row` for `l` in 0..16,
/// zero outside `0..len`.
#[inline(always)]
unsafe fn tile_columns(row: *const f32, start: isize, len: isize) -> [__m512; 4] {
    let load = |s: isize| _mm512_maskz_loadu_ps(lanes_inside(s, len), row.wrapping_offset(s));
    let (a, b) = (load(start), load(start + 16));
    let (a2, b2) = (load(start + 2), load(start + 18));
    let (even, odd) = (every_other(0), every_other(1));
    [
        _mm512_permutex2var_ps(a, even, b),
        _mm512_permutex2var_ps(a, odd, b),
        _mm512_permutex2var_ps(a2, even, b2),
        _mm512_permutex2var_ps(a2, odd, b2),
    ]
}

/// `V[16][C][T]` for global tile rows `gr0..gr1` (see
/// `super::input_transform`).
///
/// # Safety
/// The CPU must have AVX-512F; `v` holds at least `16 * C * (gr1 - gr0) * tw`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn input_transform(
    g: &ConvGeometry,
    tl: Tiling,
    x: &[f32],
    (gr0, gr1): (usize, usize),
    v: &mut [f32],
) {
    let [h, w] = g.in_size;
    let (pt, pl) = (g.pad_begin[0] as isize, g.pad_begin[1] as isize);
    let (c_in, tw) = (g.c_in, tl.tw);
    let nt = (gr1 - gr0) * tw;
    let (last, _) = tl.locate(gr1 - 1);
    assert!(x.len() >= (last + 1) * c_in * h * w && v.len() >= 16 * c_in * nt);
    let vp = v.as_mut_ptr();
    for c in 0..c_in {
        for (r, gr) in (gr0..gr1).enumerate() {
            let (ni, tr) = tl.locate(gr);
            let plane = x[(ni * c_in + c) * h * w..].as_ptr();
            for t0 in (0..tw).step_by(16) {
                let tiles = lanes_inside(t0 as isize, tw as isize);
                let start = 2 * t0 as isize - pl;
                // d[i][j]: input row i after the column transform
                let mut d = [[_mm512_setzero_ps(); 4]; 4];
                for (i, di) in d.iter_mut().enumerate() {
                    let ih = (2 * tr + i) as isize - pt;
                    if ih < 0 || ih >= h as isize {
                        continue;
                    }
                    let [x0, x1, x2, x3] =
                        tile_columns(plane.add(ih as usize * w), start, w as isize);
                    *di = [
                        _mm512_sub_ps(x0, x2),
                        _mm512_add_ps(x1, x2),
                        _mm512_sub_ps(x2, x1),
                        _mm512_sub_ps(x1, x3),
                    ];
                }
                let at = |xi: usize| vp.add((xi * c_in + c) * nt + r * tw + t0);
                for j in 0..4 {
                    let (a, b, cc, dd) = (d[0][j], d[1][j], d[2][j], d[3][j]);
                    _mm512_mask_storeu_ps(at(j), tiles, _mm512_sub_ps(a, cc));
                    _mm512_mask_storeu_ps(at(4 + j), tiles, _mm512_add_ps(b, cc));
                    _mm512_mask_storeu_ps(at(8 + j), tiles, _mm512_sub_ps(cc, b));
                    _mm512_mask_storeu_ps(at(12 + j), tiles, _mm512_sub_ps(b, dd));
                }
            }
        }
    }
}

/// `Y = A^T M A` (+ bias) for global tile rows `gr0..gr1` into
/// `out[N, K, OH, OW]` (see `super::output_transform`).
///
/// # Safety
/// The CPU must have AVX-512F; `m` holds `16 * K * (gr1 - gr0) * tw` values;
/// `out` is valid for the `N * K * OH * OW` values and the output rows of
/// tile rows `gr0..gr1` are the caller's alone.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn output_transform(
    g: &ConvGeometry,
    tl: Tiling,
    m: &[f32],
    bias: Option<&[f32]>,
    out: *mut f32,
    (gr0, gr1): (usize, usize),
) {
    let [oh, ow] = g.out_size;
    let (k_out, tw) = (g.c_out, tl.tw);
    let nt = (gr1 - gr0) * tw;
    assert!(m.len() >= 16 * k_out * nt && bias.is_none_or(|b| b.len() >= k_out));
    let (first, second) = (
        _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
    );
    for k in 0..k_out {
        let b = _mm512_set1_ps(bias.map_or(0.0, |b| b[k]));
        for (r, gr) in (gr0..gr1).enumerate() {
            let (ni, tr) = tl.locate(gr);
            for t0 in (0..tw).step_by(16) {
                let tiles = lanes_inside(t0 as isize, tw as isize);
                let mm = |xi: usize| {
                    let p = m.as_ptr().add((xi * k_out + k) * nt + r * tw + t0);
                    _mm512_maskz_loadu_ps(tiles, p)
                };
                // s[row][j]: the column transform of M's column j
                let mut s = [[_mm512_setzero_ps(); 4]; 2];
                for j in 0..4 {
                    let (a0, a1, a2, a3) = (mm(j), mm(4 + j), mm(8 + j), mm(12 + j));
                    s[0][j] = _mm512_add_ps(_mm512_add_ps(a0, a1), a2);
                    s[1][j] = _mm512_sub_ps(_mm512_sub_ps(a1, a2), a3);
                }
                for (dr, [c0, c1, c2, c3]) in s.into_iter().enumerate() {
                    let oy = 2 * tr + dr;
                    if oy >= oh {
                        break;
                    }
                    let ya = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), c2), b);
                    let yb = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(c1, c2), c3), b);
                    let row = out.add(((ni * k_out + k) * oh + oy) * ow);
                    let col = 2 * t0 as isize;
                    for (half, idx) in [first, second].into_iter().enumerate() {
                        let at = col + 16 * half as isize;
                        let y = _mm512_permutex2var_ps(ya, idx, yb);
                        _mm512_mask_storeu_ps(
                            row.wrapping_offset(at),
                            lanes_inside(at, ow as isize),
                            y,
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{input_transform as portable_input, output_transform as portable_output};
    use super::super::{Scratch, Tiling};
    use crate::externs::testutil::Lcg;
    use kiln_ir::op::conv::{conv_geometry, ConvParams, Padding};

    /// Both transforms give the portable transforms' bits: planes narrower
    /// than a vector, wider than two, odd sizes, every padding the 3x3 uses,
    /// on a run of tile rows that starts inside one sample and ends in the next.
    #[test]
    fn the_avx512_transforms_give_the_portable_bits() {
        if !is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: this CPU has no AVX-512F");
            return;
        }
        let planes = [(1, 3), (5, 7), (6, 31), (9, 33), (4, 64), (7, 70)];
        for (case, &(h, w)) in planes.iter().enumerate() {
            for pad in [vec![0], vec![1], vec![2, 1]] {
                let p = ConvParams {
                    stride: vec![1],
                    padding: Padding::Explicit(pad.clone()),
                    dilation: vec![1],
                    groups: 1,
                };
                let Ok(g) = conv_geometry("conv2d", &[2, 3, h, w], &[2, 3, 3, 3], Some(&[2]), &p)
                else {
                    continue;
                };
                let [oh, ow] = g.out_size;
                let tl = Tiling::new(&g);
                let (tw, th) = (tl.tw, tl.th);
                let mut r = Lcg(case as u64);
                let x: Vec<f32> = r.vec(2 * 3 * h * w);
                let rows = (th / 2, th + th.div_ceil(2));
                let nt = (rows.1 - rows.0) * tw;
                let mut s = Scratch::<f32> {
                    v: vec![f32::NAN; 16 * 3 * nt],
                    m: vec![],
                    eo: vec![0.0; 8 * (tw + 1)],
                    rt: vec![0.0; 16 * tw],
                    st: vec![0.0; 12 * tw],
                };
                portable_input(&g, tl, &x, rows, &mut s);
                let mut v = vec![f32::NAN; 16 * 3 * nt];
                // SAFETY: the CPU has AVX-512F; the buffers are sized as asked.
                unsafe { super::input_transform(&g, tl, &x, rows, &mut v) };
                let what = format!("input transform {h}x{w} pad {pad:?}");
                assert_eq!(bits(&v), bits(&s.v), "{what}");

                let m: Vec<f32> = r.vec(16 * 2 * nt);
                let bias: Vec<f32> = r.vec(2);
                let mut want = vec![f32::NAN; 2 * 2 * oh * ow];
                let mut got = want.clone();
                let out = want.as_mut_ptr();
                portable_output(&g, tl, &m, &mut s.st, Some(&bias), out, rows);
                // SAFETY: as above; `got` holds the sample's whole output.
                unsafe { super::output_transform(&g, tl, &m, Some(&bias), got.as_mut_ptr(), rows) };
                let what = format!("output transform {h}x{w} pad {pad:?}");
                assert_eq!(bits(&got), bits(&want), "{what}");
            }
        }
    }

    fn bits(xs: &[f32]) -> Vec<u32> {
        xs.iter().map(|x| x.to_bits()).collect()
    }
}
