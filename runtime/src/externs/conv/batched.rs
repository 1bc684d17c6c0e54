//! im2col + GEMM over chunks of samples, for small images: a sample's
//! output (the small CNN's 16 x 4 x 4) is too small for a GEMM of its own
//! (call overhead dominates), so a chunk's column matrices go side by side
//! and one GEMM per group computes `[C_out/g, samples * OH * OW]`, which is
//! then scattered into the `[N, C_out, OH, OW]` output with the bias.

use super::patch_map::PatchMap;
use super::{conv_shapes, im2col_plane, kk, positions, scratch, Epilogue, Tile};
use crate::externs::gemm::{gemm_raw, Parallelism};
use crate::externs::{threads, Elem, SendPtr, PAR_MIN_WORK};
use kiln_ir::op::conv::ConvGeometry;
use kiln_ir::Result;

/// Elements of one chunk's column matrix (256 KiB of f32): it stays in L2.
const CHUNK_ELEMS: usize = 64 * 1024;

/// Whether chunking samples applies: a batch whose per-sample column matrix
/// leaves room for at least two samples in a chunk.
pub fn applies(g: &ConvGeometry) -> bool {
    g.n > 1 && kk(g) * positions(g) * 2 <= CHUNK_ELEMS
}

/// `conv2d` by im2col + GEMM on chunks of samples (see the module doc).
pub fn conv2d<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epilogue: Option<Epilogue>,
) -> Result<()> {
    let (kk, p) = (kk(g), positions(g));
    let (cpg, opg) = (g.c_in_per_group(), g.c_out_per_group());
    let plane = g.in_size[0] * g.in_size[1];
    let work = g.n * g.c_out * p * kk;
    let par = threads() > 1 && work >= PAR_MIN_WORK;
    let mut per = (CHUNK_ELEMS / (kk * p)).clamp(1, g.n);
    if par {
        per = per.min(g.n.div_ceil(2 * threads()));
    }
    let chunks = g.n.div_ceil(per);
    let dst = SendPtr(out.as_mut_ptr());
    let shapes = || conv_shapes(g);
    let map = PatchMap::for_conv(g);
    let chunk = |c: usize, cols: &mut Vec<T>, tmp: &mut Vec<T>| -> Result<()> {
        let (n0, n1) = (c * per, ((c + 1) * per).min(g.n));
        let ld = (n1 - n0) * p;
        scratch(cols, kk * ld, "conv2d", &shapes)?;
        scratch(tmp, opg * ld, "conv2d", &shapes)?;
        for gi in 0..g.groups {
            for (s, n) in (n0..n1).enumerate() {
                let x = &input[(n * g.c_in + gi * cpg) * plane..][..cpg * plane];
                im2col_plane(g, map.as_deref(), x, &mut cols[s * p..], ld);
            }
            let wg = &weight[gi * opg * kk..][..opg * kk];
            // SAFETY: wg is [opg, kk], cols [kk, ld], tmp [opg, ld]: in bounds.
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
                    tmp.as_mut_ptr(),
                    ld as isize,
                    1,
                    false,
                    Parallelism::None,
                );
            }
            for (s, n) in (n0..n1).enumerate() {
                // SAFETY: chunk c alone writes samples n0..n1 of `out`.
                unsafe { scatter_sample(g, gi, &tmp[..opg * ld], ld, s, n, bias, dst) };
            }
        }
        if let Some(e) = epilogue {
            for n in n0..n1 {
                e(Tile {
                    n,
                    c0: 0,
                    channels: g.c_out,
                    p0: 0,
                    cols: p,
                });
            }
        }
        Ok(())
    };
    if par {
        let scratch = || (Vec::new(), Vec::new());
        crate::par::try_for_each_chunk(chunks, scratch, |(a, b), c| chunk(c, a, b)).map(drop)
    } else {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        (0..chunks).try_for_each(|c| chunk(c, &mut a, &mut b))
    }
}

/// Copies sample `s` of a chunk's GEMM result `tmp [C_out/g, ld]` (its
/// columns `s*OH*OW..`) into sample `n`, group `gi` of the `[N, C_out, OH,
/// OW]` output at `dst`, adding the bias.
///
/// # Safety
/// `dst` is the conv's output; no other thread writes sample `n`'s channels
/// of group `gi` meanwhile.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn scatter_sample<T: Elem>(
    g: &ConvGeometry,
    gi: usize,
    tmp: &[T],
    ld: usize,
    s: usize,
    n: usize,
    bias: Option<&[T]>,
    dst: SendPtr<T>,
) {
    let (p, opg) = (positions(g), g.c_out_per_group());
    for oc in 0..opg {
        let b = bias.map_or(T::ZERO, |b| b[gi * opg + oc]);
        let src = &tmp[oc * ld + s * p..][..p];
        let row =
            std::slice::from_raw_parts_mut(dst.get().add((n * g.c_out + gi * opg + oc) * p), p);
        for (d, v) in row.iter_mut().zip(src) {
            *d = *v + b;
        }
    }
}
