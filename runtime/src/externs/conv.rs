//! Convolution on the CPU: `conv2d` (and `conv1d` as `H = 1`) by im2col +
//! GEMM per group on L2-sized tiles of output positions; depthwise
//! convolutions by a direct kernel; `conv_transpose2d` by GEMM + col2im.
//!
//! Geometry (stride, asymmetric padding, dilation, groups) comes checked from
//! `kiln_ir::op::conv::{conv_geometry, conv_transpose_geometry}`.

use super::gemm::{auto_parallelism, gemm_raw, gemm_with, Parallelism};
use super::{threads, Elem, SendPtr, PAR_MIN_WORK};
use kiln_ir::op::conv::{ConvGeometry, ConvTransposeGeometry};
use rayon::prelude::*;

/// Bytes of one im2col / col2im tile: small enough to stay in L2 next to the
/// packed weights, big enough that the GEMM runs at full speed.
const TILE_BYTES: usize = 192 * 1024;

/// Columns per tile for a `rows`-row column buffer of `T` (a multiple of 16).
fn tile_cols<T>(rows: usize, total: usize) -> usize {
    let t = (TILE_BYTES / (rows.max(1) * std::mem::size_of::<T>())).max(16) / 16 * 16;
    t.min(total).max(1)
}

/// Output positions `o` in `[0, out)` whose input position `o*s + off` lies in
/// `[0, len)`, as a half-open range.
#[inline]
fn valid_range(out: usize, s: usize, off: isize, len: usize) -> (usize, usize) {
    let s = s as isize;
    // o*s + off >= 0  <=>  o >= ceil(-off / s)
    let lo = if off >= 0 { 0 } else { ((-off) + s - 1) / s };
    // o*s + off <= len-1  <=>  o <= floor((len-1-off)/s)
    let top = len as isize - 1 - off;
    let hi = if top < 0 { 0 } else { top / s + 1 };
    let lo = (lo as usize).min(out);
    (lo, (hi as usize).clamp(lo, out))
}

/// `conv2d` forward: `out[N, C_out, OH, OW] = conv(input[N, C_in, H, W], weight[C_out, C_in/g, kH, kW]) + bias`.
/// A `conv1d` geometry (H = 1) runs through the same code.
pub fn conv2d<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
) {
    let [h, w] = g.in_size;
    let [oh, ow] = g.out_size;
    let [kh, kw] = g.kernel;
    let (cpg, opg) = (g.c_in_per_group(), g.c_out_per_group());
    assert_eq!(
        input.len(),
        g.n * g.c_in * h * w,
        "conv2d: input length does not match geometry"
    );
    assert_eq!(
        weight.len(),
        g.c_out * cpg * kh * kw,
        "conv2d: weight length does not match geometry"
    );
    assert_eq!(
        out.len(),
        g.n * g.c_out * oh * ow,
        "conv2d: out length does not match geometry"
    );
    if let Some(b) = bias {
        assert_eq!(
            b.len(),
            g.c_out,
            "conv2d: bias length does not match geometry"
        );
    }
    if out.is_empty() {
        return;
    }
    if cpg == 1 && g.groups > 1 {
        return depthwise(g, input, weight, bias, out);
    }
    let kk = cpg * kh * kw;
    let p = oh * ow;
    let pointwise =
        kh == 1 && kw == 1 && g.stride == [1, 1] && g.pad_begin == [0, 0] && g.pad_end == [0, 0];
    let tile = tile_cols::<T>(kk, p);
    let n_tiles = p.div_ceil(tile);
    let items = g.n * g.groups * n_tiles;
    let work = g.n * g.c_out * p * kk;
    let dst = SendPtr(out.as_mut_ptr());

    let run = |item: usize, buf: &mut Vec<T>, par: Parallelism| {
        let ti = item % n_tiles;
        let gi = (item / n_tiles) % g.groups;
        let ni = item / (n_tiles * g.groups);
        let (p0, p1) = (ti * tile, ((ti + 1) * tile).min(p));
        let cols = p1 - p0;
        let x = &input[(ni * g.c_in + gi * cpg) * h * w..][..cpg * h * w];
        let wg = &weight[gi * opg * kk..][..opg * kk];
        let base = (ni * g.c_out + gi * opg) * p + p0;
        // SAFETY: item (ni, gi, ti) owns rows gi*opg.. of sample ni, columns p0..p1:
        // disjoint from every other item; all offsets are inside `out`.
        unsafe {
            if let Some(b) = bias {
                for oc in 0..opg {
                    let row = std::slice::from_raw_parts_mut(dst.get().add(base + oc * p), cols);
                    row.fill(b[gi * opg + oc]);
                }
            }
            let (bp, b_rs) = if pointwise {
                (x[p0..].as_ptr(), (h * w) as isize)
            } else {
                buf.resize(kk * cols, T::ZERO);
                im2col(g, x, p0, p1, &mut buf[..kk * cols]);
                (buf.as_ptr(), cols as isize)
            };
            gemm_raw(
                opg,
                kk,
                cols,
                wg.as_ptr(),
                kk as isize,
                1,
                bp,
                b_rs,
                1,
                dst.get().add(base),
                p as isize,
                1,
                bias.is_some(),
                par,
            );
        }
    };

    if threads() > 1 && work >= PAR_MIN_WORK && items >= 2 * threads() {
        (0..items)
            .into_par_iter()
            .for_each_init(Vec::new, |buf, i| run(i, buf, Parallelism::None));
    } else {
        let par = if work >= PAR_MIN_WORK {
            auto_parallelism(opg, kk, tile)
        } else {
            Parallelism::None
        };
        let mut buf = Vec::new();
        (0..items).for_each(|i| run(i, &mut buf, par));
    }
}

/// Writes the im2col matrix `[C/g * kH * kW, p1 - p0]` of output positions
/// `p0..p1` (flattened `oh*OW + ow`) of one sample's group `x[C/g, H, W]`.
fn im2col<T: Elem>(g: &ConvGeometry, x: &[T], p0: usize, p1: usize, col: &mut [T]) {
    let [h, w] = g.in_size;
    let ow = g.out_size[1];
    let [kh, kw] = g.kernel;
    let [sh, sw] = g.stride;
    let [dh, dw] = g.dilation;
    let (pt, pl) = (g.pad_begin[0] as isize, g.pad_begin[1] as isize);
    let cols = p1 - p0;
    let cpg = g.c_in_per_group();
    let ranges: Vec<(usize, usize)> = (0..kw)
        .map(|j| valid_range(ow, sw, (j * dw) as isize - pl, w))
        .collect();
    let mut rows = col.chunks_exact_mut(cols);
    for c in 0..cpg {
        let plane = &x[c * h * w..][..h * w];
        for i in 0..kh {
            for (j, &(lo_j, hi_j)) in ranges.iter().enumerate() {
                let row = rows.next().expect("im2col: column buffer too small");
                let mut pp = p0;
                while pp < p1 {
                    let (r, ow0) = (pp / ow, pp % ow);
                    let ow1 = ow.min(ow0 + (p1 - pp));
                    let seg = &mut row[pp - p0..pp - p0 + (ow1 - ow0)];
                    pp += ow1 - ow0;
                    let ih = (r * sh + i * dh) as isize - pt;
                    if ih < 0 || ih >= h as isize {
                        seg.fill(T::ZERO);
                        continue;
                    }
                    let xrow = &plane[ih as usize * w..][..w];
                    let (lo, hi) = (
                        lo_j.clamp(ow0, ow1),
                        hi_j.clamp(ow0, ow1).max(lo_j.clamp(ow0, ow1)),
                    );
                    seg[..lo - ow0].fill(T::ZERO);
                    seg[hi - ow0..].fill(T::ZERO);
                    if lo < hi {
                        let iw0 = (lo * sw + j * dw) - pl as usize;
                        let dst = &mut seg[lo - ow0..hi - ow0];
                        if sw == 1 {
                            dst.copy_from_slice(&xrow[iw0..iw0 + (hi - lo)]);
                        } else {
                            for (d, s) in dst.iter_mut().zip(xrow[iw0..].iter().step_by(sw)) {
                                *d = *s;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Direct convolution for one input channel per group (depthwise and
/// channel-multiplier convolutions), where a GEMM would have `k = kH*kW`.
fn depthwise<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
) {
    let [h, w] = g.in_size;
    let [oh, ow] = g.out_size;
    let [kh, kw] = g.kernel;
    let [sh, sw] = g.stride;
    let [dh, dw] = g.dilation;
    let (pt, pl) = (g.pad_begin[0] as isize, g.pad_begin[1] as isize);
    let opg = g.c_out_per_group();
    let ranges: Vec<(usize, usize)> = (0..kw)
        .map(|j| valid_range(ow, sw, (j * dw) as isize - pl, w))
        .collect();
    let plane = |idx: usize, o: &mut [T]| {
        let (ni, oc) = (idx / g.c_out, idx % g.c_out);
        let x = &input[(ni * g.c_in + oc / opg) * h * w..][..h * w];
        let wk = &weight[oc * kh * kw..][..kh * kw];
        o.fill(bias.map_or(T::ZERO, |b| b[oc]));
        for (r, orow) in o.chunks_exact_mut(ow).enumerate() {
            for i in 0..kh {
                let ih = (r * sh + i * dh) as isize - pt;
                if ih < 0 || ih >= h as isize {
                    continue;
                }
                let xrow = &x[ih as usize * w..][..w];
                for (j, &(lo, hi)) in ranges.iter().enumerate() {
                    if lo >= hi {
                        continue;
                    }
                    let wv = wk[i * kw + j];
                    let iw0 = (lo * sw + j * dw) - pl as usize;
                    let dst = &mut orow[lo..hi];
                    if sw == 1 {
                        for (d, s) in dst.iter_mut().zip(&xrow[iw0..iw0 + (hi - lo)]) {
                            *d += wv * *s;
                        }
                    } else {
                        for (d, s) in dst.iter_mut().zip(xrow[iw0..].iter().step_by(sw)) {
                            *d += wv * *s;
                        }
                    }
                }
            }
        }
    };
    let work = out.len() * kh * kw;
    if threads() > 1 && work >= PAR_MIN_WORK {
        out.par_chunks_mut(oh * ow)
            .enumerate()
            .for_each(|(i, o)| plane(i, o));
    } else {
        out.chunks_mut(oh * ow)
            .enumerate()
            .for_each(|(i, o)| plane(i, o));
    }
}

/// `conv_transpose2d` forward: `input[N, C_in, H, W]`, `weight[C_in, C_out/g, kH, kW]`,
/// `out[N, C_out, OH, OW]`. Per (sample, group): `cols = W_g^T @ X_g` on tiles of
/// input positions, scattered into the output by col2im.
pub fn conv_transpose2d<T: Elem>(
    g: &ConvTransposeGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
) {
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
        return;
    }
    let kk = opg * kh * kw;
    let q = h * w;
    let tile = tile_cols::<T>(kk, q);
    let work = g.n * g.c_in * q * kk;
    let run = |item: usize, region: &mut [T], buf: &mut Vec<T>, par: Parallelism| {
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
            buf.resize(kk * cols, T::ZERO);
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
            col2im(g, cbuf, q0, q1, region);
            q0 = q1;
        }
    };
    let region_len = opg * oh * ow;
    let items = g.n * g.groups;
    if threads() > 1 && work >= PAR_MIN_WORK && items >= threads() {
        out.par_chunks_mut(region_len)
            .enumerate()
            .for_each_init(Vec::new, |buf, (i, r)| run(i, r, buf, Parallelism::None));
    } else {
        let par = if work >= PAR_MIN_WORK {
            auto_parallelism(kk, cpg, tile)
        } else {
            Parallelism::None
        };
        let mut buf = Vec::new();
        out.chunks_mut(region_len)
            .enumerate()
            .for_each(|(i, r)| run(i, r, &mut buf, par));
    }
}

/// Adds `cols[C_out/g * kH * kW, q1 - q0]` (input positions `q0..q1`) into the
/// group's output `region[C_out/g, OH, OW]`.
fn col2im<T: Elem>(g: &ConvTransposeGeometry, cols: &[T], q0: usize, q1: usize, region: &mut [T]) {
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
    let mut rows = cols.chunks_exact(n);
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

#[cfg(test)]
mod tests {
    use super::super::testutil::{assert_close, Lcg};
    use super::*;
    use kiln_ir::op::conv::{
        conv_geometry, conv_transpose_geometry, ConvParams, ConvTransposeParams, Padding,
    };

    fn naive_conv(g: &ConvGeometry, x: &[f64], wt: &[f64], b: Option<&[f64]>) -> Vec<f64> {
        let ([h, w], [oh, ow], [kh, kw]) = (g.in_size, g.out_size, g.kernel);
        let (cpg, opg) = (g.c_in_per_group(), g.c_out_per_group());
        let mut out = vec![0.0; g.n * g.c_out * oh * ow];
        for n in 0..g.n {
            for oc in 0..g.c_out {
                let gi = oc / opg;
                for r in 0..oh {
                    for c in 0..ow {
                        let mut acc = b.map_or(0.0, |b| b[oc]);
                        for ic in 0..cpg {
                            for i in 0..kh {
                                for j in 0..kw {
                                    let ih = (r * g.stride[0] + i * g.dilation[0]) as isize
                                        - g.pad_begin[0] as isize;
                                    let iw = (c * g.stride[1] + j * g.dilation[1]) as isize
                                        - g.pad_begin[1] as isize;
                                    if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
                                        continue;
                                    }
                                    let xi = ((n * g.c_in + gi * cpg + ic) * h + ih as usize) * w
                                        + iw as usize;
                                    acc += x[xi] * wt[((oc * cpg + ic) * kh + i) * kw + j];
                                }
                            }
                        }
                        out[((n * g.c_out + oc) * oh + r) * ow + c] = acc;
                    }
                }
            }
        }
        out
    }

    fn check_conv(
        op: &str,
        input: &[usize],
        weight: &[usize],
        bias: bool,
        p: ConvParams,
        seed: u64,
    ) {
        let c_out = weight[0];
        let bshape = [c_out];
        let g = conv_geometry(op, input, weight, bias.then_some(&bshape[..]), &p).unwrap();
        let mut r = Lcg(seed);
        let x: Vec<f64> = r.vec(input.iter().product());
        let wt: Vec<f64> = r.vec(weight.iter().product());
        let b: Vec<f64> = r.vec(c_out);
        let bias = bias.then_some(&b[..]);
        let want = naive_conv(&g, &x, &wt, bias);
        let mut got = vec![f64::NAN; want.len()];
        conv2d(&g, &x, &wt, bias, &mut got);
        assert_close(
            &got,
            &want,
            1e-12,
            &format!("{op} {input:?} {weight:?} {p:?}"),
        );
        let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let wf: Vec<f32> = wt.iter().map(|&v| v as f32).collect();
        let bf: Vec<f32> = b.iter().map(|&v| v as f32).collect();
        let mut gotf = vec![f32::NAN; want.len()];
        conv2d(&g, &xf, &wf, bias.map(|_| &bf[..]), &mut gotf);
        let wantf: Vec<f32> = want.iter().map(|&v| v as f32).collect();
        assert_close(
            &gotf,
            &wantf,
            1e-4,
            &format!("f32 {op} {input:?} {weight:?}"),
        );
    }

    fn cp(stride: &[usize], padding: Padding, dilation: &[usize], groups: usize) -> ConvParams {
        ConvParams {
            stride: stride.to_vec(),
            padding,
            dilation: dilation.to_vec(),
            groups,
        }
    }

    #[test]
    fn conv2d_matches_direct() {
        use Padding::*;
        check_conv(
            "conv2d",
            &[2, 3, 7, 6],
            &[4, 3, 3, 3],
            true,
            cp(&[1], Explicit(vec![1]), &[1], 1),
            1,
        );
        check_conv(
            "conv2d",
            &[2, 4, 9, 10],
            &[6, 4, 3, 2],
            false,
            cp(&[2], Explicit(vec![1]), &[2], 1),
            2,
        );
        check_conv(
            "conv2d",
            &[2, 4, 8, 8],
            &[6, 2, 3, 3],
            true,
            cp(&[2, 1], Explicit(vec![1, 0]), &[1], 2),
            3,
        );
        check_conv(
            "conv2d",
            &[2, 4, 9, 9],
            &[8, 1, 3, 3],
            true,
            cp(&[2], Explicit(vec![1]), &[1], 4),
            4,
        );
        check_conv(
            "conv2d",
            &[1, 4, 9, 9],
            &[4, 1, 3, 3],
            false,
            cp(&[1], Same, &[2], 4),
            5,
        );
        check_conv(
            "conv2d",
            &[1, 3, 6, 7],
            &[2, 3, 4, 2],
            true,
            cp(&[1], Same, &[1, 2], 1),
            6,
        );
        check_conv(
            "conv2d",
            &[2, 8, 5, 5],
            &[4, 8, 1, 1],
            true,
            cp(&[1], Valid, &[1], 1),
            7,
        );
        check_conv(
            "conv2d",
            &[2, 8, 5, 5],
            &[4, 4, 1, 1],
            false,
            cp(&[2], Valid, &[1], 2),
            8,
        );
        check_conv(
            "conv2d",
            &[1, 2, 3, 3],
            &[2, 2, 3, 3],
            false,
            cp(&[3], Explicit(vec![1]), &[1], 1),
            9,
        );
        check_conv(
            "conv2d",
            &[3, 4, 9, 9],
            &[3, 4, 5, 5],
            true,
            cp(&[1], Valid, &[2], 1),
            10,
        );
        // Several tiles, parallel over items; and one big item with a threaded GEMM.
        check_conv(
            "conv2d",
            &[3, 16, 20, 20],
            &[8, 16, 3, 3],
            true,
            cp(&[1], Explicit(vec![1]), &[1], 1),
            11,
        );
        check_conv(
            "conv2d",
            &[1, 8, 12, 12],
            &[64, 8, 3, 3],
            false,
            cp(&[1], Same, &[1], 1),
            12,
        );
        check_conv(
            "conv2d",
            &[2, 6, 3, 40],
            &[6, 3, 2, 7],
            true,
            cp(&[1, 3], Explicit(vec![1, 3]), &[2, 1], 2),
            13,
        );
    }

    #[test]
    fn conv1d_is_conv2d_with_unit_height() {
        use Padding::*;
        check_conv(
            "conv1d",
            &[2, 3, 20],
            &[5, 3, 4],
            true,
            cp(&[3], Explicit(vec![2]), &[2], 1),
            21,
        );
        check_conv(
            "conv1d",
            &[2, 4, 11],
            &[4, 2, 4],
            false,
            cp(&[1], Same, &[1], 2),
            22,
        );
        check_conv(
            "conv1d",
            &[3, 11],
            &[6, 1, 3],
            true,
            cp(&[1], Same, &[3], 3),
            23,
        );
    }

    fn naive_transpose(
        g: &ConvTransposeGeometry,
        x: &[f64],
        wt: &[f64],
        b: Option<&[f64]>,
    ) -> Vec<f64> {
        let ([h, w], [oh, ow], [kh, kw]) = (g.in_size, g.out_size, g.kernel);
        let (cpg, opg) = (g.c_in_per_group(), g.c_out_per_group());
        let mut out = vec![0.0; g.n * g.c_out * oh * ow];
        for n in 0..g.n {
            for oc in 0..g.c_out {
                for v in &mut out[(n * g.c_out + oc) * oh * ow..][..oh * ow] {
                    *v = b.map_or(0.0, |b| b[oc]);
                }
            }
            for ci in 0..g.c_in {
                let gi = ci / cpg;
                for ih in 0..h {
                    for iw in 0..w {
                        let xv = x[((n * g.c_in + ci) * h + ih) * w + iw];
                        for oc in 0..opg {
                            for i in 0..kh {
                                for j in 0..kw {
                                    let r = (ih * g.stride[0] + i * g.dilation[0]) as isize
                                        - g.padding[0] as isize;
                                    let c = (iw * g.stride[1] + j * g.dilation[1]) as isize
                                        - g.padding[1] as isize;
                                    if r < 0 || c < 0 || r >= oh as isize || c >= ow as isize {
                                        continue;
                                    }
                                    let o = ((n * g.c_out + gi * opg + oc) * oh + r as usize) * ow
                                        + c as usize;
                                    out[o] += xv * wt[((ci * opg + oc) * kh + i) * kw + j];
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    fn check_transpose(
        op: &str,
        input: &[usize],
        weight: &[usize],
        bias: bool,
        p: ConvTransposeParams,
        seed: u64,
    ) {
        let c_out = weight[1] * p.groups;
        let bshape = [c_out];
        let g =
            conv_transpose_geometry(op, input, weight, bias.then_some(&bshape[..]), &p).unwrap();
        let mut r = Lcg(seed);
        let x: Vec<f64> = r.vec(input.iter().product());
        let wt: Vec<f64> = r.vec(weight.iter().product());
        let b: Vec<f64> = r.vec(c_out);
        let bias = bias.then_some(&b[..]);
        let want = naive_transpose(&g, &x, &wt, bias);
        let mut got = vec![f64::NAN; want.len()];
        conv_transpose2d(&g, &x, &wt, bias, &mut got);
        assert_close(
            &got,
            &want,
            1e-12,
            &format!("{op} {input:?} {weight:?} {p:?}"),
        );
    }

    fn tp(
        stride: &[usize],
        padding: &[usize],
        output_padding: &[usize],
        dilation: &[usize],
        groups: usize,
    ) -> ConvTransposeParams {
        ConvTransposeParams {
            stride: stride.to_vec(),
            padding: padding.to_vec(),
            output_padding: output_padding.to_vec(),
            dilation: dilation.to_vec(),
            groups,
        }
    }

    #[test]
    fn conv_transpose_matches_direct() {
        check_transpose(
            "conv_transpose2d",
            &[2, 4, 5, 6],
            &[4, 3, 3, 3],
            true,
            tp(&[2], &[1], &[1], &[1], 2),
            31,
        );
        check_transpose(
            "conv_transpose2d",
            &[1, 3, 4, 4],
            &[3, 2, 2, 3],
            false,
            tp(&[1, 2], &[1, 0], &[0], &[2], 1),
            32,
        );
        check_transpose(
            "conv_transpose1d",
            &[2, 3, 7],
            &[3, 4, 3],
            true,
            tp(&[3], &[0], &[2], &[1], 1),
            33,
        );
        check_transpose(
            "conv_transpose2d",
            &[2, 16, 12, 12],
            &[16, 8, 3, 3],
            true,
            tp(&[2], &[1], &[0], &[1], 1),
            34,
        );
        check_transpose(
            "conv_transpose2d",
            &[1, 4, 7, 5],
            &[4, 1, 4, 4],
            false,
            tp(&[2], &[2], &[1], &[1], 4),
            35,
        );
    }

    /// W4 of the benchmarks: Conv2d(64, 64, 3, padding=1) on (8, 64, 56, 56) f32.
    #[test]
    #[ignore]
    fn bench_conv2d_w4() {
        let p = cp(&[1], Padding::Explicit(vec![1]), &[1], 1);
        let g =
            conv_geometry("conv2d", &[8, 64, 56, 56], &[64, 64, 3, 3], Some(&[64]), &p).unwrap();
        let mut r = Lcg(7);
        let x: Vec<f32> = r.vec(8 * 64 * 56 * 56);
        let wt: Vec<f32> = r.vec(64 * 64 * 9);
        let b: Vec<f32> = r.vec(64);
        let mut out = vec![0f32; 8 * 64 * 56 * 56];
        let mut times = vec![];
        for _ in 0..15 {
            let t = std::time::Instant::now();
            conv2d(&g, &x, &wt, Some(&b), &mut out);
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "conv2d W4 f32 ({} threads): median {:.2} ms = {:.1} GFLOP/s, best {:.1} GFLOP/s",
            threads(),
            times[7] * 1e3,
            g.flops() / times[7] / 1e9,
            g.flops() / times[0] / 1e9
        );
    }
}
