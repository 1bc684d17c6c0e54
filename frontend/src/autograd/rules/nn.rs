//! Backward rules of matmul, convolution and pooling. Matmul and conv
//! gradients are matmuls and convolutions themselves (written with the
//! Tensor-level ops); avg pooling calls its extern backward kernel, max
//! pooling scatter-adds into the recorded argmax positions. On a CUDA device
//! both run as generated kernels (`functional::pool_kernel`).

use super::index::scatter_add;
use crate::autograd::{needs_grad, record, Saved};
use crate::functional as F;
use crate::functional::pool_kernel;
use crate::Tensor;
use kiln_ir::op::conv::{
    ConvGeometry, ConvParams, ConvTransposeGeometry, ConvTransposeParams, Padding,
};
use kiln_ir::op::pool::Pool2dGeometry;
use kiln_ir::op::Op;
use kiln_ir::{DType, Result};

/// Records `matmul(a, b)` (every rank combination; broadcast batches are
/// summed back by the engine).
pub(crate) fn matmul(a: &Tensor, b: &Tensor, y: Tensor) -> Result<Tensor> {
    if !needs_grad(&[a, b]) {
        return Ok(y);
    }
    let (sa, sb) = (Saved::new("matmul", a), Saved::new("matmul", b));
    record("matmul", y, &[a, b], move |g| {
        let (a, b) = (sa.get()?, sb.get()?);
        let (av, bv) = (a.rank() == 1, b.rank() == 1);
        let a2 = if av { a.unsqueeze(0)? } else { a };
        let b2 = if bv { b.unsqueeze(-1)? } else { b };
        let mut g2 = g.clone();
        if av {
            g2 = g2.unsqueeze(if bv { 0 } else { -2 })?;
        }
        if bv {
            g2 = g2.unsqueeze(-1)?;
        }
        let ga = if transposed(&a2) {
            F::matmul(&b2, &g2.transpose(-1, -2)?)?.transpose(-1, -2)?
        } else {
            F::matmul(&g2, &b2.transpose(-1, -2)?)?
        };
        let gb = if b2.rank() == 2 && a2.rank() > 2 {
            // a matrix shared by every batch item (a Linear on [B, T, C]): one
            // GEMM over the flattened rows, not a batched product summed back
            let k = a2.dims()[a2.rank() - 1] as i64;
            let n = g2.dims()[g2.rank() - 1] as i64;
            mat2_grad(
                &a2.reshape(&[-1, k])?,
                &g2.reshape(&[-1, n])?,
                transposed(&b2),
            )?
        } else {
            mat2_grad(&a2, &g2, transposed(&b2))?
        };
        let ga = if av { ga.squeeze(Some(&[-2]))? } else { ga };
        let gb = if bv { gb.squeeze(Some(&[-1]))? } else { gb };
        Ok(vec![Some(ga), Some(gb)])
    })
}

/// Whether `t`'s last two dims are a transposed contiguous block (`w.t()` of
/// a row-major `w`), so a gradient for it is best produced in that layout.
fn transposed(t: &Tensor) -> bool {
    let r = t.rank();
    r >= 2
        && !t.is_contiguous()
        && t.dims()[r - 1] > 1
        && t.dims()[r - 2] > 1
        && t.transpose(-1, -2).is_ok_and(|tt| tt.is_contiguous())
}

/// The gradient of `b` in `a @ b` for the output gradient `g`: `a^T @ g`, or,
/// when `b` is a transposed view, `(g^T @ a)^T`, as PyTorch's
/// `mm_mat2_backward` does. A Linear's `weight.t()` then gets a contiguous
/// `[out, in]` gradient with no transpose copy before the optimizer reads it.
fn mat2_grad(a: &Tensor, g: &Tensor, b_transposed: bool) -> Result<Tensor> {
    if b_transposed {
        F::matmul(&g.transpose(-1, -2)?, a)?.transpose(-1, -2)
    } else {
        F::matmul(&a.transpose(-1, -2)?, g)
    }
}

/// A zero-padded copy of a 4-D `x` (`pb` before, `pe` after each spatial dim).
fn pad4(x: &Tensor, pb: [usize; 2], pe: [usize; 2]) -> Result<Tensor> {
    if pb == [0, 0] && pe == [0, 0] {
        return Ok(x.clone());
    }
    let d = x.dims();
    let dims = [d[0], d[1], d[2] + pb[0] + pe[0], d[3] + pb[1] + pe[1]];
    super::embed(x, &dims, |z| {
        z.narrow(2, pb[0] as i64, d[2])?
            .narrow(3, pb[1] as i64, d[3])
    })
}

/// Weight gradient of a convolution of `x` [N, Cin, H, W] giving `g` [N, Cout, oh, ow]:
/// `[Cout, Cin/groups, kh, kw]`, as a grouped convolution of x with g.
#[allow(clippy::too_many_arguments)]
fn conv_weight_grad(
    x: &Tensor,
    g: &Tensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    pb: [usize; 2],
    pe: [usize; 2],
    groups: usize,
) -> Result<Tensor> {
    // symmetric padding is the convolution's own (no padded copy, and a traced
    // backward stays in the graph); asymmetric padding pads explicitly
    let (xp, pad) = if pb == pe {
        (x.clone(), pb.to_vec())
    } else {
        (pad4(x, pb, pe)?, vec![0])
    };
    let (n, cin, hp, wp) = (xp.dims()[0], xp.dims()[1], xp.dims()[2], xp.dims()[3]);
    let (cout, oh, ow) = (g.dims()[1], g.dims()[2], g.dims()[3]);
    let (cgi, cgo) = (cin / groups, cout / groups);
    let gi = groups as i64;
    let xr = xp
        .reshape(&[n as i64, gi, cgi as i64, hp as i64, wp as i64])?
        .permute(&[2, 1, 0, 3, 4])?
        .reshape(&[cgi as i64, gi * n as i64, hp as i64, wp as i64])?;
    let gr = g
        .reshape(&[n as i64, gi, cgo as i64, oh as i64, ow as i64])?
        .permute(&[1, 2, 0, 3, 4])?
        .reshape(&[gi * cgo as i64, n as i64, oh as i64, ow as i64])?;
    let p = ConvParams {
        stride: dilation.to_vec(),
        padding: Padding::Explicit(pad),
        dilation: stride.to_vec(),
        groups,
    };
    let r = F::conv2d(&xr, &gr, None, &p)?;
    r.narrow(2, 0, kernel[0])?
        .narrow(3, 0, kernel[1])?
        .transpose(0, 1)?
        .contiguous()
}

fn dims4(t: &Tensor, n: usize, c: usize, hw: [usize; 2]) -> Result<Tensor> {
    t.reshape_dims(&[n, c, hw[0], hw[1]])
}

/// Records `conv1d`/`conv2d` with geometry `geo` (inputs x, w, optional bias).
pub(crate) fn conv(
    geo: ConvGeometry,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    y: Tensor,
) -> Result<Tensor> {
    let mut ins = vec![x, w];
    ins.extend(b);
    if !needs_grad(&ins) {
        return Ok(y);
    }
    let (sx, sw) = (Saved::new("conv2d", x), Saved::new("conv2d", w));
    let has_bias = b.is_some();
    let name = if geo.spatial == 1 { "conv1d" } else { "conv2d" };
    record(name, y, &ins, move |g| {
        let (x, w) = (sx.get()?, sw.get()?);
        let gm = &geo;
        let g4 = dims4(g, gm.n, gm.c_out, gm.out_size)?;
        let x4 = dims4(&x, gm.n, gm.c_in, gm.in_size)?;
        let w4 = dims4(&w, gm.c_out, gm.c_in_per_group(), gm.kernel)?;
        let hp = |d: usize| gm.in_size[d] + gm.pad_begin[d] + gm.pad_end[d];
        let op = |d: usize| {
            hp(d) - ((gm.out_size[d] - 1) * gm.stride[d] + gm.dilation[d] * (gm.kernel[d] - 1) + 1)
        };
        let tp = ConvTransposeParams {
            stride: gm.stride.to_vec(),
            padding: vec![0],
            output_padding: vec![op(0), op(1)],
            dilation: gm.dilation.to_vec(),
            groups: gm.groups,
        };
        let gxp = F::conv_transpose2d(&g4, &w4, None, &tp)?;
        let gx = gxp
            .narrow(2, gm.pad_begin[0] as i64, gm.in_size[0])?
            .narrow(3, gm.pad_begin[1] as i64, gm.in_size[1])?
            .reshape_dims(x.dims())?;
        let gw = if gm.pad_begin == gm.pad_end {
            let p = ConvParams {
                stride: gm.stride.to_vec(),
                padding: Padding::Explicit(gm.pad_begin.to_vec()),
                dilation: gm.dilation.to_vec(),
                groups: gm.groups,
            };
            F::conv2d_weight_grad(&x4, &g4, &p, gm.kernel)?
        } else {
            conv_weight_grad(
                &x4,
                &g4,
                gm.kernel,
                gm.stride,
                gm.dilation,
                gm.pad_begin,
                gm.pad_end,
                gm.groups,
            )?
        }
        .reshape_dims(w.dims())?;
        let mut out = vec![Some(gx), Some(gw)];
        if has_bias {
            out.push(Some(g4.sum(Some(&[0, 2, 3]), false)?));
        }
        Ok(out)
    })
}

/// Records `conv_transpose2d` with geometry `geo`.
pub(crate) fn conv_transpose(
    geo: ConvTransposeGeometry,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    y: Tensor,
) -> Result<Tensor> {
    let mut ins = vec![x, w];
    ins.extend(b);
    if !needs_grad(&ins) {
        return Ok(y);
    }
    let (sx, sw) = (
        Saved::new("conv_transpose2d", x),
        Saved::new("conv_transpose2d", w),
    );
    let has_bias = b.is_some();
    record("conv_transpose2d", y, &ins, move |g| {
        let (x, w) = (sx.get()?, sw.get()?);
        let gm = &geo;
        let g4 = dims4(g, gm.n, gm.c_out, gm.out_size)?;
        let x4 = dims4(&x, gm.n, gm.c_in, gm.in_size)?;
        let w4 = dims4(&w, gm.c_in, gm.c_out_per_group(), gm.kernel)?;
        let p = ConvParams {
            stride: gm.stride.to_vec(),
            padding: Padding::Explicit(gm.padding.to_vec()),
            dilation: gm.dilation.to_vec(),
            groups: gm.groups,
        };
        let gx = F::conv2d(&g4, &w4, None, &p)?.reshape_dims(x.dims())?;
        let gw = conv_weight_grad(
            &g4,
            &x4,
            gm.kernel,
            gm.stride,
            gm.dilation,
            gm.padding,
            gm.padding,
            gm.groups,
        )?
        .reshape_dims(w.dims())?;
        let mut out = vec![Some(gx), Some(gw)];
        if has_bias {
            out.push(Some(g4.sum(Some(&[0, 2, 3]), false)?));
        }
        Ok(out)
    })
}

/// Records a max pool whose flat in-plane argmax positions are `idx`.
pub(crate) fn max_pool(
    name: &'static str,
    geo: Pool2dGeometry,
    x: &Tensor,
    idx: &Tensor,
    y: Tensor,
) -> Result<Tensor> {
    if !needs_grad(&[x]) {
        return Ok(y);
    }
    let si = Saved::new(name, idx);
    let xd = x.dims_vec();
    record(name, y, &[x], move |g| {
        let planes = geo.planes();
        let plane_out = geo.out_size[0] * geo.out_size[1];
        if g.device().is_cuda() && !crate::compile::trace::is_tracing() {
            // reads each input's window taps instead of scattering
            let [oh, ow] = geo.out_size;
            let gc = g
                .to_dtype(g.dtype().compute())?
                .reshape_dims(&[planes, oh, ow])?;
            let ic = si.get()?.reshape_dims(&[planes, oh, ow])?;
            let adaptive = name == "adaptive_max_pool2d";
            let gx = pool_kernel::max_pool_backward_kernel(&geo, adaptive, &gc, &ic)?;
            return Ok(vec![Some(gx.reshape_dims(&xd)?.to_dtype(g.dtype())?)]);
        }
        let g2 = g.reshape_dims(&[planes, plane_out])?;
        let i2 = si.get()?.reshape_dims(&[planes, plane_out])?;
        let gx = scatter_add(&[planes, geo.in_size[0] * geo.in_size[1]], 1, &i2, &g2)?;
        Ok(vec![Some(gx.reshape_dims(&xd)?)])
    })
}

/// Records avg_pool2d (`adaptive == false`) or adaptive_avg_pool2d through
/// the extern backward kernel.
pub(crate) fn avg_pool(
    name: &'static str,
    geo: Pool2dGeometry,
    adaptive: bool,
    count_include_pad: bool,
    divisor_override: Option<i64>,
    x: &Tensor,
    y: Tensor,
) -> Result<Tensor> {
    if !needs_grad(&[x]) {
        return Ok(y);
    }
    let xd = x.dims_vec();
    let dt = x.dtype();
    record(name, y, &[x], move |g| {
        if adaptive && geo.out_size == [1, 1] {
            // global pooling: every input element gets 1/(h*w) of its plane's gradient
            // (Tensor ops, so a traced backward stays in the graph)
            let n = (geo.in_size[0] * geo.in_size[1]) as f64;
            let xi: Vec<i64> = xd.iter().map(|&d| d as i64).collect();
            return Ok(vec![Some(super::mul_s(&g.expand(&xi)?, 1.0 / n)?)]);
        }
        let run = || {
            avg_pool_backward(
                &geo,
                adaptive,
                count_include_pad,
                divisor_override,
                g,
                &xd,
                dt,
            )
        };
        // one graph node (the graph op has no divisor_override: that stays eager)
        let op = || Op::AvgPool2dBackward {
            input_size: xd.to_vec(),
            params: (!adaptive).then(|| geo.params.clone()),
            count_include_pad,
        };
        Ok(vec![Some(match divisor_override {
            None => crate::compile::trace::record(op, &[g], run)?,
            Some(_) => run()?,
        })])
    })
}

/// The input gradient of an average pool of geometry `geo` (the extern
/// backward kernels), for an input of shape `xd` and dtype `dt`.
pub(crate) fn avg_pool_backward(
    geo: &Pool2dGeometry,
    adaptive: bool,
    count_include_pad: bool,
    divisor_override: Option<i64>,
    g: &Tensor,
    xd: &[usize],
    dt: DType,
) -> Result<Tensor> {
    if g.device().is_cuda() {
        let [oh, ow] = geo.out_size;
        let gc = g
            .to_dtype(g.dtype().compute())?
            .reshape_dims(&[geo.planes(), oh, ow])?;
        let gx = pool_kernel::avg_pool_backward_kernel(
            geo,
            adaptive,
            count_include_pad,
            divisor_override,
            &gc,
        )?;
        let out = if dt.is_float() { dt } else { DType::F32 };
        return gx.reshape_dims(xd)?.to_dtype(out);
    }
    let gv = g.to_f64_vec();
    let mut gx = vec![0.0f64; xd.iter().product()];
    if adaptive {
        kiln_runtime::externs::pool_backward::adaptive_avg_pool2d_backward(geo, &gv, &mut gx);
    } else {
        kiln_runtime::externs::pool_backward::avg_pool2d_backward(
            geo,
            &gv,
            &mut gx,
            count_include_pad,
            divisor_override,
        );
    }
    Tensor::from_vec(gx, xd)?
        .to_dtype(if dt.is_float() { dt } else { DType::F32 })?
        .to_device(g.device())
}

/// Records the fused attention (`functional::attention_fused`): its
/// backward is one `attention_backward` node that recomputes the scores
/// from the saved operands, `out` and the logsumexp `lse`. The mask gets no
/// gradient (a float mask that needs one runs the composite instead).
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    p: kiln_ir::op::attention::AttentionParams,
    lse: &Tensor,
    out: Tensor,
) -> Result<Tensor> {
    if !needs_grad(&[q, k, v]) {
        return Ok(out);
    }
    let name = "scaled_dot_product_attention";
    let [sq, sk, sv] = [q, k, v].map(|t| Saved::new(name, t));
    let sm = mask.map(|m| Saved::new(name, m));
    let (so, sl) = (Saved::new(name, &out), Saved::new(name, lse));
    record(name, out, &[q, k, v], move |g| {
        let (q, k, v) = (sq.get()?, sk.get()?, sv.get()?);
        let m = sm.as_ref().map(Saved::get).transpose()?;
        let (o, l) = (so.get()?, sl.get()?);
        let grads =
            F::attention_fused::attention_backward((&q, &k, &v), m.as_ref(), (&o, &l, g), p)?;
        Ok(grads.into_iter().map(Some).collect())
    })
}
