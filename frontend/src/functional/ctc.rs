//! `F.ctc_loss`: the connectionist temporal classification loss, as the
//! forward (alpha) recursion over the blank-extended label sequence in log
//! space, one step per time frame written with Tensor ops (so autograd
//! gives the backward and `compile` traces it; sizes depend on shapes
//! only, never on the lengths' values).
//!
//! Unreachable states hold a large finite negative log-probability instead
//! of -inf, so no `-inf - -inf` NaN reaches a gradient; a loss that stays
//! at that level is infeasible and reported as inf, as PyTorch does.

use super::loss_index::{host_ints, ints_on as ints};
use super::op_scope;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};
use kiln_passes::decompose_loss::Reduction;

/// The log-probability of an unreachable state (exp gives exactly 0).
const NEG: f64 = -1e30;

/// Options of `F.ctc_loss` (PyTorch's defaults: blank 0, mean, no zero_infinity).
#[derive(Debug, Clone, Copy, Default)]
pub struct CtcOpts {
    pub blank: i64,
    /// `Mean` divides each loss by its target length before averaging.
    pub reduction: Reduction,
    /// Infinite losses (infeasible alignments) and their gradients become 0.
    pub zero_infinity: bool,
}

/// `[f(0), f(1), ...]` over `s` extended states: a bool mask on `like`'s device.
fn state_mask(s: usize, like: &Tensor, f: impl Fn(i64) -> bool) -> Result<Tensor> {
    ints((0..s as i64).map(|i| i64::from(f(i))).collect(), like)?.eq(&Tensor::scalar(1i64))
}

/// `F.ctc_loss(log_probs, targets, input_lengths, target_lengths, ...)`:
/// log_probs `(T, N, C)` (or `(T, C)` unbatched), targets `(N, S)` padded or
/// 1-D concatenated, lengths `(N)`. Its gradient w.r.t. `log_probs` is
/// PyTorch's: `exp(log_probs) - posterior` over each sample's frames (the
/// gradient w.r.t. the logits when log_probs is their log_softmax).
///
/// ```
/// use kiln_frontend::functional::{self as F, CtcOpts};
/// use kiln_frontend::Tensor;
/// // one frame, classes {blank, a}: the only alignment of "a" emits a
/// let lp = Tensor::from_vec(vec![0.25f32.ln(), 0.75f32.ln()], &[1, 1, 2]).unwrap();
/// let tg = Tensor::from_vec(vec![1i64], &[1, 1]).unwrap();
/// let one = Tensor::from_vec(vec![1i64], &[1]).unwrap();
/// let o = CtcOpts { reduction: F::Reduction::Sum, ..Default::default() };
/// let l = F::ctc_loss(&lp, &tg, &one, &one, o).unwrap();
/// assert!((l.item().unwrap() + 0.75f64.ln()).abs() < 1e-6);
/// ```
pub fn ctc_loss(
    log_probs: &Tensor,
    targets: &Tensor,
    input_lengths: &Tensor,
    target_lengths: &Tensor,
    o: CtcOpts,
) -> Result<Tensor> {
    const OP: &str = "ctc_loss";
    let _p = op_scope(OP, &[log_probs, targets]);
    let batched = log_probs.rank() == 3;
    if !batched && log_probs.rank() != 2 || !log_probs.dtype().is_float() {
        bail!(
            OP,
            "log_probs must be a float (T, N, C) or (T, C) tensor, got {} {}",
            log_probs.dtype(),
            fmt_dims(log_probs.dims())
        );
    }
    let lp = match log_probs.dtype() {
        DType::F16 | DType::BF16 => log_probs.to_dtype(DType::F32)?,
        _ => log_probs.clone(),
    };
    let lp = if batched { lp } else { lp.unsqueeze(1)? };
    let targets = if batched || targets.rank() != 1 {
        targets.clone()
    } else {
        targets.unsqueeze(0)?
    };
    let il = input_lengths.to_dtype(DType::I64)?.reshape(&[-1])?;
    let tl = target_lengths.to_dtype(DType::I64)?.reshape(&[-1])?;
    let labels = labels(&lp, &targets, &il, &tl, o.blank)?;
    let nll = alpha_recursion(&lp, &labels, &il, &tl, o.blank)?;
    // PyTorch's backward is exp(log_probs) - posterior: add a term worth 0
    // whose gradient is exp(log_probs) over each sample's frames
    let nll = if lp.requires_grad() {
        let frames = frame_mask(lp.dims()[0], &il)?;
        let e = lp.exp()?;
        let zero = e
            .sub(&e.detach())?
            .masked_fill(&frames.logical_not()?, 0.0)?;
        nll.add(&zero.sum(Some(&[0, 2]), false)?)?
    } else {
        nll
    };
    let nll = if o.zero_infinity {
        nll.masked_fill(&nll.detach().isinf()?, 0.0)?
    } else {
        nll
    };
    let nll = if batched { nll } else { nll.reshape(&[])? };
    match o.reduction {
        Reduction::None => Ok(nll),
        Reduction::Sum => nll.sum(None, false),
        Reduction::Mean => {
            let shape: Vec<i64> = nll.dims().iter().map(|&d| d as i64).collect();
            let per = tl.clamp_min(1.0)?.to_dtype(nll.dtype())?.reshape(&shape)?;
            nll.div(&per)?.mean(None, false)
        }
    }
}

/// `(T, N, 1)`: frame t belongs to sample n (t < input_lengths[n]).
fn frame_mask(t: usize, il: &Tensor) -> Result<Tensor> {
    let ts = ints((0..t as i64).collect(), il)?.unsqueeze(1)?;
    ts.lt(&il.unsqueeze(0)?)?.unsqueeze(2)
}

/// Checks the lengths against the shapes and gives each sample's labels as
/// `(N, L + 1)`: the padded targets, or the concatenated ones cut at
/// offsets (L = their total), plus one blank column so every gather has a
/// column to read; entries past a sample's length are never used.
fn labels(lp: &Tensor, targets: &Tensor, il: &Tensor, tl: &Tensor, blank: i64) -> Result<Tensor> {
    const OP: &str = "ctc_loss";
    let (t_max, n, c) = (lp.dims()[0], lp.dims()[1], lp.dims()[2]);
    if blank < 0 || blank >= c as i64 {
        bail!(OP, "blank {blank} must be in label range [0, {c})");
    }
    if il.numel() != n || tl.numel() != n {
        bail!(
            OP,
            "expected {n} input and target lengths, got {} and {}",
            il.numel(),
            tl.numel()
        );
    }
    if targets.dtype().is_float() || targets.rank() > 2 {
        bail!(
            OP,
            "targets must be integer (N, S) or 1-D, got {} {}",
            targets.dtype(),
            fmt_dims(targets.dims())
        );
    }
    let (ils, tls) = (host_ints(il)?, host_ints(tl)?);
    if let Some(&l) = ils.iter().find(|&&l| l < 0 || l as usize > t_max) {
        bail!(
            OP,
            "input length {l} is outside [0, {t_max}] (log_probs {})",
            fmt_dims(lp.dims())
        );
    }
    let targets = targets.to_dtype(DType::I64)?;
    let padded = targets.rank() == 2;
    let width = if padded {
        targets.dims()[1]
    } else {
        targets.numel()
    };
    let total: i64 = tls.iter().sum();
    if tls.iter().any(|&l| l < 0 || l as usize > width) || !padded && total as usize > width {
        bail!(
            OP,
            "target lengths {tls:?} do not fit targets {}",
            fmt_dims(targets.dims())
        );
    }
    let labels = if padded {
        if targets.dims()[0] != n {
            bail!(
                OP,
                "targets {} must have {n} rows",
                fmt_dims(targets.dims())
            );
        }
        targets
    } else {
        // offsets: the exclusive running sum of the target lengths
        let ids = ints((0..n as i64).collect(), tl)?;
        let before = ids
            .unsqueeze(1)?
            .gt(&ids.unsqueeze(0)?)?
            .to_dtype(DType::I64)?;
        let offs = before.mul(&tl.unsqueeze(0)?)?.sum(Some(&[1]), false)?;
        let k = ints((0..width as i64).collect(), tl)?.unsqueeze(0)?;
        let idx = offs
            .unsqueeze(1)?
            .add(&k)?
            .clamp(None, Some(width.max(1) as f64 - 1.0))?;
        let flat = if width == 0 {
            targets
        } else {
            targets.index_select(0, &idx.reshape(&[-1])?)?
        };
        flat.reshape(&[n as i64, width as i64])?
    };
    let pad = Tensor::full(&[n, 1], blank as f64, DType::I64).to_device(labels.device())?;
    Tensor::cat(&[&labels, &pad], 1)
}

/// The negative log-likelihood `(N)` of each sample's labels: the alpha
/// recursion over the extended sequence `blank, l1, blank, l2, ..., blank`.
fn alpha_recursion(
    lp: &Tensor,
    labels: &Tensor,
    il: &Tensor,
    tl: &Tensor,
    blank: i64,
) -> Result<Tensor> {
    let (t_max, n) = (lp.dims()[0], lp.dims()[1]);
    let s = 2 * (labels.dims()[1] - 1) + 1;
    let dt = lp.dtype();
    // label position k of extended state s (odd s), and the state masks
    let kidx = ints((0..s as i64).map(|s| (s - 1).max(0) / 2).collect(), lp)?;
    let odd = state_mask(s, lp, |s| s % 2 == 1)?;
    let lab = labels.gather(1, &kidx.unsqueeze(0)?.expand(&[n as i64, s as i64])?)?;
    let used = kidx
        .unsqueeze(0)?
        .lt(&tl.unsqueeze(1)?)?
        .logical_and(&odd.unsqueeze(0)?)?;
    let ext = Tensor::where_(&used, &lab, &Tensor::scalar(blank))?;
    let emit = lp.gather(
        2,
        &ext.unsqueeze(0)?
            .expand(&[t_max as i64, n as i64, s as i64])?,
    )?;
    // a label may skip the blank before it unless it repeats the label two back
    let back2 = ints((0..s as i64).map(|s| (s - 2).max(0)).collect(), lp)?;
    let prev2 = ext.gather(1, &back2.unsqueeze(0)?.expand(&[n as i64, s as i64])?)?;
    let from2 = state_mask(s, lp, |s| s >= 2)?;
    let skip = ext
        .ne(&prev2)?
        .logical_and(&odd.logical_and(&from2)?.unsqueeze(0)?)?;
    let neg = |w: usize| Tensor::full(&[n, w], NEG, dt).to_device(lp.device());
    let shift = |a: &Tensor, by: usize| -> Result<Tensor> {
        if by >= s {
            return neg(s);
        }
        Tensor::cat(&[&neg(by)?, &a.narrow(1, 0, s - by)?], 1)
    };
    let first2 = state_mask(s, lp, |s| s < 2)?;
    let mut alpha = Tensor::where_(&first2.unsqueeze(0)?, &emit.select(0, 0)?, &neg(1)?)?;
    for t in 1..t_max {
        let a2 = Tensor::where_(&skip, &shift(&alpha, 2)?, &neg(1)?)?;
        let paths = Tensor::stack(&[&alpha, &shift(&alpha, 1)?, &a2], 0)?;
        let next = paths
            .logsumexp(&[0], false)?
            .add(&emit.select(0, t as i64)?)?;
        let live = il.gt(&Tensor::scalar(t as i64))?.unsqueeze(1)?;
        alpha = Tensor::where_(&live, &next, &alpha)?;
    }
    // end in the last label or the blank after it
    let last = tl.mul_scalar(2i64)?.unsqueeze(1)?;
    let end_blank = alpha.gather(1, &last)?;
    let end_label = alpha.gather(1, &last.sub_scalar(1i64)?.clamp_min(0.0)?)?;
    let has_label = tl.gt(&Tensor::scalar(0i64))?.unsqueeze(1)?;
    let end_label = Tensor::where_(&has_label, &end_label, &neg(1)?)?;
    let ll = Tensor::stack(&[&end_blank, &end_label], 0)?
        .logsumexp(&[0], false)?
        .reshape(&[n as i64])?;
    let infeasible = ll.detach().lt(&Tensor::scalar(NEG / 2.0).to_dtype(dt)?)?;
    ll.neg()?.masked_fill(&infeasible, f64::INFINITY)
}
