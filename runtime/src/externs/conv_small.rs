//! `conv2d` of small images (a sample's im2col matrix is a few KiB): one
//! GEMM per chunk of samples, `W_g[C_out/g, K] @ cols[K, samples * OH * OW]`,
//! instead of one GEMM per sample whose `n = OH * OW` (often 16 or 64) leaves
//! the GEMM to call overhead. The chunk's result is copied to NCHW after.

use super::conv::im2col_ld;
use super::gemm::{gemm_raw, Parallelism};
use super::{threads, Elem, SendPtr, PAR_MIN_WORK};
use kiln_ir::op::conv::ConvGeometry;
use rayon::prelude::*;

/// Elements of one chunk's column matrix (256 KiB of f32): it stays in L2.
pub(super) const CHUNK_ELEMS: usize = 64 * 1024;

/// Whether [`conv2d_batched`] suits `g`: several samples, and each sample's
/// column matrix (`k` rows of `OH * OW`) fits a chunk.
pub(super) fn suits(g: &ConvGeometry, k: usize) -> bool {
    g.n > 1 && k * g.out_size[0] * g.out_size[1] <= CHUNK_ELEMS
}

/// `conv2d` forward (no epilogue) over chunks of samples; see the module docs.
pub(super) fn conv2d_batched<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
) {
    let [h, w] = g.in_size;
    let p = g.out_size[0] * g.out_size[1];
    let (cpg, opg) = (g.c_in_per_group(), g.c_out_per_group());
    let kk = cpg * g.kernel[0] * g.kernel[1];
    let work = g.n * g.c_out * p * kk;
    let par = threads() > 1 && work >= PAR_MIN_WORK;
    let mut per = (CHUNK_ELEMS / (kk * p)).clamp(1, g.n);
    if par {
        per = per.min(g.n.div_ceil(2 * threads()));
    }
    let chunks = g.n.div_ceil(per);
    let dst = SendPtr(out.as_mut_ptr());
    let run = |item: usize, cols: &mut Vec<T>, res: &mut Vec<T>| {
        let (c, gi) = (item / g.groups, item % g.groups);
        let (n0, n1) = (c * per, ((c + 1) * per).min(g.n));
        let ld = (n1 - n0) * p;
        cols.resize(kk * ld, T::ZERO);
        res.resize(opg * ld, T::ZERO);
        for (s, n) in (n0..n1).enumerate() {
            let x = &input[(n * g.c_in + gi * cpg) * h * w..][..cpg * h * w];
            im2col_ld(g, x, 0, p, &mut cols[s * p..], ld);
        }
        let wg = &weight[gi * opg * kk..][..opg * kk];
        // SAFETY: wg is [opg, kk], cols is [kk, ld], res is [opg, ld]; all in bounds.
        unsafe {
            gemm_raw(
                opg,
                kk,
                ld,
                wg.as_ptr(),
                kk as isize,
                1,
                cols.as_ptr(),
                ld as isize,
                1,
                res.as_mut_ptr(),
                ld as isize,
                1,
                false,
                Parallelism::None,
            );
        }
        for (s, n) in (n0..n1).enumerate() {
            for o in 0..opg {
                let b = bias.map_or(T::ZERO, |b| b[gi * opg + o]);
                // SAFETY: item (chunk, group) owns the group's channels of its
                // samples: disjoint from every other item's, inside `out`.
                let row = unsafe {
                    std::slice::from_raw_parts_mut(
                        dst.get().add((n * g.c_out + gi * opg + o) * p),
                        p,
                    )
                };
                for (d, v) in row.iter_mut().zip(&res[o * ld + s * p..][..p]) {
                    *d = *v + b;
                }
            }
        }
    };
    let items = chunks * g.groups;
    if par {
        (0..items)
            .into_par_iter()
            .for_each_init(|| (Vec::new(), Vec::new()), |(c, r), i| run(i, c, r));
    } else {
        let (mut c, mut r) = (Vec::new(), Vec::new());
        (0..items).for_each(|i| run(i, &mut c, &mut r));
    }
}
