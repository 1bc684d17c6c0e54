//! conv1d/conv2d on a CUDA device. The forward conv is one launch of the
//! implicit-GEMM template (`kiln_runtime::cuda::conv`), with the bias — and
//! in a compiled graph the whole pointwise epilogue — applied before the
//! output tile is stored. The weight gradient gathers the patches (im2col)
//! with one copy kernel through a strided view of a zero-padded buffer (no
//! index arithmetic of its own: stride and dilation are just strides of the
//! view), then multiplies them with the gradient ([`super::matmul_kernel`]).

use super::matmul_kernel::matmul_kernel;
use crate::ops::fuse::Lazy;
use crate::ops::pointwise::copy_into;
use crate::Tensor;
use kiln_ir::op::conv::{self, ConvGeometry, ConvParams};
use kiln_ir::op::Layout;
use kiln_ir::{bail, DType, Result};
use kiln_runtime::cuda::conv::ConvViews;
use kiln_runtime::cuda::epilogue::EpilogueViews;

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
    let out = Tensor::empty_on(&g.out_shape(), dt, x.device())?;
    kiln_runtime::cuda::conv::conv2d(g, &conv_views(x, w, bias, &out), None)?;
    Ok(out)
}

fn conv_views<'a>(
    x: &'a Tensor,
    w: &'a Tensor,
    bias: Option<&'a Tensor>,
    out: &'a Tensor,
) -> ConvViews<'a> {
    ConvViews {
        x: x.runtime_view(),
        w: w.runtime_view(),
        bias: bias.map(|b| b.runtime_view()),
        out: out.runtime_view(),
    }
}

/// `t` (of the conv output's user rank) as `[N, K, OH, OW]`: the dims an
/// unbatched or 1-d conv lacks inserted as size 1.
pub(crate) fn as_nkhw(g: &ConvGeometry, t: &Tensor) -> Result<Tensor> {
    let t = if g.batched {
        t.clone()
    } else {
        t.unsqueeze(0)?
    };
    if g.spatial == 1 {
        t.unsqueeze(2)
    } else {
        Ok(t)
    }
}

/// conv1d/conv2d on a CUDA device with a compiled graph's pointwise epilogue
/// in the same launch (no autograd): `epilogue(v)` builds the epilogue's
/// expression over `v`, which stands for the conv's value as
/// `[N, K, OH, OW]` (see [`as_nkhw`] for the other operands). f32/f64.
pub fn conv_with_epilogue_on_device(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    p: &ConvParams,
    spatial: usize,
    epilogue: &dyn Fn(&ConvGeometry, &Tensor) -> Result<Lazy>,
) -> Result<Tensor> {
    let op = if spatial == 1 { "conv1d" } else { "conv2d" };
    let _p = super::op_scope(op, &[x, w]);
    let mut ts = vec![x, w];
    ts.extend(bias);
    let dt = super::float_dtype(op, &ts)?;
    if dt.is_half() {
        bail!(op, "a fused CUDA epilogue needs f32 or f64, got {dt}");
    }
    let g = conv::conv_geometry(op, x.dims(), w.dims(), bias.map(|b| b.dims()), p)?;
    let (xc, wc) = (super::compute_input(x)?, super::compute_input(w)?);
    let bc = bias.map(super::compute_input).transpose()?;
    let out = Tensor::empty_on(&g.out_shape(), dt, x.device())?;
    let value = as_nkhw(&g, &out)?;
    let expr = epilogue(&g, &value)?;
    expr.materialize_into_with(&value, |kernel, views, scalars| {
        let e = EpilogueViews {
            kernel,
            views,
            scalars,
        };
        kiln_runtime::cuda::conv::conv2d(&g, &conv_views(&xc, &wc, bc.as_ref(), &out), Some(&e))
    })?;
    Ok(out)
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
