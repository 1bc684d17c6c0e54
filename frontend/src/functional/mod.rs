//! `torch.nn.functional` for kiln: matmul/linear/conv/pooling/embedding call
//! the runtime's extern kernels on the CPU and generated kernels on a CUDA
//! device (the `*_kernel` modules); norms and losses come from the
//! decomposition table (`kiln_passes::decompose`), run eagerly.

mod activation;
mod attention;
mod blas_more;
mod boxes;
mod ctc;
mod distance;
mod einsum;
mod embedding_bag;
mod grid;
mod im2col;
mod interpolate;
mod loss;
mod loss_index;
mod loss_more;
mod norm;
mod norm_more;
mod pad;
mod pool_nd;
mod quantized;
mod roi;

pub use crate::nn::conv3d::conv3d;
pub use crate::nn::pixel_shuffle::{pixel_shuffle, pixel_unshuffle};
pub use activation::*;
pub use attention::{scaled_dot_product_attention, scaled_dot_product_attention_math, SdpaOpts};
pub use blas_more::{addbmm, addmm, baddbmm, cosine_similarity, glu, normalize, outer, softmin};
pub use boxes::{batched_nms, box_iou, nms};
pub use conv_grad::conv2d_weight_grad;
pub use ctc::{ctc_loss, CtcOpts};
pub use distance::cdist;
pub use einsum::einsum;
pub use embedding_bag::{embedding_bag, BagMode, BagOpts};
pub use grid::{affine_grid, grid_sample, GridMode, GridPadding};
pub use im2col::{fold, unfold, Im2colParams};
pub use interpolate::{interpolate, Resize};
/// The losses' `reduction=` and the class losses' options (also `kiln::Reduction`).
pub use kiln_passes::decompose_loss::{ClassLossOpts, Reduction};
pub use loss::*;
pub use loss_index::{gaussian_nll_loss, multi_margin_loss, multilabel_margin_loss};
pub use loss_more::{
    cosine_embedding_loss, hinge_embedding_loss, kl_div, margin_ranking_loss,
    multilabel_soft_margin_loss, pairwise_distance, poisson_nll_loss, soft_margin_loss,
    triplet_margin_loss, TripletOpts,
};
pub use norm::*;
pub use norm_more::{instance_norm, local_response_norm, RunningStats};
pub use pad::pad;
pub use pool_nd::{
    adaptive_avg_pool1d, adaptive_max_pool1d, avg_pool1d, avg_pool3d, max_pool1d, max_pool3d,
    max_pool3d_with_indices, Pool1dParams, Pool3dParams,
};
pub use pooling::{
    adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, max_pool2d, max_pool2d_values,
};
pub use quantized::{quantized_linear, quantized_linear_with, RowTileEpilogue};
pub use roi::{roi_align, roi_pool, RoiAlignOpts};

use crate::amp::{self, Policy};
use crate::autograd::rules::nn as rules;
use crate::compile::trace;
use crate::device::via_host;
use crate::Tensor;
use kiln_ir::op::conv::{self, ConvParams, ConvTransposeParams};
use kiln_ir::op::pool::{self, Pool2dGeometry, Pool2dParams};
use kiln_ir::op::Op;
use kiln_ir::op::{embedding as emb, matmul as mm};
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};
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
    extern_try_out(name, ins, dims, dtype, |out| {
        fill(out);
        Ok(())
    })
}

/// [`extern_out`] for a kernel that can fail (a conv's scratch allocation).
fn extern_try_out(
    name: &'static str,
    ins: &[&Tensor],
    dims: &[usize],
    dtype: DType,
    fill: impl FnOnce(&Tensor) -> Result<()>,
) -> Result<Tensor> {
    let out = Tensor::zeros_for(name, dims, dtype.compute(), kiln_runtime::Device::Cpu)?;
    extern_fill(name, ins, out, dtype, fill)
}

/// [`extern_try_out`] on an output the caller allocated (in the compute
/// dtype): a kernel that writes every element takes it unzeroed.
fn extern_fill(
    name: &'static str,
    ins: &[&Tensor],
    out: Tensor,
    dtype: DType,
    fill: impl FnOnce(&Tensor) -> Result<()>,
) -> Result<Tensor> {
    {
        let _p = profiler::scope(name, Category::Extern)
            .shapes(|| shapes(ins))
            .bytes(|| ins.iter().chain([&&out]).map(|t| nbytes(t)).sum());
        fill(&out)?;
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

/// The present tensors of an optional list (for `needs_grad`, and a traced
/// node's operands).
fn ins<'a>(ts: &[Option<&'a Tensor>]) -> Vec<&'a Tensor> {
    ts.iter().flatten().copied().collect()
}

/// An op-level profiler scope over `ins` (free when not profiling).
fn op_scope(name: &'static str, ins: &[&Tensor]) -> profiler::Scope {
    profiler::scope(name, Category::Op).shapes(|| shapes(ins))
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
    let spatial = if op == "conv1d" { 1 } else { 2 };
    let node = || Op::Conv {
        params: p.clone(),
        spatial,
    };
    trace::record(node, &ins(&[Some(x), Some(w), bias]), || {
        conv_eager(op, x, w, bias, p)
    })
}

fn conv_eager(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    p: &ConvParams,
) -> Result<Tensor> {
    let _p = op_scope(op, &[x, w]);
    let mut ts = vec![x, w];
    ts.extend(bias);
    trace::check_launch(op, &ts)?;
    let dt = float_dtype(op, &ts)?;
    let g = conv::conv_geometry(op, x.dims(), w.dims(), bias.map(|b| b.dims()), p)?;
    let (xc, wc) = (compute_input(x)?, compute_input(w)?);
    let bc = bias.map(compute_input).transpose()?;
    if ts.iter().any(|t| t.device().is_cuda()) {
        let y = conv_kernel::conv_kernel(&g, &xc, &wc, bc.as_ref(), dt.compute())?;
        return rules::conv(g, x, w, bias, y.to_dtype(dt)?);
    }
    // every conv algorithm writes every output element (their tests start from NaN)
    let out = Tensor::empty_for(op, &g.out_shape(), dt.compute(), kiln_runtime::Device::Cpu)?;
    let y = extern_fill(op, &[&xc, &wc], out, dt, |out| unsafe {
        dispatch_float!(dt, T => externs::conv::conv2d_call::<T>(
            &g, data(&xc), data(&wc), bc.as_ref().map(|b| data::<T>(b)), out.storage.as_mut_slice::<T>(),
            externs::conv::ConvCall { epilogue: None, weight_key: weight_key(w, &wc) },
        ))
        .map(|_| ())
    })?;
    rules::conv(g, x, w, bias, y)
}

/// Identifies a parameter's conv weight (`wc`, contiguous, as
/// `compute_input` made it from `w`) so its packed forms are reused until
/// the parameter changes in place (its version moves). Only parameters and
/// storages marked stable (a compiled graph's cached hoisted values) get a
/// key: any other computed weight may be rewritten in its buffer without a
/// version bump, so it is packed afresh each call.
fn weight_key<'a>(w: &Tensor, wc: &'a Tensor) -> Option<externs::packed::WeightKey<'a>> {
    let keyed = w.requires_grad() || externs::packed::is_stable(&wc.storage);
    keyed.then(|| externs::packed::WeightKey {
        storage: &wc.storage,
        offset: wc.offset(),
        dims: wc.dims(),
        version: wc.version(),
    })
}

/// conv1d/conv2d (no autograd) calling `epilogue(out, tile)` on each output
/// tile as soon as the GEMM has written it: how a compiled graph applies a
/// conv's pointwise epilogue while the tile is in cache. f32/f64 only (half
/// dtypes compute in a widened copy, so there is no tile of `out` to rewrite).
pub fn conv_with_epilogue(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    p: &ConvParams,
    spatial: usize,
    epilogue: &(dyn Fn(&Tensor, externs::conv::Tile) -> Result<()> + Sync),
) -> Result<Tensor> {
    let op = if spatial == 1 { "conv1d" } else { "conv2d" };
    let _p = op_scope(op, &[x, w]);
    let mut ts = vec![x, w];
    ts.extend(bias);
    let dt = float_dtype(op, &ts)?;
    if dt.is_half() {
        bail!(op, "a tile epilogue needs f32 or f64, got {dt}");
    }
    let g = conv::conv_geometry(op, x.dims(), w.dims(), bias.map(|b| b.dims()), p)?;
    let (xc, wc) = (compute_input(x)?, compute_input(w)?);
    let bc = bias.map(compute_input).transpose()?;
    let failed = std::sync::Mutex::new(None);
    let out = Tensor::empty_for(op, &g.out_shape(), dt.compute(), kiln_runtime::Device::Cpu)?;
    let y = extern_fill(op, &[&xc, &wc], out, dt, |out| {
        let tile = |t: externs::conv::Tile| {
            if let Err(e) = epilogue(out, t) {
                failed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(e);
            }
        };
        unsafe {
            dispatch_float!(dt, T => externs::conv::conv2d_call::<T>(
                &g, data(&xc), data(&wc), bc.as_ref().map(|b| data::<T>(b)),
                out.storage.as_mut_slice::<T>(),
                externs::conv::ConvCall { epilogue: Some(&tile), weight_key: weight_key(w, &wc) },
            ))
            .map(|_| ())
        }
    })?;
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(y),
    }
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
    let node = || Op::ConvTranspose2d(p.clone());
    trace::record(node, &ins(&[Some(x), Some(w), bias]), || {
        conv_transpose2d_eager(x, w, bias, p)
    })
}

fn conv_transpose2d_eager(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    p: &ConvTransposeParams,
) -> Result<Tensor> {
    let _p = op_scope("conv_transpose2d", &[x, w]);
    let mut ts = vec![x, w];
    ts.extend(bias);
    trace::check_launch("conv_transpose2d", &ts)?;
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
    if ts.iter().any(|t| t.device().is_cuda()) {
        let y =
            conv_transpose_kernel::conv_transpose_kernel(&g, &xc, &wc, bc.as_ref(), dt.compute())?;
        return rules::conv_transpose(g, x, w, bias, y.to_dtype(dt)?);
    }
    let y = extern_try_out(
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

/// `F.conv_transpose1d`: `conv_transpose2d` over `(N, C, 1, L)`.
pub fn conv_transpose1d(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    p: &ConvTransposeParams,
) -> Result<Tensor> {
    if !(2..=3).contains(&x.rank()) || w.rank() != 3 {
        bail!(
            "conv_transpose1d",
            "expected a 2-D or 3-D input and a 3-D weight, got input {} and weight {}",
            fmt_dims(x.dims()),
            fmt_dims(w.dims())
        );
    }
    let two = |v: &[usize], one: usize| match v {
        [a] => vec![one, *a],
        v => [&[one][..], v].concat(),
    };
    let p2 = ConvTransposeParams {
        stride: two(&p.stride, 1),
        padding: two(&p.padding, 0),
        output_padding: two(&p.output_padding, 0),
        dilation: two(&p.dilation, 1),
        groups: p.groups,
    };
    let y = conv_transpose2d(&x.unsqueeze(-2)?, &w.unsqueeze(-2)?, bias, &p2)?;
    y.squeeze(Some(&[-2]))
}

/// `vals` (computed from shapes only) as a constant tensor of `like`'s float
/// dtype on its device (f64 stays f64, anything else goes through f32).
pub(crate) fn consts_like(like: &Tensor, vals: Vec<f64>, dims: &[usize]) -> Result<Tensor> {
    let t = if like.dtype() == DType::F64 {
        Tensor::from_vec(vals, dims)?
    } else {
        let v: Vec<f32> = vals.iter().map(|&x| x as f32).collect();
        let t = Tensor::from_vec(v, dims)?;
        if like.dtype().is_float() && like.dtype() != DType::F32 {
            t.to_dtype(like.dtype())?
        } else {
            t
        }
    };
    t.to_device(like.device())
}

/// `F.embedding(indices, weight, padding_idx)`: rows of `weight` (padding_idx
/// matters for backward only, so the traced `embedding` node does not carry it).
pub fn embedding(indices: &Tensor, weight: &Tensor, padding_idx: Option<i64>) -> Result<Tensor> {
    trace::record(
        || Op::Embedding,
        &[indices, weight],
        || embedding_eager(indices, weight, padding_idx),
    )
}

fn embedding_eager(indices: &Tensor, weight: &Tensor, padding_idx: Option<i64>) -> Result<Tensor> {
    // host indices join a table on the device (a small copy); device
    // indices into a host table run on the host
    if weight.device().is_cuda() && indices.device() != weight.device() {
        let on = trace::untraced(|| indices.to_device(weight.device()))?;
        return embedding_eager(&on, weight, padding_idx);
    }
    if !weight.device().is_cuda() {
        if let Some(r) = via_host("embedding", &[indices, weight], |h| {
            embedding_eager(&h[0], &h[1], padding_idx)
        }) {
            return r;
        }
    }
    let _p = op_scope("embedding", &[indices, weight]);
    trace::check_launch("embedding", &[indices, weight])?;
    let shape = emb::embedding_shape(weight.dims(), indices.dims(), indices.dtype())?;
    emb::resolve_padding_idx(weight.dims(), padding_idx)?;
    let dt = float_dtype("embedding", &[weight])?;
    let idx = indices.to_dtype(DType::I64)?.contiguous()?;
    let wc = compute_input(weight)?;
    if weight.device().is_cuda() {
        let out = embedding_kernel::embedding_kernel(&idx, &wc)?
            .reshape_dims(&shape)?
            .to_dtype(dt)?;
        return crate::autograd::rules::index::embedding(indices, weight, padding_idx, out);
    }
    let (v, d) = (weight.dims()[0], weight.dims()[1]);
    let mut res = Ok(());
    let out = extern_out("embedding", &[&idx, &wc], &shape, dt, |out| unsafe {
        res = dispatch_float!(dt, T => externs::embedding::embedding::<T, i64>(data(&wc), v, d, data(&idx), out.storage.as_mut_slice::<T>()))
    })?;
    res?;
    crate::autograd::rules::index::embedding(indices, weight, padding_idx, out)
}

// after the macros above, which it uses
pub(crate) mod attention_fused;
mod conv_grad;
mod conv_kernel;
mod conv_transpose_kernel;
mod embedding_kernel;
mod pooling;
pub(crate) use conv_kernel::as_nkhw;
pub use conv_kernel::conv_with_epilogue_on_device;
pub use matmul_kernel::matmul_with_epilogue_on_device;
mod matmul;
mod matmul_kernel;
pub use matmul::{bmm, linear, matmul};
pub(crate) mod pool_kernel;
