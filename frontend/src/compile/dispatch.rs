//! Running one graph op eagerly: the inverse of what the tracer records.
//! Each [`Op`] calls the public eager function that records it, so a traced
//! graph replayed node by node computes what the traced code computed.

use crate::functional as F;
use crate::ops::fuse::{Fuser, Lazy};
use crate::{Scalar, Tensor};
use kiln_ir::graph::Reduction;
use kiln_ir::op::Op;
use kiln_ir::{bail, ReduceKind, Result};
use kiln_passes::decompose::Builder;
use kiln_passes::ClassLossOpts;
use kiln_runtime::externs::conv::select as conv_select;

/// Runs one graph op eagerly on tensors: the inverse of what the tracer records.
///
/// `inputs` are the node's operands in order (optional ones as its `has_*`
/// flags declare). A multi-output op (`max_pool2d`, `adaptive_max_pool2d`)
/// returns all its results in order; every other op returns one. The inputs
/// are checked by [`Op::infer`] first, and the results against its types.
///
/// A `batch_norm` node with `training` and running stats writes the updated
/// stats into `inputs[1]` and `inputs[2]` in place, as `F::batch_norm` does.
pub fn run_op(op: &Op, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    let metas: Vec<_> = inputs.iter().map(Tensor::meta).collect();
    let want = op.infer(&metas)?;
    let outs = run(op, inputs)?;
    let got: Vec<_> = outs.iter().map(Tensor::meta).collect();
    if got != want {
        bail!(
            op.name(),
            "ran to {got:?} but the op's inference says {want:?}"
        );
    }
    Ok(outs)
}

fn one(t: Result<Tensor>) -> Result<Vec<Tensor>> {
    t.map(|t| vec![t])
}

fn two(t: Result<(Tensor, Tensor)>) -> Result<Vec<Tensor>> {
    t.map(|(a, b)| vec![a, b])
}

/// Takes the optional operands that `present` says follow, in order.
fn optional<'a>(rest: &mut std::slice::Iter<'a, Tensor>, present: bool) -> Option<&'a Tensor> {
    if present {
        rest.next()
    } else {
        None
    }
}

/// A graph reduction's dims: empty means every dim.
pub(crate) fn all_if_empty(x: &Tensor, dims: &[i64]) -> Vec<i64> {
    if dims.is_empty() {
        (0..x.rank() as i64).collect()
    } else {
        dims.to_vec()
    }
}

fn run(op: &Op, ins: &[Tensor]) -> Result<Vec<Tensor>> {
    let x = &ins[0];
    match op {
        Op::Unary(u) => one(x.unary(*u)),
        Op::Binary(b) => one(x.binary(*b, &ins[1])),
        Op::BinaryScalar {
            op,
            value,
            reversed,
        } => one(x.binary_scalar(*op, Scalar::from(*value), *reversed)),
        Op::Where => one(Tensor::where_(x, &ins[1], &ins[2])),
        Op::Cast(d) => one(x.to_dtype(*d)),
        Op::Reduce {
            kind,
            dims,
            keepdim,
        } => one(reduce(x, *kind, dims, *keepdim)),
        Op::Mean { dims, keepdim } => one(x.mean(Some(dims), *keepdim)),
        Op::Var {
            dims,
            correction,
            keepdim,
        } => one(x.var(dims, correction.0, *keepdim)),
        Op::Std {
            dims,
            correction,
            keepdim,
        } => one(x.std(dims, correction.0, *keepdim)),
        Op::LogSumExp { dims, keepdim } => one(x.logsumexp(dims, *keepdim)),
        Op::Softmax { dim } => one(x.softmax(*dim)),
        Op::LseParts { dims } => {
            let (shift, logsum) = Fuser.lse_parts(&Lazy::tensor(x), &all_if_empty(x, dims))?;
            Ok(vec![shift.materialize()?, logsum.materialize()?])
        }
        Op::Moments { dims, eps } => {
            let m = Fuser.moments(&Lazy::tensor(x), &all_if_empty(x, dims), eps.0)?;
            Ok(vec![
                m.mean.materialize()?,
                m.var.materialize()?,
                m.rstd.materialize()?,
            ])
        }
        Op::LogSoftmax { dim } => one(x.log_softmax(*dim)),
        Op::LayerNorm {
            normalized_shape,
            eps,
            has_weight,
            has_bias,
        } => {
            let mut rest = ins[1..].iter();
            let w = optional(&mut rest, *has_weight);
            let b = optional(&mut rest, *has_bias);
            one(F::layer_norm(x, normalized_shape, w, b, eps.0))
        }
        Op::GroupNorm {
            groups,
            eps,
            has_weight,
            has_bias,
        } => {
            let mut rest = ins[1..].iter();
            let w = optional(&mut rest, *has_weight);
            let b = optional(&mut rest, *has_bias);
            one(F::group_norm(x, *groups, w, b, eps.0))
        }
        Op::BatchNorm {
            training,
            momentum,
            eps,
            has_running_stats,
            has_weight,
            has_bias,
        } => {
            let mut rest = ins[1..].iter();
            let rm = optional(&mut rest, *has_running_stats);
            let rv = optional(&mut rest, *has_running_stats);
            let w = optional(&mut rest, *has_weight);
            let b = optional(&mut rest, *has_bias);
            one(F::batch_norm(x, rm, rv, w, b, *training, momentum.0, eps.0))
        }
        _ => run_kernel_op(op, ins),
    }
}

/// The extern-kernel, pooling, attention, data-movement and loss ops of
/// [`run`].
fn run_kernel_op(op: &Op, ins: &[Tensor]) -> Result<Vec<Tensor>> {
    let x = &ins[0];
    match op {
        Op::Matmul => one(F::matmul(x, &ins[1])),
        Op::Linear => one(F::linear(x, &ins[1], ins.get(2))),
        Op::QuantizedLinear { relu } => {
            one(F::quantized_linear(x, &ins[1], &ins[2], ins.get(3), *relu))
        }
        Op::Conv { params, spatial } => {
            // a compiled graph's convs time their algorithms (cudnn.benchmark)
            let _scope = conv_select::compiled_scope();
            match spatial {
                1 => one(F::conv1d(x, &ins[1], ins.get(2), params)),
                2 => one(F::conv2d(x, &ins[1], ins.get(2), params)),
                s => bail!("conv", "{s}-d convolution is not supported (1 or 2)"),
            }
        }
        Op::ConvTranspose2d(p) => one(F::conv_transpose2d(x, &ins[1], ins.get(2), p)),
        Op::AvgPool2dBackward {
            input_size,
            params,
            count_include_pad,
        } => {
            use kiln_ir::op::pool;
            let geo = match params {
                Some(p) => pool::pool2d_geometry("avg_pool2d_backward", input_size, p)?,
                None => {
                    let o = x.dims();
                    let hw = [o[o.len() - 2], o[o.len() - 1]];
                    pool::adaptive_pool2d_geometry("avg_pool2d_backward", input_size, hw)?
                }
            };
            let dt = x.dtype();
            one(crate::autograd::rules::nn::avg_pool_backward(
                &geo,
                params.is_none(),
                *count_include_pad,
                None,
                x,
                input_size,
                dt,
            ))
        }
        Op::ScatterAdd { dim, size } => {
            let d = kiln_ir::shape::norm_dim("scatter_add", *dim, size.len())?;
            one(crate::autograd::rules::index::scatter_add(
                size, d, x, &ins[1],
            ))
        }
        Op::Conv2dWeightGrad { params, kernel } => {
            one(F::conv2d_weight_grad(x, &ins[1], params, *kernel))
        }
        Op::MaxPool2d(p) => two(F::max_pool2d(x, p)),
        Op::AvgPool2d {
            params,
            count_include_pad,
        } => one(F::avg_pool2d(x, params, *count_include_pad, None)),
        Op::AdaptiveAvgPool2d(o) => one(F::adaptive_avg_pool2d(x, *o)),
        Op::AdaptiveMaxPool2d(o) => two(F::adaptive_max_pool2d(x, *o)),
        Op::Embedding => one(F::embedding(x, &ins[1], None)),
        Op::Attention(p) => F::attention_fused::run_attention_node(*p, ins),
        Op::AttentionBackward(p) => F::attention_fused::run_attention_backward_node(*p, ins),
        // a `view` node has reshape semantics: it copies when strides need it
        Op::View(shape) => one(x.reshape(shape)),
        Op::Permute(p) => one(x.permute(p)),
        Op::Expand(s) => one(x.expand(s)),
        Op::Slice {
            dim,
            start,
            stop,
            step,
        } => one(x.slice(*dim, *start, *stop, *step)),
        Op::Select { dim, index } => one(x.select(*dim, *index)),
        Op::Diagonal { offset, dim1, dim2 } => one(x.diagonal(*offset, *dim1, *dim2)),
        Op::Unfold { dim, size, step } => one(x.unfold(*dim, *size, *step)),
        Op::Cat { dim } => one(Tensor::cat(&ins.iter().collect::<Vec<_>>(), *dim)),
        Op::IndexSelect { dim } => one(x.index_select(*dim, &ins[1])),
        Op::Gather { dim } => one(x.gather(*dim, &ins[1])),
        Op::IndexBounds { op, dim, size } => {
            crate::ops::scatter::check_index_values(op, *dim, *size, x, None)?;
            one(x.copy())
        }
        Op::MaskedFill { value: Some(v) } => one(x.masked_fill(&ins[1], Scalar::from(*v))),
        Op::MaskedFill { value: None } => one(masked_fill_tensor(x, &ins[1], &ins[2])),
        Op::CrossEntropy {
            reduction,
            ignore_index,
            label_smoothing,
            has_weight,
        } => {
            let o = ClassLossOpts {
                reduction: *reduction,
                ignore_index: *ignore_index,
                label_smoothing: label_smoothing.0,
            };
            let w = if *has_weight { ins.get(2) } else { None };
            one(F::cross_entropy(x, &ins[1], w, o))
        }
        Op::NllLoss {
            reduction,
            ignore_index,
            has_weight,
        } => {
            let o = ClassLossOpts {
                reduction: *reduction,
                ignore_index: *ignore_index,
                label_smoothing: 0.0,
            };
            let w = if *has_weight { ins.get(2) } else { None };
            one(F::nll_loss(x, &ins[1], w, o))
        }
        Op::PairLoss {
            name,
            reduction,
            has_weight,
            has_pos_weight,
        } => {
            let mut rest = ins[2..].iter();
            let w = optional(&mut rest, *has_weight);
            let pw = optional(&mut rest, *has_pos_weight);
            one(pair_loss(name, x, &ins[1], w, pw, *reduction))
        }
        other => bail!(other.name(), "has no eager runner"),
    }
}

fn reduce(x: &Tensor, kind: ReduceKind, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    match kind {
        ReduceKind::Sum => x.sum(Some(dims), keepdim),
        ReduceKind::Prod => x.prod(Some(dims), keepdim),
        ReduceKind::Max => x.amax(Some(dims), keepdim),
        ReduceKind::Min => x.amin(Some(dims), keepdim),
        ReduceKind::LogSumExp => x.logsumexp(dims, keepdim),
        // Welford's single value is the biased variance
        ReduceKind::Welford => x.var(dims, 0.0, keepdim),
        ReduceKind::ArgMax | ReduceKind::ArgMin => {
            if dims.len() > 1 {
                bail!(
                    kind.name(),
                    "reduces one dim or all of them, got dims {dims:?}"
                );
            }
            let d = dims.first().copied();
            if kind == ReduceKind::ArgMax {
                x.argmax(d, keepdim)
            } else {
                x.argmin(d, keepdim)
            }
        }
    }
}

/// `masked_fill` with a 0-dim fill tensor: `where(mask, fill, x)` in x's dtype.
fn masked_fill_tensor(x: &Tensor, mask: &Tensor, fill: &Tensor) -> Result<Tensor> {
    let dims = kiln_ir::shape::broadcast_shapes("masked_fill", x.dims(), mask.dims())?;
    if dims.as_slice() != x.dims() {
        bail!(
            "masked_fill",
            "mask of shape {} must broadcast to the input shape {}",
            kiln_ir::shape::fmt_dims(mask.dims()),
            kiln_ir::shape::fmt_dims(x.dims())
        );
    }
    Tensor::where_(mask, &fill.to_dtype(x.dtype())?, x)
}

/// The elementwise losses of `pair_loss`; smooth_l1 and huber with their
/// default beta / delta of 1 (other values trace as primitive ops).
fn pair_loss(
    name: &str,
    x: &Tensor,
    y: &Tensor,
    weight: Option<&Tensor>,
    pos_weight: Option<&Tensor>,
    r: Reduction,
) -> Result<Tensor> {
    match name {
        "mse" => F::mse_loss(x, y, r),
        "l1" => F::l1_loss(x, y, r),
        "smooth_l1" => F::smooth_l1_loss(x, y, r, 1.0),
        "huber" => F::huber_loss(x, y, r, 1.0),
        "bce" => F::binary_cross_entropy(x, y, weight, r),
        "bce_with_logits" => F::binary_cross_entropy_with_logits(x, y, weight, pos_weight, r),
        other => bail!("pair_loss", "unknown elementwise loss '{other}'"),
    }
}

#[cfg(test)]
#[path = "dispatch_tests.rs"]
mod tests;
