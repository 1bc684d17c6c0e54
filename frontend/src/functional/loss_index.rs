//! Losses whose formula needs more than the decomposition builder offers,
//! written with Tensor ops (so `compile` traces them as their primitives):
//! the class-index margin losses (`multi_margin_loss`,
//! `multilabel_margin_loss`, built on one-hot masks from `arange`) and
//! `gaussian_nll_loss` (whose variance clamp is not differentiated).

use super::op_scope;
use crate::compile::trace;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};
use kiln_passes::decompose_loss::Reduction;

fn reduce(loss: Tensor, r: Reduction) -> Result<Tensor> {
    match r {
        Reduction::None => Ok(loss),
        Reduction::Sum => loss.sum(None, false),
        Reduction::Mean => loss.mean(None, false),
    }
}

/// The values of an integer tensor, for argument checks only (never for
/// what is computed, so a compiled graph does not depend on them).
pub(super) fn host_ints(t: &Tensor) -> Result<Vec<i64>> {
    trace::untraced(|| t.detach().to_dtype(DType::I64)?.on_host()?.to_vec::<i64>())
}

/// Shape-derived int64 constants (indices, masks) made on the host and
/// placed on `like`'s device; made as int64 directly, since
/// `Tensor::arange` casts, which a tracer records, and a traced value
/// cannot move devices.
pub(super) fn ints_on(v: Vec<i64>, like: &Tensor) -> Result<Tensor> {
    let n = v.len();
    Tensor::from_vec(v, &[n])?.to_device(like.device())
}

/// `arange(n)` as [`ints_on`].
fn arange_like(n: usize, like: &Tensor) -> Result<Tensor> {
    ints_on((0..n as i64).collect(), like)
}

/// `(N, C)` input and `(N)` integer target of the class-index losses (a
/// `(C)` input takes a 0-dim or 1-element target), and whether the input
/// was unbatched.
fn batch_of(op: &str, x: &Tensor, y: &Tensor) -> Result<(Tensor, Tensor, bool)> {
    let unbatched = x.rank() == 1;
    let x2 = if unbatched {
        x.unsqueeze(0)?
    } else {
        x.clone()
    };
    if x2.rank() != 2 || x2.dims()[1] == 0 {
        bail!(
            op,
            "expected a non-empty 1-D or 2-D input, got {}",
            fmt_dims(x.dims())
        );
    }
    if y.dtype().is_float() || y.dtype() == DType::Bool {
        bail!(op, "target must hold class indices, got {}", y.dtype());
    }
    Ok((x2, y.to_dtype(DType::I64)?, unbatched))
}

/// `F.multi_margin_loss(input, target, p, margin, weight, reduction)`: per
/// sample `sum_{i != y} max(0, margin - x[y] + x[i])^p * weight[y] / C`.
///
/// ```
/// use kiln_frontend::functional::{self as F, Reduction};
/// use kiln_frontend::Tensor;
/// let x = Tensor::from_vec(vec![0.1f32, 0.2, 0.4, 0.8], &[1, 4]).unwrap();
/// let y = Tensor::from_vec(vec![3i64], &[1]).unwrap();
/// let l = F::multi_margin_loss(&x, &y, 1, 1.0, None, Reduction::Mean).unwrap();
/// // (0.3 + 0.4 + 0.6) / 4
/// assert!((l.item().unwrap() - 0.325).abs() < 1e-6);
/// ```
pub fn multi_margin_loss(
    x: &Tensor,
    y: &Tensor,
    p: i64,
    margin: f64,
    weight: Option<&Tensor>,
    r: Reduction,
) -> Result<Tensor> {
    const OP: &str = "multi_margin_loss";
    let _p = op_scope(OP, &[x, y]);
    if p != 1 && p != 2 {
        bail!(OP, "only p == 1 and p == 2 supported, got p = {p}");
    }
    let (x2, y, unbatched) = batch_of(OP, x, y)?;
    let (n, c) = (x2.dims()[0], x2.dims()[1]);
    if y.numel() != n || (!unbatched && y.rank() != 1) {
        bail!(
            OP,
            "inconsistent target size: got {} for input {}",
            fmt_dims(y.dims()),
            fmt_dims(x.dims())
        );
    }
    if let Some(w) = weight {
        if w.dims() != [c] {
            bail!(
                OP,
                "weight {} must have one entry per class ({c})",
                fmt_dims(w.dims())
            );
        }
    }
    if let Some(t) = host_ints(&y)?.into_iter().find(|&t| t < 0 || t >= c as i64) {
        bail!(
            OP,
            "target {t} out of range for {c} classes (input {})",
            fmt_dims(x.dims())
        );
    }
    let yi = y.reshape(&[n as i64, 1])?;
    let z = x2.sub(&x2.gather(1, &yi)?)?.add_scalar(margin)?.relu()?;
    let z = if p == 2 { z.mul(&z)? } else { z };
    let is_y = arange_like(c, &yi)?.unsqueeze(0)?.eq(&yi)?;
    let mut z = z.masked_fill(&is_y, 0.0)?;
    if let Some(w) = weight {
        // applied after the power, as PyTorch does
        z = z.mul(&w.gather(0, &yi.reshape(&[-1])?)?.unsqueeze(1)?)?;
    }
    let per = z.sum(Some(&[1]), false)?.div_scalar(c as f64)?;
    let per = if unbatched { per.reshape(&[])? } else { per };
    reduce(per, r)
}

/// `F.multilabel_margin_loss(input, target, reduction)`: `target` holds
/// class indices, the first -1 ending each row's list; per sample
/// `sum_{j listed} sum_{i not listed} max(0, 1 - (x[j] - x[i])) / C`.
///
/// ```
/// use kiln_frontend::functional::{self as F, Reduction};
/// use kiln_frontend::Tensor;
/// let x = Tensor::from_vec(vec![0.1f32, 0.2, 0.4, 0.8], &[1, 4]).unwrap();
/// let y = Tensor::from_vec(vec![3i64, 0, -1, 1], &[1, 4]).unwrap();
/// let l = F::multilabel_margin_loss(&x, &y, Reduction::Mean).unwrap();
/// // targets 3 and 0 against classes 1 and 2
/// let want = (0.4 + 0.6 + 1.1 + 1.3) / 4.0;
/// assert!((l.item().unwrap() - want).abs() < 1e-6);
/// ```
pub fn multilabel_margin_loss(x: &Tensor, y: &Tensor, r: Reduction) -> Result<Tensor> {
    const OP: &str = "multilabel_margin_loss";
    let _p = op_scope(OP, &[x, y]);
    let (x2, y, unbatched) = batch_of(OP, x, y)?;
    let c = x2.dims()[1];
    let y = if unbatched { y.unsqueeze(0)? } else { y };
    if y.dims() != x2.dims() {
        bail!(
            OP,
            "inconsistent target size: {} for input {}",
            fmt_dims(y.dims()),
            fmt_dims(x.dims())
        );
    }
    if let Some(t) = host_ints(&y)?
        .into_iter()
        .find(|&t| t < -1 || t >= c as i64)
    {
        bail!(
            OP,
            "target {t} out of range for {c} classes (input {})",
            fmt_dims(x.dims())
        );
    }
    // entry k is listed when no -1 comes at or before it: count the -1s
    // up to k with a lower-triangular mask
    let pos = arange_like(c, &y)?;
    let upto = pos
        .unsqueeze(1)?
        .ge(&pos.unsqueeze(0)?)?
        .to_dtype(x2.dtype())?;
    let ends = y.lt(&Tensor::scalar(0i64))?.to_dtype(x2.dtype())?;
    let seen = ends
        .unsqueeze(1)?
        .mul(&upto.unsqueeze(0)?)?
        .sum(Some(&[2]), false)?;
    let listed = seen.eq(&Tensor::scalar(0.0).to_dtype(x2.dtype())?)?;
    let ys = Tensor::where_(&listed, &y, &Tensor::scalar(0i64))?;
    // is_target[n, i]: class i appears among row n's listed entries
    let hit = ys.unsqueeze(2)?.eq(&pos.reshape(&[1, 1, c as i64])?)?;
    let hit = hit
        .logical_and(&listed.unsqueeze(2)?)?
        .to_dtype(x2.dtype())?;
    let is_target = hit
        .sum(Some(&[1]), false)?
        .gt(&Tensor::scalar(0.0).to_dtype(x2.dtype())?)?;
    let xj = x2.gather(1, &ys)?.unsqueeze(2)?;
    let term = x2.unsqueeze(1)?.sub(&xj)?.add_scalar(1.0)?.relu()?;
    let keep = listed
        .unsqueeze(2)?
        .logical_and(&is_target.logical_not()?.unsqueeze(1)?)?;
    let term = term.masked_fill(&keep.logical_not()?, 0.0)?;
    let per = term.sum(Some(&[1, 2]), false)?.div_scalar(c as f64)?;
    let per = if unbatched { per.reshape(&[])? } else { per };
    reduce(per, r)
}

/// `F.gaussian_nll_loss(input, target, var, full, eps, reduction)`:
/// `(log(var) + (x - t)^2 / var) / 2` (+ `log(2 pi) / 2` with `full`), var
/// clamped at `eps` without differentiating the clamp; `var` may lack the
/// last dim or have size 1 there (one variance per sample).
///
/// ```
/// use kiln_frontend::functional::{self as F, Reduction};
/// use kiln_frontend::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
/// let v = Tensor::from_vec(vec![1.0f32, 1.0], &[2]).unwrap();
/// let l = F::gaussian_nll_loss(&x, &x, &v, false, 1e-6, Reduction::Sum).unwrap();
/// assert_eq!(l.item().unwrap(), 0.0);
/// ```
pub fn gaussian_nll_loss(
    input: &Tensor,
    target: &Tensor,
    var: &Tensor,
    full: bool,
    eps: f64,
    r: Reduction,
) -> Result<Tensor> {
    const OP: &str = "gaussian_nll_loss";
    let _p = op_scope(OP, &[input, target, var]);
    let (xs, vs) = (input.dims(), var.dims());
    let lead = |d: &[usize]| d[..d.len().saturating_sub(1)].to_vec();
    let var = if vs == xs {
        var.clone()
    } else if !xs.is_empty() && vs == lead(xs).as_slice() {
        var.unsqueeze(-1)?
    } else if !xs.is_empty() && lead(vs) == lead(xs) && vs.last() == Some(&1) {
        var.clone()
    } else {
        bail!(
            OP,
            "var is of incorrect size: input {}, var {}",
            fmt_dims(xs),
            fmt_dims(vs)
        );
    };
    let negative = trace::untraced(|| var.detach().amin(None, false)?.item())?;
    if negative < 0.0 {
        bail!(OP, "var has negative entry/entries");
    }
    // the clamp's own gradient is not taken: var + (clamped - var).detach()
    let clamp = var.clamp_min(eps)?.sub(&var)?.detach();
    let var = var.add(&clamp)?;
    let d = input.sub(target)?;
    let loss = var.log()?.add(&d.mul(&d)?.div(&var)?)?.mul_scalar(0.5)?;
    let loss = if full {
        loss.add_scalar(0.5 * (2.0 * std::f64::consts::PI).ln())?
    } else {
        loss
    };
    reduce(loss, r)
}
