//! `torch.nn.functional` for kiln: matmul/linear/conv/pooling/embedding call
//! the runtime's extern kernels; norms and losses come from the decomposition
//! table (`kiln_passes::decompose`), run eagerly.

use crate::amp::{self, Policy};
use crate::autograd::rules::builder::TensorBuilder;
use crate::autograd::rules::nn as rules;
use crate::ops::composite::decomposed;
use crate::ops::fuse::{Fuser, Lazy};
use crate::Tensor;
use kiln_ir::op::conv::{self, ConvParams, ConvTransposeParams};
use kiln_ir::op::pool::{self, Pool2dGeometry, Pool2dParams};
use kiln_ir::op::{embedding as emb, matmul as mm};
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};
use kiln_passes::decompose;
use kiln_passes::decompose_loss::{self as loss, ClassLossOpts, Reduction};
use kiln_runtime::externs;
use kiln_runtime::profiler::{self, Category};

/// The float dtype extern kernels compute `ts` in (f16/bf16 widen to f32), or an
/// error naming `op` when the dtypes differ or are not floating.
fn float_dtype(op: &str, ts: &[&Tensor]) -> Result<DType> {
    let d = ts[0].dtype();
    for t in ts {
        if t.dtype() != d {
            let all: Vec<String> = ts
                .iter()
                .map(|t| format!("{} {}", t.dtype(), fmt_dims(t.dims())))
                .collect();
            bail!(
                op,
                "expected all tensors to have the same dtype, got {}",
                all.join(", ")
            );
        }
    }
    if !d.is_float() {
        bail!(
            op,
            "unsupported dtype {d} (input {}): expected a floating-point tensor",
            fmt_dims(ts[0].dims())
        );
    }
    Ok(d)
}

/// Contiguous copy in the compute dtype (f32 for f16/bf16), outside the graph.
fn compute_input(t: &Tensor) -> Result<Tensor> {
    t.detach().to_dtype(t.dtype().compute())?.contiguous()
}

/// The elements of a contiguous tensor from its offset on.
unsafe fn data<T: Copy>(t: &Tensor) -> &[T] {
    &t.storage.as_slice::<T>()[t.offset()..t.offset() + t.numel()]
}

/// Runs `f` with the dtype `d` as a Rust type (f32 or f64).
macro_rules! dispatch_float {
    ($d:expr, $T:ident => $body:expr) => {
        match $d {
            DType::F64 => {
                type $T = f64;
                $body
            }
            _ => {
                type $T = f32;
                $body
            }
        }
    };
}

/// Allocates the output in the compute dtype, fills it with `fill` (the extern
/// kernel `name` over `ins`, profiled as one extern event), and narrows to `dtype`.
fn extern_out(
    name: &'static str,
    ins: &[&Tensor],
    dims: &[usize],
    dtype: DType,
    fill: impl FnOnce(&Tensor),
) -> Result<Tensor> {
    let out = Tensor::zeros(dims, dtype.compute());
    {
        let _p = profiler::scope(name, Category::Extern)
            .shapes(|| shapes(ins))
            .bytes(|| ins.iter().chain([&&out]).map(|t| nbytes(t)).sum());
        fill(&out);
    }
    out.to_dtype(dtype)
}

/// Input shapes for the profiler.
fn shapes(ts: &[&Tensor]) -> Vec<Vec<usize>> {
    ts.iter().map(|t| t.dims().to_vec()).collect()
}

fn nbytes(t: &Tensor) -> u64 {
    (t.numel() * t.dtype().size()) as u64
}

/// An op-level profiler scope over `ins` (free when not profiling).
fn op_scope(name: &'static str, ins: &[&Tensor]) -> profiler::Scope {
    profiler::scope(name, Category::Op).shapes(|| shapes(ins))
}

/// `torch.matmul` for every rank combination; strided operands (transposes,
/// broadcast batches) are read in place through their strides.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if let Some((a, b)) = amp::cast_for(Policy::Lower, (a, b))? {
        return matmul(&a, &b);
    }
    let _p = op_scope("matmul", &[a, b]);
    let dt = float_dtype("matmul", &[a, b])?;
    let plan = mm::matmul_plan(a.dims(), b.dims())?;
    let (a0, b0) = (a, b);
    let (a, b) = (
        a.detach().to_dtype(dt.compute())?,
        b.detach().to_dtype(dt.compute())?,
    );
    let a2 = if plan.a_vec { a.unsqueeze(0)? } else { a };
    let b2 = if plan.b_vec { b.unsqueeze(-1)? } else { b };
    let bl = plan.batch.len();
    let expand = |t: &Tensor, r: usize, c: usize| -> Result<Tensor> {
        let mut d: Vec<usize> = plan.batch.to_vec();
        d.extend([r, c]);
        t.expand_to(&d)
    };
    let (ae, be) = (expand(&a2, plan.m, plan.k)?, expand(&b2, plan.k, plan.n)?);
    let offsets = |t: &Tensor| -> Vec<usize> {
        let s: Vec<usize> = t.strides()[..bl].iter().map(|&x| x as usize).collect();
        externs::gemm::batch_offsets(&plan.batch, &s)
            .into_iter()
            .map(|o| o + t.offset())
            .collect()
    };
    let (ao, bo) = (offsets(&ae), offsets(&be));
    let (ars, acs) = (ae.strides()[bl], ae.strides()[bl + 1]);
    let (brs, bcs) = (be.strides()[bl], be.strides()[bl + 1]);
    let mut full: Vec<usize> = plan.batch.to_vec();
    full.extend([plan.m, plan.n]);
    let out = extern_out("matmul", &[&a2, &b2], &full, dt, |out| unsafe {
        dispatch_float!(dt, T => externs::gemm::batched_matmul_offsets::<T>(
            plan.m, plan.k, plan.n,
            ae.storage.as_slice::<T>(), &ao, ars, acs,
            be.storage.as_slice::<T>(), &bo, brs, bcs,
            out.storage.as_mut_slice::<T>(),
        ))
    })?;
    rules::matmul(a0, b0, out.reshape_dims(&plan.out)?)
}

/// `torch.bmm`: (B, M, K) @ (B, K, N), no broadcasting.
pub fn bmm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    mm::bmm_shape(a.dims(), b.dims())?;
    matmul(a, b)
}

/// `F.linear(x, weight, bias)`: x @ weight^T + bias, any leading dims.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if let Some((x, w, b)) = amp::cast_for(Policy::Lower, (x, weight, bias))? {
        return linear(&x, &w, b.as_ref());
    }
    let _p = op_scope("linear", &[x, weight]);
    let shape = mm::linear_shape(x.dims(), weight.dims(), bias.map(|b| b.dims()))?;
    let y = matmul(x, &weight.t()?)?;
    let y = match bias {
        Some(b) => y.add(b)?,
        None => y,
    };
    y.reshape_dims(&shape)
}

/// `F.conv2d` (stride, padding incl. 'same', dilation, groups).
pub fn conv2d(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, p: &ConvParams) -> Result<Tensor> {
    conv_nd("conv2d", x, w, bias, p)
}

/// `F.conv1d`: a conv2d with H = 1.
pub fn conv1d(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, p: &ConvParams) -> Result<Tensor> {
    conv_nd("conv1d", x, w, bias, p)
}

fn conv_nd(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    p: &ConvParams,
) -> Result<Tensor> {
    if let Some((x, w, b)) = amp::cast_for(Policy::Lower, (x, w, bias))? {
        return conv_nd(op, &x, &w, b.as_ref(), p);
    }
    let _p = op_scope(op, &[x, w]);
    let mut ts = vec![x, w];
    ts.extend(bias);
    let dt = float_dtype(op, &ts)?;
    let g = conv::conv_geometry(op, x.dims(), w.dims(), bias.map(|b| b.dims()), p)?;
    let (xc, wc) = (compute_input(x)?, compute_input(w)?);
    let bc = bias.map(compute_input).transpose()?;
    let y = extern_out(op, &[&xc, &wc], &g.out_shape(), dt, |out| unsafe {
        dispatch_float!(dt, T => externs::conv::conv2d::<T>(
            &g, data(&xc), data(&wc), bc.as_ref().map(|b| data::<T>(b)), out.storage.as_mut_slice::<T>(),
        ))
    })?;
    rules::conv(g, x, w, bias, y)
}

/// `F.conv_transpose2d` (stride, padding, output_padding, dilation, groups).
pub fn conv_transpose2d(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    p: &ConvTransposeParams,
) -> Result<Tensor> {
    if let Some((x, w, b)) = amp::cast_for(Policy::Lower, (x, w, bias))? {
        return conv_transpose2d(&x, &w, b.as_ref(), p);
    }
    let _p = op_scope("conv_transpose2d", &[x, w]);
    let mut ts = vec![x, w];
    ts.extend(bias);
    let dt = float_dtype("conv_transpose2d", &ts)?;
    let g = conv::conv_transpose_geometry(
        "conv_transpose2d",
        x.dims(),
        w.dims(),
        bias.map(|b| b.dims()),
        p,
    )?;
    let (xc, wc) = (compute_input(x)?, compute_input(w)?);
    let bc = bias.map(compute_input).transpose()?;
    let y = extern_out(
        "conv_transpose2d",
        &[&xc, &wc],
        &g.out_shape(),
        dt,
        |out| unsafe {
            dispatch_float!(dt, T => externs::conv::conv_transpose2d::<T>(
                &g, data(&xc), data(&wc), bc.as_ref().map(|b| data::<T>(b)), out.storage.as_mut_slice::<T>(),
            ))
        },
    )?;
    rules::conv_transpose(g, x, w, bias, y)
}

fn pool_with_indices(
    op: &'static str,
    x: &Tensor,
    g: &Pool2dGeometry,
    run: impl Fn(&Pool2dGeometry, &Tensor, &Tensor, &Tensor, DType),
) -> Result<(Tensor, Tensor)> {
    let _p = op_scope(op, &[x]);
    let dt = float_dtype(op, &[x])?;
    let xc = compute_input(x)?;
    let idx = Tensor::zeros(&g.out_shape(), DType::I64);
    let out = extern_out(op, &[&xc], &g.out_shape(), dt, |out| {
        run(g, &xc, out, &idx, dt)
    })?;
    let name = if op == "max_pool2d" {
        "max_pool2d"
    } else {
        "adaptive_max_pool2d"
    };
    Ok((rules::max_pool(name, *g, x, &idx, out)?, idx))
}

/// `F.max_pool2d(..., return_indices=True)`: values and flat h*W+w indices.
pub fn max_pool2d(x: &Tensor, p: &Pool2dParams) -> Result<(Tensor, Tensor)> {
    let g = pool::pool2d_geometry("max_pool2d", x.dims(), p)?;
    pool_with_indices("max_pool2d", x, &g, |g, xc, out, idx, dt| unsafe {
        dispatch_float!(dt, T => externs::pool::max_pool2d::<T>(g, data(xc), out.storage.as_mut_slice::<T>(), Some(idx.storage.as_mut_slice::<i64>())))
    })
}

/// `F.adaptive_max_pool2d(..., return_indices=True)`.
pub fn adaptive_max_pool2d(x: &Tensor, output_size: [usize; 2]) -> Result<(Tensor, Tensor)> {
    let g = pool::adaptive_pool2d_geometry("adaptive_max_pool2d", x.dims(), output_size)?;
    pool_with_indices("adaptive_max_pool2d", x, &g, |g, xc, out, idx, dt| unsafe {
        dispatch_float!(dt, T => externs::pool::adaptive_max_pool2d::<T>(g, data(xc), out.storage.as_mut_slice::<T>(), Some(idx.storage.as_mut_slice::<i64>())))
    })
}

/// `F.avg_pool2d` (count_include_pad, ceil_mode, divisor_override).
pub fn avg_pool2d(
    x: &Tensor,
    p: &Pool2dParams,
    count_include_pad: bool,
    divisor_override: Option<i64>,
) -> Result<Tensor> {
    let _p = op_scope("avg_pool2d", &[x]);
    let dt = float_dtype("avg_pool2d", &[x])?;
    pool::check_divisor_override("avg_pool2d", divisor_override)?;
    let g = pool::pool2d_geometry("avg_pool2d", x.dims(), p)?;
    let xc = compute_input(x)?;
    let y = extern_out("avg_pool2d", &[&xc], &g.out_shape(), dt, |out| unsafe {
        dispatch_float!(dt, T => externs::pool::avg_pool2d::<T>(&g, data(&xc), out.storage.as_mut_slice::<T>(), count_include_pad, divisor_override))
    })?;
    rules::avg_pool(
        "avg_pool2d",
        g,
        false,
        count_include_pad,
        divisor_override,
        x,
        y,
    )
}

/// `F.adaptive_avg_pool2d`.
pub fn adaptive_avg_pool2d(x: &Tensor, output_size: [usize; 2]) -> Result<Tensor> {
    let _p = op_scope("adaptive_avg_pool2d", &[x]);
    let dt = float_dtype("adaptive_avg_pool2d", &[x])?;
    let g = pool::adaptive_pool2d_geometry("adaptive_avg_pool2d", x.dims(), output_size)?;
    let xc = compute_input(x)?;
    let y = extern_out(
        "adaptive_avg_pool2d",
        &[&xc],
        &g.out_shape(),
        dt,
        |out| unsafe {
            dispatch_float!(dt, T => externs::pool::adaptive_avg_pool2d::<T>(&g, data(&xc), out.storage.as_mut_slice::<T>()))
        },
    )?;
    rules::avg_pool("adaptive_avg_pool2d", g, true, false, None, x, y)
}

/// `F.embedding(indices, weight, padding_idx)`: rows of `weight` (padding_idx matters for backward only).
pub fn embedding(indices: &Tensor, weight: &Tensor, padding_idx: Option<i64>) -> Result<Tensor> {
    let _p = op_scope("embedding", &[indices, weight]);
    let shape = emb::embedding_shape(weight.dims(), indices.dims(), indices.dtype())?;
    emb::resolve_padding_idx(weight.dims(), padding_idx)?;
    let dt = float_dtype("embedding", &[weight])?;
    let idx = indices.to_dtype(DType::I64)?.contiguous()?;
    let wc = compute_input(weight)?;
    let (v, d) = (weight.dims()[0], weight.dims()[1]);
    let mut res = Ok(());
    let out = extern_out("embedding", &[&idx, &wc], &shape, dt, |out| unsafe {
        res = dispatch_float!(dt, T => externs::embedding::embedding::<T, i64>(data(&wc), v, d, data(&idx), out.storage.as_mut_slice::<T>()))
    })?;
    res?;
    crate::autograd::rules::index::embedding(indices, weight, padding_idx, out)
}

/// `F.layer_norm` over the trailing `normalized_shape` dims.
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    if let Some((x, w, b)) = amp::cast_for(Policy::F32, (x, weight, bias))? {
        return layer_norm(&x, normalized_shape, w.as_ref(), b.as_ref(), eps);
    }
    let _p = op_scope("layer_norm", &[x]);
    kiln_ir::op::infer::require_float("layer_norm", &x.meta())?;
    decomposed!(&ins(&[Some(x), weight, bias]), |f, cv| {
        let (w, b) = (weight.map(cv), bias.map(cv));
        decompose::layer_norm(f, &cv(x), normalized_shape, w.as_ref(), b.as_ref(), eps)
    })
}

/// The present tensors of an optional list (for `needs_grad`).
fn ins<'a>(ts: &[Option<&'a Tensor>]) -> Vec<&'a Tensor> {
    ts.iter().flatten().copied().collect()
}

/// `F.group_norm` on (N, C, *).
pub fn group_norm(
    x: &Tensor,
    groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    if let Some((x, w, b)) = amp::cast_for(Policy::F32, (x, weight, bias))? {
        return group_norm(&x, groups, w.as_ref(), b.as_ref(), eps);
    }
    let _p = op_scope("group_norm", &[x]);
    kiln_ir::op::infer::require_float("group_norm", &x.meta())?;
    decomposed!(&ins(&[Some(x), weight, bias]), |f, cv| {
        let (w, b) = (weight.map(cv), bias.map(cv));
        decompose::group_norm(f, &cv(x), groups, w.as_ref(), b.as_ref(), eps)
    })
}

/// `F.batch_norm`: in training, `running_mean`/`running_var` are updated in
/// place (with the unbiased batch variance), as PyTorch does.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    // the running stats are updated in place: never cast
    if let Some((x, w, b)) = amp::cast_for(Policy::F32, (x, weight, bias))? {
        let (rm, rv) = (running_mean, running_var);
        return batch_norm(&x, rm, rv, w.as_ref(), b.as_ref(), training, momentum, eps);
    }
    let _p = op_scope("batch_norm", &[x]);
    kiln_ir::op::infer::require_float("batch_norm", &x.meta())?;
    let (y, running) = if crate::autograd::needs_grad(&ins(&[Some(x), weight, bias])) {
        let r = decompose::batch_norm(
            &mut TensorBuilder,
            x,
            running_mean,
            running_var,
            weight,
            bias,
            training,
            momentum,
            eps,
        )?;
        (r.y, r.running.map(|(m, v)| (m.detach(), v.detach())))
    } else {
        let (rm, rv, w, b) = (
            lazy(running_mean),
            lazy(running_var),
            lazy(weight),
            lazy(bias),
        );
        let r = decompose::batch_norm(
            &mut Fuser,
            &Lazy::tensor(x),
            rm.as_ref(),
            rv.as_ref(),
            w.as_ref(),
            b.as_ref(),
            training,
            momentum,
            eps,
        )?;
        let running = match r.running {
            Some((m, v)) => Some((m.materialize()?, v.materialize()?)),
            None => None,
        };
        (r.y.materialize()?, running)
    };
    if let (Some((m, v)), Some(rm), Some(rv)) = (running, running_mean, running_var) {
        let _ng = crate::autograd::no_grad();
        rm.copy_(&m)?;
        rv.copy_(&v)?;
    }
    Ok(y)
}

/// Optional tensor arguments as lazy values.
fn lazy(t: Option<&Tensor>) -> Option<Lazy> {
    t.map(Lazy::tensor)
}

/// `F.cross_entropy` (class indices or probabilities; weight, ignore_index, label_smoothing).
pub fn cross_entropy(
    x: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    o: ClassLossOpts,
) -> Result<Tensor> {
    if let Some((x, t, w)) = amp::cast_for(Policy::F32, (x, target, weight))? {
        return cross_entropy(&x, &t, w.as_ref(), o);
    }
    let _p = op_scope("cross_entropy", &[x, target]);
    kiln_ir::op::infer::require_float("cross_entropy", &x.meta())?;
    decomposed!(&ins(&[Some(x), Some(target), weight]), |f, cv| {
        let w = weight.map(cv);
        loss::cross_entropy(f, &cv(x), &cv(target), w.as_ref(), o)
    })
}

/// `F.nll_loss` on log-probabilities.
pub fn nll_loss(
    logp: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    o: ClassLossOpts,
) -> Result<Tensor> {
    if let Some((lp, t, w)) = amp::cast_for(Policy::F32, (logp, target, weight))? {
        return nll_loss(&lp, &t, w.as_ref(), o);
    }
    let _p = op_scope("nll_loss", &[logp, target]);
    decomposed!(&ins(&[Some(logp), Some(target), weight]), |f, cv| {
        let w = weight.map(cv);
        loss::nll_loss(f, &cv(logp), &cv(target), w.as_ref(), o)
    })
}

/// `F.mse_loss`; a target whose shape differs from the input's broadcasts,
/// with PyTorch's warning (once per call site).
#[track_caller]
pub fn mse_loss(x: &Tensor, y: &Tensor, r: Reduction) -> Result<Tensor> {
    let _p = op_scope("mse_loss", &[x, y]);
    target_size_warning(x, y);
    let c = amp::cast_for(Policy::F32, (x, y))?;
    let (x, y) = c.as_ref().map_or((x, y), |(x, y)| (x, y));
    decomposed!(&[x, y], |f, cv| loss::mse_loss(f, &cv(x), &cv(y), r))
}

/// `F.l1_loss` (broadcasts like [`mse_loss`]).
#[track_caller]
pub fn l1_loss(x: &Tensor, y: &Tensor, r: Reduction) -> Result<Tensor> {
    let _p = op_scope("l1_loss", &[x, y]);
    target_size_warning(x, y);
    let c = amp::cast_for(Policy::F32, (x, y))?;
    let (x, y) = c.as_ref().map_or((x, y), |(x, y)| (x, y));
    decomposed!(&[x, y], |f, cv| loss::l1_loss(f, &cv(x), &cv(y), r))
}

/// `F.smooth_l1_loss` (broadcasts like [`mse_loss`]).
#[track_caller]
pub fn smooth_l1_loss(x: &Tensor, y: &Tensor, r: Reduction, beta: f64) -> Result<Tensor> {
    let _p = op_scope("smooth_l1_loss", &[x, y]);
    target_size_warning(x, y);
    let c = amp::cast_for(Policy::F32, (x, y))?;
    let (x, y) = c.as_ref().map_or((x, y), |(x, y)| (x, y));
    decomposed!(&[x, y], |f, cv| loss::smooth_l1_loss(
        f,
        &cv(x),
        &cv(y),
        r,
        beta
    ))
}

/// `F.huber_loss` (broadcasts like [`mse_loss`]).
#[track_caller]
pub fn huber_loss(x: &Tensor, y: &Tensor, r: Reduction, delta: f64) -> Result<Tensor> {
    let _p = op_scope("huber_loss", &[x, y]);
    target_size_warning(x, y);
    let c = amp::cast_for(Policy::F32, (x, y))?;
    let (x, y) = c.as_ref().map_or((x, y), |(x, y)| (x, y));
    decomposed!(&[x, y], |f, cv| loss::huber_loss(
        f,
        &cv(x),
        &cv(y),
        r,
        delta
    ))
}

pub fn binary_cross_entropy_with_logits(
    x: &Tensor,
    y: &Tensor,
    weight: Option<&Tensor>,
    pos_weight: Option<&Tensor>,
    r: Reduction,
) -> Result<Tensor> {
    if let Some((x, y, w, pw)) = amp::cast_for(Policy::F32, (x, y, weight, pos_weight))? {
        return binary_cross_entropy_with_logits(&x, &y, w.as_ref(), pw.as_ref(), r);
    }
    let _p = op_scope("binary_cross_entropy_with_logits", &[x, y]);
    decomposed!(&ins(&[Some(x), Some(y), weight, pos_weight]), |f, cv| {
        let (w, pw) = (weight.map(cv), pos_weight.map(cv));
        loss::bce_with_logits(f, &cv(x), &cv(y), w.as_ref(), pw.as_ref(), r)
    })
}

pub fn binary_cross_entropy(
    p: &Tensor,
    y: &Tensor,
    weight: Option<&Tensor>,
    r: Reduction,
) -> Result<Tensor> {
    if let Some((p, y, w)) = amp::cast_for(Policy::F32, (p, y, weight))? {
        return binary_cross_entropy(&p, &y, w.as_ref(), r);
    }
    let _p = op_scope("binary_cross_entropy", &[p, y]);
    decomposed!(&ins(&[Some(p), Some(y), weight]), |f, cv| {
        let w = weight.map(cv);
        loss::binary_cross_entropy(f, &cv(p), &cv(y), w.as_ref(), r)
    })
}

/// PyTorch's `UserWarning` when a regression loss's target shape differs from
/// the input's but broadcasts (e.g. `(32,1)` vs `(32,)`: a `(32,32)` loss).
#[track_caller]
fn target_size_warning(x: &Tensor, y: &Tensor) {
    if x.dims() != y.dims() && kiln_ir::shape::broadcast_shapes("loss", x.dims(), y.dims()).is_ok()
    {
        crate::warnings::warn(&format!(
            "Using a target size ({}) that is different to the input size ({}). \
             This will likely lead to incorrect results due to broadcasting. \
             Please ensure they have the same size.",
            fmt_dims(y.dims()),
            fmt_dims(x.dims())
        ));
    }
}
