//! `conv_transpose2d` on the CPU (also the input gradient of `conv2d`):
//! `cols = W_g^T @ X_g`, scattered into the output by col2im. Small images
//! go in chunks of samples (one GEMM over the chunk's packed inputs, so the
//! GEMM's `n` is `samples * H * W`, not `H * W`); large ones per sample, on
//! tiles of input positions.

use super::conv::patch_map::PatchMap;
use super::conv::{scratch, tile_cols, valid_range};
use super::gemm::{auto_parallelism, gemm_raw, gemm_with, Parallelism};
use super::{threads, Elem, SendPtr, PAR_MIN_WORK};
use kiln_ir::op::conv::ConvTransposeGeometry;

/// Elements of one chunk's column matrix (256 KiB of f32): it stays in L2.
const CHUNK_ELEMS: usize = 64 * 1024;

/// `conv_transpose2d` forward: `input[N, C_in, H, W]`, `weight[C_in, C_out/g, kH, kW]`,
/// `out[N, C_out, OH, OW]`. Per (sample, group): `cols = W_g^T @ X_g` on tiles of
/// input positions, scattered into the output by col2im.
pub fn conv_transpose2d<T: Elem>(
    g: &ConvTransposeGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
) -> kiln_ir::Result<()> {
    let [h, w] = g.in_size;
    let [oh, ow] = g.out_size;
    let [kh, kw] = g.kernel;
    let (cpg, opg) = (g.c_in_per_group(), g.c_out_per_group());
    assert_eq!(
        input.len(),
        g.n * g.c_in * h * w,
        "conv_transpose2d: input length does not match geometry"
    );
    assert_eq!(
        weight.len(),
        g.c_in * opg * kh * kw,
        "conv_transpose2d: weight length does not match geometry"
    );
    assert_eq!(
        out.len(),
        g.n * g.c_out * oh * ow,
        "conv_transpose2d: out length does not match geometry"
    );
    if let Some(b) = bias {
        assert_eq!(
            b.len(),
            g.c_out,
            "conv_transpose2d: bias length does not match geometry"
        );
    }
    if out.is_empty() {
        return Ok(());
    }
    let shapes = || transpose_shapes(g);
    let kk = opg * kh * kw;
    let q = h * w;
    if kk * q <= CHUNK_ELEMS && g.n > 1 {
        return batched(g, input, weight, bias, out);
    }
    let tile = tile_cols::<T>(kk, q);
    let work = g.n * g.c_in * q * kk;
    let run = |item: usize,
               region: &mut [T],
               buf: &mut Vec<T>,
               par: Parallelism|
     -> kiln_ir::Result<()> {
        let (ni, gi) = (item / g.groups, item % g.groups);
        for oc in 0..opg {
            region[oc * oh * ow..(oc + 1) * oh * ow]
                .fill(bias.map_or(T::ZERO, |b| b[gi * opg + oc]));
        }
        let x = &input[(ni * g.c_in + gi * cpg) * q..][..cpg * q];
        let wg = &weight[gi * cpg * kk..][..cpg * kk];
        let mut q0 = 0;
        while q0 < q {
            let q1 = (q0 + tile).min(q);
            let cols = q1 - q0;
            scratch(buf, kk * cols, "conv_transpose2d", &shapes)?;
            let cbuf = &mut buf[..kk * cols];
            gemm_with(
                kk,
                cpg,
                cols,
                wg,
                1,
                kk as isize,
                &x[q0..],
                q as isize,
                1,
                cbuf,
                cols as isize,
                1,
                false,
                par,
            );
            col2im(g, cbuf, q0, q1, region, cols);
            q0 = q1;
        }
        Ok(())
    };
    let region_len = opg * oh * ow;
    let items = g.n * g.groups;
    if threads() > 1 && work >= PAR_MIN_WORK && items >= threads() {
        crate::par::try_for_each_piece(out, region_len, Vec::new, |buf, i, r| {
            run(i, r, buf, Parallelism::None)
        })
        .map(drop)
    } else {
        let par = if work >= PAR_MIN_WORK {
            auto_parallelism(kk, cpg, tile)
        } else {
            Parallelism::None
        };
        let mut buf = Vec::new();
        out.chunks_mut(region_len)
            .enumerate()
            .try_for_each(|(i, r)| run(i, r, &mut buf, par))
    }
}

/// `input [N, C_in, H, W], weight [C_in, C_out/g, kH, kW]` of a transposed conv.
fn transpose_shapes(g: &ConvTransposeGeometry) -> String {
    format!(
        "input [{}, {}, {}, {}], weight [{}, {}, {}, {}]",
        g.n,
        g.c_in,
        g.in_size[0],
        g.in_size[1],
        g.c_in,
        g.c_out_per_group(),
        g.kernel[0],
        g.kernel[1]
    )
}

/// Adds `cols[C_out/g * kH * kW, q1 - q0]` (input positions `q0..q1`) into the
/// group's output `region[C_out/g, OH, OW]`.
pub(super) fn col2im<T: Elem>(
    g: &ConvTransposeGeometry,
    cols: &[T],
    q0: usize,
    q1: usize,
    region: &mut [T],
    ld: usize,
) {
    let w = g.in_size[1];
    let [oh, ow] = g.out_size;
    let [kh, kw] = g.kernel;
    let [sh, sw] = g.stride;
    let [dh, dw] = g.dilation;
    let (pt, pl) = (g.padding[0] as isize, g.padding[1] as isize);
    let n = q1 - q0;
    let opg = g.c_out_per_group();
    // Input columns iw whose output column iw*sw + j*dw - pl lies in [0, OW).
    let ranges: Vec<(usize, usize)> = (0..kw)
        .map(|j| valid_range(w, sw, (j * dw) as isize - pl, ow))
        .collect();
    let mut rows = cols.chunks(ld).map(|r| &r[..n]);
    for oc in 0..opg {
        let plane = &mut region[oc * oh * ow..][..oh * ow];
        for i in 0..kh {
            for (j, &(lo_j, hi_j)) in ranges.iter().enumerate() {
                let crow = rows.next().expect("col2im: column buffer too small");
                let mut qq = q0;
                while qq < q1 {
                    let (ih, iw0) = (qq / w, qq % w);
                    let iw1 = w.min(iw0 + (q1 - qq));
                    let seg = &crow[qq - q0..qq - q0 + (iw1 - iw0)];
                    qq += iw1 - iw0;
                    let orow_i = (ih * sh + i * dh) as isize - pt;
                    if orow_i < 0 || orow_i >= oh as isize {
                        continue;
                    }
                    let orow = &mut plane[orow_i as usize * ow..][..ow];
                    let lo = lo_j.clamp(iw0, iw1);
                    let hi = hi_j.clamp(lo, iw1);
                    if lo >= hi {
                        continue;
                    }
                    let o0 = (lo * sw + j * dw) - pl as usize;
                    let src = &seg[lo - iw0..hi - iw0];
                    if sw == 1 {
                        for (d, s) in orow[o0..o0 + (hi - lo)].iter_mut().zip(src) {
                            *d += *s;
                        }
                    } else {
                        for (d, s) in orow[o0..].iter_mut().step_by(sw).zip(src) {
                            *d += *s;
                        }
                    }
                }
            }
        }
    }
}

/// [`conv_transpose2d`] for images whose column matrix fits a chunk: per
/// (chunk of samples, group), the chunk's inputs are packed side by side,
/// one GEMM makes all their columns, and col2im scatters each sample's.
fn batched<T: Elem>(
    g: &ConvTransposeGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
) -> kiln_ir::Result<()> {
    let [oh, ow] = g.out_size;
    let q = g.in_size[0] * g.in_size[1];
    let (cpg, opg) = (g.c_in_per_group(), g.c_out_per_group());
    let kk = opg * g.kernel[0] * g.kernel[1];
    let work = g.n * g.c_in * q * kk;
    let par = threads() > 1 && work >= PAR_MIN_WORK;
    let mut per = (CHUNK_ELEMS / (kk * q)).clamp(1, g.n);
    if par {
        per = per.min(g.n.div_ceil(2 * threads()));
    }
    let chunks = g.n.div_ceil(per);
    let dst = SendPtr(out.as_mut_ptr());
    let plane = oh * ow;
    let shapes = || transpose_shapes(g);
    let map = PatchMap::for_transpose(g);
    let run = |item: usize, xs: &mut Vec<T>, cols: &mut Vec<T>| -> kiln_ir::Result<()> {
        let (c, gi) = (item / g.groups, item % g.groups);
        let (n0, n1) = (c * per, ((c + 1) * per).min(g.n));
        let ld = (n1 - n0) * q;
        scratch(xs, cpg * ld, "conv_transpose2d", &shapes)?;
        scratch(cols, kk * ld, "conv_transpose2d", &shapes)?;
        for (s, n) in (n0..n1).enumerate() {
            for ci in 0..cpg {
                let src = &input[(n * g.c_in + gi * cpg + ci) * q..][..q];
                xs[ci * ld + s * q..][..q].copy_from_slice(src);
            }
        }
        let wg = &weight[gi * cpg * kk..][..cpg * kk];
        // SAFETY: wg^T is [kk, cpg] (row stride 1, column stride kk), xs is
        // [cpg, ld], cols is [kk, ld]; all in bounds.
        unsafe {
            gemm_raw(
                kk,
                cpg,
                ld,
                wg.as_ptr(),
                1,
                kk as isize,
                xs.as_ptr(),
                ld as isize,
                1,
                cols.as_mut_ptr(),
                ld as isize,
                1,
                false,
                Parallelism::None,
            );
        }
        for (s, n) in (n0..n1).enumerate() {
            // SAFETY: item (chunk, group) owns the group's channels of its
            // samples: disjoint from every other item's, inside `out`.
            let region = unsafe {
                std::slice::from_raw_parts_mut(
                    dst.get().add((n * g.c_out + gi * opg) * plane),
                    opg * plane,
                )
            };
            for oc in 0..opg {
                region[oc * plane..(oc + 1) * plane]
                    .fill(bias.map_or(T::ZERO, |b| b[gi * opg + oc]));
            }
            match &map {
                Some(m) => m.scatter_add(&cols[s * q..], opg, region, ld),
                None => col2im(g, &cols[s * q..], 0, q, region, ld),
            }
        }
        Ok(())
    };
    let items = chunks * g.groups;
    if par {
        let scratch = || (Vec::new(), Vec::new());
        crate::par::try_for_each_chunk(items, scratch, |(xs, cols), i| run(i, xs, cols)).map(drop)
    } else {
        let (mut xs, mut cols) = (Vec::new(), Vec::new());
        (0..items).try_for_each(|i| run(i, &mut xs, &mut cols))
    }
}
