//! Losses, from the decomposition table, each traced as one node: class
//! losses as `cross_entropy` / `nll_loss`, the elementwise ones as `pair_loss`.

use super::{ins, op_scope};
use crate::amp::{self, Policy};
use crate::autograd::rules::builder::TensorBuilder;
use crate::compile::trace;
use crate::ops::composite::decomposed;
use crate::Tensor;
use kiln_ir::op::Op;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{Float, Result};
use kiln_passes::decompose_loss::{self as loss, ClassLossOpts, Reduction};

/// The `pair_loss` node of the elementwise loss `name`.
fn pair(name: &'static str, reduction: Reduction, weight: bool, pos_weight: bool) -> Op {
    Op::PairLoss {
        name,
        reduction,
        has_weight: weight,
        has_pos_weight: pos_weight,
    }
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
    let node = || Op::CrossEntropy {
        reduction: o.reduction,
        ignore_index: o.ignore_index,
        label_smoothing: Float(o.label_smoothing),
        has_weight: weight.is_some(),
    };
    let inputs = ins(&[Some(x), Some(target), weight]);
    trace::record(node, &inputs, || {
        let _p = op_scope("cross_entropy", &[x, target]);
        kiln_ir::op::infer::require_float("cross_entropy", &x.meta())?;
        check_class_targets("cross_entropy", x, target, o.ignore_index)?;
        // the class-index path checks shapes inside nll_loss: name the op called
        let r: Result<Tensor> = (|| {
            decomposed!(&inputs, |f, cv| {
                let w = weight.map(cv);
                loss::cross_entropy(f, &cv(x), &cv(target), w.as_ref(), o)
            })
        })();
        r.map_err(|e| match e {
            kiln_ir::Error::Op { op, msg } if op == "nll_loss" => {
                kiln_ir::Error::op("cross_entropy", msg)
            }
            e => e,
        })
    })
}

/// PyTorch's check of class-index targets: every target other than
/// `ignore_index` lies in `0..C` (a negative one is out of bounds, never a
/// class counted from the end), with PyTorch's message "Target -1 is out of
/// bounds." under the user-visible op's name, plus the shapes and position.
/// Float (probability) targets and shapes the loss rejects anyway are left
/// to the loss itself.
fn check_class_targets(op: &str, x: &Tensor, target: &Tensor, ignore_index: i64) -> Result<()> {
    if target.dtype().is_float() || x.rank() == 0 || target.numel() == 0 {
        return Ok(());
    }
    let class_dim = usize::from(x.rank() >= 2);
    let c = x.dims()[class_dim] as i64;
    let ts = trace::untraced(|| {
        target
            .detach()
            .to_dtype(kiln_ir::DType::I64)?
            .on_host()?
            .to_vec::<i64>()
    })?;
    if let Some((pos, t)) = ts
        .iter()
        .copied()
        .enumerate()
        .find(|&(_, t)| t != ignore_index && (t < 0 || t >= c))
    {
        return Err(kiln_ir::Error::op(
            op,
            format!(
                "Target {t} is out of bounds. (input {} has {c} classes; target {} at flat position {pos}; ignore_index {ignore_index})",
                fmt_dims(x.dims()),
                fmt_dims(target.dims())
            ),
        ));
    }
    Ok(())
}

/// `F.nll_loss` on log-probabilities (`o.label_smoothing` is not used).
pub fn nll_loss(
    logp: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    o: ClassLossOpts,
) -> Result<Tensor> {
    if let Some((lp, t, w)) = amp::cast_for(Policy::F32, (logp, target, weight))? {
        return nll_loss(&lp, &t, w.as_ref(), o);
    }
    let node = || Op::NllLoss {
        reduction: o.reduction,
        ignore_index: o.ignore_index,
        has_weight: weight.is_some(),
    };
    let inputs = ins(&[Some(logp), Some(target), weight]);
    trace::record(node, &inputs, || {
        let _p = op_scope("nll_loss", &[logp, target]);
        check_class_targets("nll_loss", logp, target, o.ignore_index)?;
        decomposed!(&inputs, |f, cv| {
            let w = weight.map(cv);
            loss::nll_loss(f, &cv(logp), &cv(target), w.as_ref(), o)
        })
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
    trace::record(
        || pair("mse", r, false, false),
        &[x, y],
        || decomposed!(&[x, y], |f, cv| loss::mse_loss(f, &cv(x), &cv(y), r)),
    )
}

/// `F.l1_loss` (broadcasts like [`mse_loss`]).
#[track_caller]
pub fn l1_loss(x: &Tensor, y: &Tensor, r: Reduction) -> Result<Tensor> {
    let _p = op_scope("l1_loss", &[x, y]);
    target_size_warning(x, y);
    let c = amp::cast_for(Policy::F32, (x, y))?;
    let (x, y) = c.as_ref().map_or((x, y), |(x, y)| (x, y));
    trace::record(
        || pair("l1", r, false, false),
        &[x, y],
        || decomposed!(&[x, y], |f, cv| loss::l1_loss(f, &cv(x), &cv(y), r)),
    )
}

/// `F.smooth_l1_loss` (broadcasts like [`mse_loss`]). Traced as one
/// `smooth_l1_loss` node for the default beta = 1; for another beta (which
/// the node does not carry) as the primitive ops of its decomposition.
#[track_caller]
pub fn smooth_l1_loss(x: &Tensor, y: &Tensor, r: Reduction, beta: f64) -> Result<Tensor> {
    let _p = op_scope("smooth_l1_loss", &[x, y]);
    target_size_warning(x, y);
    let c = amp::cast_for(Policy::F32, (x, y))?;
    let (x, y) = c.as_ref().map_or((x, y), |(x, y)| (x, y));
    if beta != 1.0 && trace::is_recording() {
        return loss::smooth_l1_loss(&mut TensorBuilder, x, y, r, beta);
    }
    trace::record(
        || pair("smooth_l1", r, false, false),
        &[x, y],
        || {
            decomposed!(&[x, y], |f, cv| loss::smooth_l1_loss(
                f,
                &cv(x),
                &cv(y),
                r,
                beta
            ))
        },
    )
}

/// `F.huber_loss` (broadcasts like [`mse_loss`]). Traced as one `huber_loss`
/// node for the default delta = 1, else as its decomposition (as
/// [`smooth_l1_loss`]).
#[track_caller]
pub fn huber_loss(x: &Tensor, y: &Tensor, r: Reduction, delta: f64) -> Result<Tensor> {
    let _p = op_scope("huber_loss", &[x, y]);
    target_size_warning(x, y);
    let c = amp::cast_for(Policy::F32, (x, y))?;
    let (x, y) = c.as_ref().map_or((x, y), |(x, y)| (x, y));
    if delta != 1.0 && trace::is_recording() {
        return loss::huber_loss(&mut TensorBuilder, x, y, r, delta);
    }
    trace::record(
        || pair("huber", r, false, false),
        &[x, y],
        || {
            decomposed!(&[x, y], |f, cv| loss::huber_loss(
                f,
                &cv(x),
                &cv(y),
                r,
                delta
            ))
        },
    )
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
    let node = || pair("bce_with_logits", r, weight.is_some(), pos_weight.is_some());
    let inputs = ins(&[Some(x), Some(y), weight, pos_weight]);
    trace::record(node, &inputs, || {
        let _p = op_scope("binary_cross_entropy_with_logits", &[x, y]);
        decomposed!(&inputs, |f, cv| {
            let (w, pw) = (weight.map(cv), pos_weight.map(cv));
            loss::bce_with_logits(f, &cv(x), &cv(y), w.as_ref(), pw.as_ref(), r)
        })
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
    let inputs = ins(&[Some(p), Some(y), weight]);
    trace::record(
        || pair("bce", r, weight.is_some(), false),
        &inputs,
        || {
            let _p = op_scope("binary_cross_entropy", &[p, y]);
            if crate::autograd::needs_grad(&[p]) {
                return bce_input_grad(p, y, weight, r);
            }
            decomposed!(&inputs, |f, cv| {
                let w = weight.map(cv);
                loss::binary_cross_entropy(f, &cv(p), &cv(y), w.as_ref(), r)
            })
        },
    )
}

/// `binary_cross_entropy` whose gradient w.r.t. `p` is PyTorch's closed form
/// `w (p - y) / max(p (1 - p), 1e-12)`, finite at probabilities of exactly
/// 0 or 1 where the clamped logs' own derivative is not: the value with `p`
/// detached (target and weight still differentiated), plus a term worth 0
/// whose gradient is that form.
fn bce_input_grad(p: &Tensor, y: &Tensor, weight: Option<&Tensor>, r: Reduction) -> Result<Tensor> {
    let _inline = trace::inline_decomposition();
    let pd = p.detach();
    let value = loss::binary_cross_entropy(&mut TensorBuilder, &pd, y, weight, r)?;
    let spread = pd.mul(&pd.neg()?.add_scalar(1.0)?)?.clamp_min(1e-12)?;
    let mut coef = pd.sub(&y.detach())?.div(&spread)?;
    if let Some(w) = weight {
        coef = coef.mul(&w.detach())?;
    }
    let lin = p.mul(&coef)?;
    let zero = lin.sub(&lin.detach())?;
    let zero = match r {
        Reduction::None => zero,
        Reduction::Sum => zero.sum(None, false)?,
        Reduction::Mean => zero.mean(None, false)?,
    };
    value.add(&zero)
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
