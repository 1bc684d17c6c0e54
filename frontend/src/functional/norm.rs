//! Normalisation: `layer_norm`, `group_norm`, `batch_norm`, from the
//! decomposition table, each traced as one node.

use super::{ins, op_scope};
use crate::amp::{self, Policy};
use crate::autograd::rules::builder::TensorBuilder;
use crate::autograd::rules::norm as rules;
use crate::compile::trace;
use crate::ops::composite::decomposed;
use crate::ops::fuse::{Fuser, Lazy};
use crate::Tensor;
use kiln_ir::op::Op;
use kiln_ir::{Float, Result};
use kiln_passes::decompose;

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
    let node = || Op::LayerNorm {
        normalized_shape: normalized_shape.to_vec(),
        eps: Float(eps),
        has_weight: weight.is_some(),
        has_bias: bias.is_some(),
    };
    let inputs = ins(&[Some(x), weight, bias]);
    trace::record(node, &inputs, || {
        let _p = op_scope("layer_norm", &[x]);
        kiln_ir::op::infer::require_float("layer_norm", &x.meta())?;
        decomposed!(&inputs, |f, cv| {
            let (w, b) = (weight.map(cv), bias.map(cv));
            decompose::layer_norm(f, &cv(x), normalized_shape, w.as_ref(), b.as_ref(), eps)
        })
    })
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
    let node = || Op::GroupNorm {
        groups,
        eps: Float(eps),
        has_weight: weight.is_some(),
        has_bias: bias.is_some(),
    };
    let inputs = ins(&[Some(x), weight, bias]);
    trace::record(node, &inputs, || {
        let _p = op_scope("group_norm", &[x]);
        kiln_ir::op::infer::require_float("group_norm", &x.meta())?;
        decomposed!(&inputs, |f, cv| {
            let (w, b) = (weight.map(cv), bias.map(cv));
            decompose::group_norm(f, &cv(x), groups, w.as_ref(), b.as_ref(), eps)
        })
    })
}

/// `F.batch_norm`: in training, `running_mean`/`running_var` are updated in
/// place (with the unbiased batch variance), as PyTorch does.
///
/// Traced as one `batch_norm` node over x, [running_mean, running_var] (when
/// both are given), [weight], [bias]. A training node with running stats
/// writes the updated stats into its operands 1 and 2, as this eager op does
/// (and as `dispatch::run_op` does when it runs the node).
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
    let stats = running_mean.zip(running_var);
    let node = || Op::BatchNorm {
        training,
        momentum: Float(momentum),
        eps: Float(eps),
        has_running_stats: stats.is_some(),
        has_weight: weight.is_some(),
        has_bias: bias.is_some(),
    };
    let inputs = ins(&[
        Some(x),
        stats.map(|s| s.0),
        stats.map(|s| s.1),
        weight,
        bias,
    ]);
    trace::record(node, &inputs, || {
        batch_norm_eager(
            x,
            running_mean,
            running_var,
            weight,
            bias,
            training,
            momentum,
            eps,
        )
    })
}

#[allow(clippy::too_many_arguments)]
fn batch_norm_eager(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    let _p = op_scope("batch_norm", &[x]);
    kiln_ir::op::infer::require_float("batch_norm", &x.meta())?;
    let grad = crate::autograd::needs_grad(&ins(&[Some(x), weight, bias]));
    // a traced gradient comes from the primitives: they record, not batch_norm
    let _inline = grad.then(trace::inline_decomposition);
    let (y, running) = if grad {
        // training: the forward as primitives without autograd, then one
        // node whose backward is the closed form over the batch stats (two
        // reductions); eval: autograd through the primitives
        let r = {
            let _ng = training.then(crate::autograd::no_grad);
            decompose::batch_norm(
                &mut TensorBuilder,
                x,
                running_mean,
                running_var,
                weight,
                bias,
                training,
                momentum,
                eps,
            )?
        };
        let y = match &r.batch {
            Some((mean, rstd)) => rules::batch_norm_train(x, weight, bias, mean, rstd, r.y)?,
            None => r.y,
        };
        (y, r.running.map(|(m, v)| (m.detach(), v.detach())))
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
        trace::record_mutation(rm, &m, || rm.copy_(&m))?;
        trace::record_mutation(rv, &v, || rv.copy_(&v))?;
    }
    Ok(y)
}

/// Optional tensor arguments as lazy values.
fn lazy(t: Option<&Tensor>) -> Option<Lazy> {
    t.map(Lazy::tensor)
}
