//! conv1d/conv2d on a CUDA device from generated kernels: the input copied
//! into a zero-padded buffer, its patches gathered by one copy kernel through
//! a strided view (im2col with no index arithmetic of its own: stride and
//! dilation are just strides of the view), then the matrix product of
//! [`super::matmul_kernel`] per group, written in NCHW order with the bias
//! added in its epilogue: three launches in all.
//! The weight gradient reuses the patches.

use super::matmul_kernel::{matmul_kernel, matmul_kernel_plus};
use crate::ops::pointwise::copy_into;
use crate::Tensor;
use kiln_ir::op::conv::ConvGeometry;
use kiln_ir::op::Layout;
use kiln_ir::{DType, Result};

/// The patches of `x` under `g`'s windows, `[n, groups, oh*ow, cg*kh*kw]`
/// (im2col): `x` copied into a zero-padded buffer, then gathered by one copy
/// kernel through a strided view of it.
fn patches(g: &ConvGeometry, x: &Tensor, dt: DType) -> Result<Tensor> {
    let dev = x.device();
    let [h, wd] = g.in_size;
    let [kh, kw] = g.kernel;
    let [oh, ow] = g.out_size;
    let (n, c, groups, cg) = (g.n, g.c_in, g.groups, g.c_in_per_group());
    let (hp, wp) = (
        h + g.pad_begin[0] + g.pad_end[0],
        wd + g.pad_begin[1] + g.pad_end[1],
    );
    let padded = Tensor::zeros_on(&[n, c, hp, wp], dt, dev)?;
    let inner = padded
        .narrow(2, g.pad_begin[0] as i64, h)?
        .narrow(3, g.pad_begin[1] as i64, wd)?;
    copy_into(
        &x.reshape(&[n as i64, c as i64, h as i64, wd as i64])?,
        &inner,
    )?;
    // [n, groups, oh, ow, cg, kh, kw] over the padded buffer
    let (sn, sc, sh) = ((c * hp * wp) as isize, (hp * wp) as isize, wp as isize);
    let [st0, st1] = g.stride.map(|s| s as isize);
    let [d0, d1] = g.dilation.map(|d| d as isize);
    let view = padded.with_layout(Layout {
        dims: [n, groups, oh, ow, cg, kh, kw].into_iter().collect(),
        strides: [sn, cg as isize * sc, sh * st0, st1, sc, sh * d0, d1]
            .into_iter()
            .collect(),
        offset: padded.offset(),
    });
    let patches = Tensor::empty_on(view.dims(), dt, dev)?;
    copy_into(&view, &patches)?;
    patches.reshape(&[
        n as i64,
        groups as i64,
        (oh * ow) as i64,
        (cg * kh * kw) as i64,
    ])
}

/// `conv(x, w) + bias` for `g` (tensors already in the compute dtype, contiguous).
pub(super) fn conv_kernel(
    g: &ConvGeometry,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    dt: DType,
) -> Result<Tensor> {
    let [kh, kw] = g.kernel;
    let (n, groups) = (g.n, g.groups);
    let (cg, cog) = (g.c_in_per_group(), g.c_out_per_group());
    let patches = patches(g, x, dt)?;
    let k = (cg * kh * kw) as i64;
    // loops [n, groups, cog, oh*ow, k]: the result comes out in NCHW order
    let wk = w.reshape(&[1, groups as i64, cog as i64, k])?.expand(&[
        n as i64,
        groups as i64,
        cog as i64,
        k,
    ])?;
    let bias = bias
        .map(|b| b.reshape(&[1, groups as i64, cog as i64, 1]))
        .transpose()?;
    let y = matmul_kernel_plus(&wk, &patches.transpose(-1, -2)?, bias.as_ref(), dt)?;
    let dims: Vec<i64> = g.out_shape().iter().map(|&d| d as i64).collect();
    y.reshape(&dims)
}

/// The weight gradient `[c_out, cg, kh, kw]` of a convolution over `x` given
/// the output gradient `grad` (compute dtype, contiguous): per group, the
/// product of the gradient `[cog, n*oh*ow]` with the patches `[n*oh*ow, k]`.
pub(super) fn conv_weight_grad_kernel(
    g: &ConvGeometry,
    x: &Tensor,
    grad: &Tensor,
    dt: DType,
) -> Result<Tensor> {
    let [kh, kw] = g.kernel;
    let [oh, ow] = g.out_size;
    let (n, groups) = (g.n as i64, g.groups as i64);
    let (cog, p) = (g.c_out_per_group() as i64, (oh * ow) as i64);
    let k = (g.c_in_per_group() * kh * kw) as i64;
    let cols = patches(g, x, dt)?
        .permute(&[1, 0, 2, 3])?
        .contiguous()?
        .reshape(&[groups, n * p, k])?;
    let gy = grad
        .reshape(&[n, groups, cog, p])?
        .permute(&[1, 2, 0, 3])?
        .contiguous()?
        .reshape(&[groups, cog, n * p])?;
    let gw = matmul_kernel(&gy, &cols, dt)?; // [groups, cog, k]
    gw.reshape(&[
        groups * cog,
        g.c_in_per_group() as i64,
        kh as i64,
        kw as i64,
    ])
}
