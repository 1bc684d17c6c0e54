//! im2col + one wide GEMM over a chunk of samples, for the deep layers of a
//! CNN (ResNet's 256 x 14 x 14 and 512 x 7 x 7 3x3 convs): there the weight
//! matrix (`C_out x C_in*9`, megabytes) is the big operand, and a GEMM per
//! L2-sized column tile packs all of it again for a few columns each time.
//! Here a chunk's column matrices go side by side (`[C/g*kH*kW, samples*OH*OW]`,
//! at least [`MIN_COLS`] columns), the column matrix is written by every
//! thread at once (split by input channel), and one GEMM per group — the
//! `gemm` crate's own threads and cache blocking — computes the chunk, which
//! is then scattered into `[N, C_out, OH, OW]` with the bias.

use super::patch_map::PatchMap;
use super::{conv_shapes, im2col_plane, kk, positions, scratch, Epilogue, Tile};
use crate::externs::gemm::{auto_parallelism, gemm_raw};
use crate::externs::{threads, Elem, SendPtr};
use kiln_ir::op::conv::ConvGeometry;
use kiln_ir::Result;

/// Columns a chunk's GEMM gets at least (whole samples): enough that packing
/// the weights once is a small part of the product.
const MIN_COLS: usize = 512;
/// A column matrix above this many elements (64 MiB of f32) is split into
/// chunks of fewer samples anyway.
const MAX_ELEMS: usize = 16 << 20;

/// Samples per chunk for `g`: whole samples giving at least [`MIN_COLS`]
/// columns, as long as the column matrix stays under [`MAX_ELEMS`].
fn samples_per_chunk(g: &ConvGeometry) -> usize {
    let (kk, p) = (kk(g), positions(g).max(1));
    let want = MIN_COLS.div_ceil(p);
    let fit = (MAX_ELEMS / (kk * p).max(1)).max(1);
    want.min(fit).clamp(1, g.n.max(1))
}

/// `conv2d` by im2col + one GEMM per chunk of samples (see the module doc).
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
    let per = samples_per_chunk(g);
    let shapes = || conv_shapes(g);
    let (mut cols, mut tmp) = (Vec::new(), Vec::new());
    let dst = SendPtr(out.as_mut_ptr());
    for n0 in (0..g.n).step_by(per) {
        let n1 = (n0 + per).min(g.n);
        let ld = (n1 - n0) * p;
        scratch(&mut cols, kk * ld, "conv2d", &shapes)?;
        scratch(&mut tmp, opg * ld, "conv2d", &shapes)?;
        for gi in 0..g.groups {
            let x = |n: usize| &input[(n * g.c_in + gi * cpg) * plane..][..cpg * plane];
            im2col_chunk(g, &x, n0..n1, &mut cols[..kk * ld], ld);
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
                    auto_parallelism(opg, kk, ld),
                );
            }
            let tmp = &tmp[..opg * ld];
            let scatter = |n: usize| {
                // SAFETY: sample n's channels of group gi are written by this closure alone.
                unsafe { super::batched::scatter_sample(g, gi, tmp, ld, n - n0, n, bias, dst) };
                if let Some(e) = epilogue {
                    e(Tile {
                        n,
                        c0: gi * opg,
                        channels: opg,
                        p0: 0,
                        cols: p,
                    });
                }
            };
            crate::par::for_each_chunk(n1 - n0, || (), |_, i| scatter(n0 + i));
        }
    }
    Ok(())
}

/// Writes the column matrix of samples `ns` (sample `n0 + s` in columns
/// `s*p..`, rows `ld` apart), in parallel over blocks of input channels:
/// channel `c`'s rows `c*kH*kW..` are one contiguous block of `cols`.
fn im2col_chunk<'a, T: Elem>(
    g: &ConvGeometry,
    x: &(dyn Fn(usize) -> &'a [T] + Sync),
    ns: std::ops::Range<usize>,
    cols: &mut [T],
    ld: usize,
) {
    let cpg = g.c_in_per_group();
    let taps = g.kernel[0] * g.kernel[1];
    let plane = g.in_size[0] * g.in_size[1];
    let p = positions(g);
    let block = cpg.div_ceil(4 * threads()).max(1);
    let map = PatchMap::for_conv(g);
    crate::par::for_each_piece(
        cols,
        block * taps * ld,
        || (),
        |_, b, rows| {
            let c0 = b * block;
            let cb = block.min(cpg - c0);
            // the geometry of this block's channels alone (one group of cb)
            let sub = ConvGeometry {
                c_in: cb,
                c_out: cb,
                groups: 1,
                ..g.clone()
            };
            for (s, n) in ns.clone().enumerate() {
                let xs = &x(n)[c0 * plane..][..cb * plane];
                im2col_plane(&sub, map.as_deref(), xs, &mut rows[s * p..], ld);
            }
        },
    );
}
