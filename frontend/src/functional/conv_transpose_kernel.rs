//! conv_transpose2d on a CUDA device as a convolution: the input spread
//! (stride-dilated) into a zero buffer by one copy through a strided view,
//! convolved at stride 1 with the weight flipped in space and transposed per
//! group — read through a negative-stride view, so that is one copy too.
//! The convolution is [`super::conv_kernel`]'s, bias in its epilogue.

use super::conv_kernel::conv_kernel;
use crate::ops::pointwise::copy_into;
use crate::Tensor;
use kiln_ir::op::conv::{self, ConvParams, ConvTransposeGeometry, Padding};
use kiln_ir::op::Layout;
use kiln_ir::{DType, Result};

/// The rows `lo..hi` of an input axis of `size` whose spread position
/// `i*stride + off` falls inside a buffer axis of `len`.
fn inside(size: usize, stride: usize, off: i64, len: usize) -> (usize, usize) {
    let s = stride as i64;
    let lo = if off < 0 { (-off + s - 1) / s } else { 0 };
    let hi = ((len as i64 - 1 - off).div_euclid(s) + 1).clamp(0, size as i64);
    (lo.min(hi) as usize, hi as usize)
}

/// `conv_transpose2d(x, w) + bias` for `g` (tensors in the compute dtype, contiguous).
pub(super) fn conv_transpose_kernel(
    g: &ConvTransposeGeometry,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    dt: DType,
) -> Result<Tensor> {
    let dev = x.device();
    let (n, ci, co, groups) = (g.n, g.c_in, g.c_out, g.groups);
    let (cig, cog) = (g.c_in_per_group(), g.c_out_per_group());
    let [h, wd] = g.in_size;
    let [kh, kw] = g.kernel;
    // output o reads buffer rows o + k*dil: the input's row i sits at
    // i*stride + dil*(k-1) - pad, and rows outside the buffer feed only
    // outputs that the padding crops
    let reach = |d: usize| (g.dilation[d] * (g.kernel[d] - 1)) as i64;
    let len = |d: usize| g.out_size[d] + reach(d) as usize;
    let off = |d: usize| reach(d) - g.padding[d] as i64;
    let (hb, wb) = (len(0), len(1));
    let buf = Tensor::zeros_on(&[n, ci, hb, wb], dt, dev)?;
    let (h0, h1) = inside(h, g.stride[0], off(0), hb);
    let (w0, w1) = inside(wd, g.stride[1], off(1), wb);
    if h1 > h0 && w1 > w0 {
        let src = x
            .reshape(&[n as i64, ci as i64, h as i64, wd as i64])?
            .narrow(2, h0 as i64, h1 - h0)?
            .narrow(3, w0 as i64, w1 - w0)?;
        let at = |d: usize, i0: usize| (i0 * g.stride[d]) as i64 + off(d);
        let dst = buf.with_layout(Layout {
            dims: [n, ci, h1 - h0, w1 - w0].into_iter().collect(),
            strides: [
                (ci * hb * wb) as isize,
                (hb * wb) as isize,
                (g.stride[0] * wb) as isize,
                g.stride[1] as isize,
            ]
            .into_iter()
            .collect(),
            offset: (at(0, h0) * wb as i64 + at(1, w0)) as usize,
        });
        copy_into(&src, &dst)?;
    }
    // [ci, cog, kh, kw] -> [groups, cog, cig, kh, kw] flipped in space
    let (skh, sci) = (kw as isize, (cog * kh * kw) as isize);
    let flipped = w.with_layout(Layout {
        dims: [groups, cog, cig, kh, kw].into_iter().collect(),
        strides: [cig as isize * sci, skh * kh as isize, sci, -skh, -1]
            .into_iter()
            .collect(),
        offset: w.offset() + kh * kw - 1,
    });
    let wt = Tensor::empty_on(flipped.dims(), dt, dev)?;
    copy_into(&flipped, &wt)?;
    let wt = wt.reshape(&[co as i64, cig as i64, kh as i64, kw as i64])?;
    let p = ConvParams {
        stride: vec![1, 1],
        padding: Padding::Explicit(vec![0, 0]),
        dilation: g.dilation.to_vec(),
        groups,
    };
    let cg = conv::conv_geometry(
        "conv_transpose2d",
        buf.dims(),
        wt.dims(),
        bias.map(|b| b.dims()),
        &p,
    )?;
    let y = conv_kernel(&cg, &buf, &wt, bias, dt)?;
    let dims: Vec<i64> = g.out_shape().iter().map(|&d| d as i64).collect();
    y.reshape(&dims)
}
