//! The weight gradient of `conv2d` (and `conv1d` as `H = 1`):
//! `dW[C_out, C_in/g, kH, kW] = sum over samples of dY_n @ im2col(x_n)^T`.
//! Samples go in chunks: the chunk's im2col columns side by side and its
//! output-gradient rows packed next to each other make one GEMM with
//! `k = samples * OH * OW` (a GEMM per sample would have `k = OH * OW`, often
//! 16 or 64, where call overhead dominates). Chunks run in parallel, each
//! worker accumulating its own dW; the partial sums are added at the end.
//! The input gradient is a transposed convolution (`conv::conv_transpose2d`).

use super::conv::patch_map::PatchMap;
use super::conv::{conv_shapes, im2col_plane, scratch};
use super::gemm::{gemm_raw, Parallelism};
use super::{threads, Elem, PAR_MIN_WORK};
use kiln_ir::op::conv::ConvGeometry;
use kiln_ir::Result;

/// Elements of one chunk's column matrix (256 KiB of f32): it stays in L2.
const CHUNK_ELEMS: usize = 64 * 1024;

/// `out[C_out, C_in/g, kH, kW]` = the gradient of `conv2d(input, W)` with
/// respect to `W`, given the output gradient `grad[N, C_out, OH, OW]`.
pub fn conv2d_weight_grad<T: Elem>(
    g: &ConvGeometry,
    input: &[T],
    grad: &[T],
    out: &mut [T],
) -> Result<()> {
    let [h, w] = g.in_size;
    let p = g.out_size[0] * g.out_size[1];
    let (cpg, opg) = (g.c_in_per_group(), g.c_out_per_group());
    let kk = cpg * g.kernel[0] * g.kernel[1];
    assert_eq!(
        input.len(),
        g.n * g.c_in * h * w,
        "conv2d_weight_grad: input length does not match geometry"
    );
    assert_eq!(
        grad.len(),
        g.n * g.c_out * p,
        "conv2d_weight_grad: grad length does not match geometry"
    );
    assert_eq!(
        out.len(),
        g.c_out * kk,
        "conv2d_weight_grad: out length does not match geometry"
    );
    out.fill(T::ZERO);
    if p == 0 || g.n == 0 {
        return Ok(());
    }
    let work = g.n * g.c_out * p * kk;
    let par = threads() > 1 && work >= PAR_MIN_WORK && g.n >= 2;
    let mut per = (CHUNK_ELEMS / (kk * p)).clamp(1, g.n);
    if par {
        per = per.min(g.n.div_ceil(2 * threads()));
    }
    let chunks = g.n.div_ceil(per);
    // adds samples of chunk c to every group of `acc`
    let shapes = || conv_shapes(g);
    let map = PatchMap::for_conv(g);
    let chunk = |c: usize, acc: &mut [T], cols: &mut Vec<T>, dys: &mut Vec<T>| -> Result<()> {
        let (n0, n1) = (c * per, ((c + 1) * per).min(g.n));
        let ld = (n1 - n0) * p;
        scratch(cols, kk * ld, "conv2d_weight_grad", &shapes)?;
        scratch(dys, opg * ld, "conv2d_weight_grad", &shapes)?;
        for gi in 0..g.groups {
            for (s, n) in (n0..n1).enumerate() {
                let x = &input[(n * g.c_in + gi * cpg) * h * w..][..cpg * h * w];
                im2col_plane(g, map.as_deref(), x, &mut cols[s * p..], ld);
                for o in 0..opg {
                    let src = &grad[(n * g.c_out + gi * opg + o) * p..][..p];
                    dys[o * ld + s * p..][..p].copy_from_slice(src);
                }
            }
            let dst = &mut acc[gi * opg * kk..][..opg * kk];
            // SAFETY: dys is [opg, ld], cols^T is [ld, kk] (row stride 1,
            // column stride ld), dst is [opg, kk]; all in bounds.
            unsafe {
                gemm_raw(
                    opg,
                    ld,
                    kk,
                    dys.as_ptr(),
                    ld as isize,
                    1,
                    cols.as_ptr(),
                    1,
                    ld as isize,
                    dst.as_mut_ptr(),
                    kk as isize,
                    1,
                    true,
                    Parallelism::None,
                );
            }
        }
        Ok(())
    };
    if par {
        // Fixed chunk ranges per slot, partials added in slot order: the same
        // sums in the same order on every run, whichever thread takes a slot
        // (PyTorch's CPU conv backward repeats bit for bit too).
        let workers = threads().min(chunks);
        let partials = crate::par::map(workers, |w| -> Result<Vec<T>> {
            let mut acc = crate::scratch::try_zeroed("conv2d_weight_grad", out.len())?;
            let (mut cols, mut dys) = (vec![], vec![]);
            for c in crate::par::range(chunks, workers, w) {
                chunk(c, &mut acc, &mut cols, &mut dys)?;
            }
            Ok(acc)
        });
        for p in partials {
            for (x, y) in out.iter_mut().zip(&p?) {
                *x += *y;
            }
        }
    } else {
        let (mut cols, mut dys) = (Vec::new(), Vec::new());
        for c in 0..chunks {
            chunk(c, out, &mut cols, &mut dys)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::externs::testutil::Lcg;
    use kiln_ir::op::conv::{conv_geometry, ConvParams, Padding};

    /// dW by the definition, in f64.
    fn naive(g: &ConvGeometry, x: &[f64], dy: &[f64]) -> Vec<f64> {
        let [h, w] = g.in_size;
        let [oh, ow] = g.out_size;
        let [kh, kw] = g.kernel;
        let (cpg, opg) = (g.c_in_per_group(), g.c_out_per_group());
        let mut out = vec![0.0; g.c_out * cpg * kh * kw];
        for o in 0..g.c_out {
            let gi = o / opg;
            for c in 0..cpg {
                for i in 0..kh {
                    for j in 0..kw {
                        let mut s = 0.0;
                        for n in 0..g.n {
                            for y in 0..oh {
                                for z in 0..ow {
                                    let ih = (y * g.stride[0] + i * g.dilation[0]) as isize
                                        - g.pad_begin[0] as isize;
                                    let iw = (z * g.stride[1] + j * g.dilation[1]) as isize
                                        - g.pad_begin[1] as isize;
                                    if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
                                        continue;
                                    }
                                    let xv = x[((n * g.c_in + gi * cpg + c) * h + ih as usize) * w
                                        + iw as usize];
                                    s += dy[((n * g.c_out + o) * oh + y) * ow + z] * xv;
                                }
                            }
                        }
                        out[((o * cpg + c) * kh + i) * kw + j] = s;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_the_definition() {
        let cases = [
            // x dims, weight dims, stride, padding, dilation, groups
            ([3, 2, 7, 6], [4, 2, 3, 3], 1, vec![1], 1, 1),
            ([2, 4, 8, 8], [6, 2, 3, 2], 2, vec![1, 0], 1, 2),
            ([1, 3, 9, 9], [2, 3, 3, 3], 1, vec![2], 2, 1),
            ([40, 8, 8, 8], [16, 8, 3, 3], 2, vec![1], 1, 1),
        ];
        let mut r = Lcg(7);
        for (xd, wd, stride, padding, dilation, groups) in cases {
            let p = ConvParams {
                stride: vec![stride],
                padding: Padding::Explicit(padding),
                dilation: vec![dilation],
                groups,
            };
            let g = conv_geometry("conv2d", &xd, &wd, None, &p).unwrap();
            let x: Vec<f64> = (0..xd.iter().product::<usize>())
                .map(|_| r.next_f64())
                .collect();
            let ny = g.n * g.c_out * g.out_size[0] * g.out_size[1];
            let dy: Vec<f64> = (0..ny).map(|_| r.next_f64()).collect();
            let want = naive(&g, &x, &dy);
            let mut got = vec![0.0f64; want.len()];
            conv2d_weight_grad(&g, &x, &dy, &mut got).unwrap();
            for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() < 1e-9,
                    "{xd:?} {wd:?} element {k}: {a} vs {b}"
                );
            }
            let (xf, dyf): (Vec<f32>, Vec<f32>) = (
                x.iter().map(|v| *v as f32).collect(),
                dy.iter().map(|v| *v as f32).collect(),
            );
            let mut gotf = vec![0.0f32; want.len()];
            conv2d_weight_grad(&g, &xf, &dyf, &mut gotf).unwrap();
            for (a, b) in gotf.iter().zip(&want) {
                assert!((*a as f64 - b).abs() < 1e-4 * (1.0 + b.abs()));
            }
        }
    }
}
