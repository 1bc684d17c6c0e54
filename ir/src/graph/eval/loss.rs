//! The reference interpreter's losses (cross_entropy and nll_loss with class
//! indices; mse, l1, smooth_l1 and huber) and `gather`, by their textbook
//! formulas in `f64` (see `composite.rs` for the conventions).
//!
//! Class losses: `loss_k = -w[t_k] logp[k, t_k]` at positions whose target
//! is not `ignore_index` (0 elsewhere); with label smoothing `eps`,
//! `(1 - eps) loss_k + eps / C * smooth_k` with `smooth_k = -sum_c w_c
//! logp[k, c]`; `mean` divides the sums by the sum of `w[t_k]` over the kept
//! positions (NaN when nothing is kept), as PyTorch does.

use super::composite::{new_out, softmax};
use super::nd::flat_of;
use super::{bcast_index, for_each_index, mul0, unit_roundoff, Bounded};
use crate::op::{Meta, Op, Reduction};
use crate::shape::{broadcast_shapes, norm_dim};
use crate::{bail, Result};

pub(super) fn eval(op: &Op, x: &[&Bounded], meta: &Meta) -> Result<Bounded> {
    Ok(match op {
        Op::CrossEntropy {
            reduction,
            ignore_index,
            label_smoothing,
            has_weight,
        } => {
            if x[1].dtype().is_float() {
                bail!(
                    "eval",
                    "cross_entropy with class probabilities is not supported"
                );
            }
            let logp = softmax(x[0], i64::from(x[0].meta().dims.len() >= 2), true)?;
            let w = if *has_weight { Some(x[2]) } else { None };
            let o = (*reduction, *ignore_index, label_smoothing.0);
            class_loss(&logp, x[1], w, o)?
        }
        Op::NllLoss {
            reduction,
            ignore_index,
            has_weight,
        } => {
            let w = if *has_weight { Some(x[2]) } else { None };
            class_loss(x[0], x[1], w, (*reduction, *ignore_index, 0.0))?
        }
        Op::PairLoss {
            name,
            reduction,
            has_weight: false,
            has_pos_weight: false,
        } => pair_loss(name, x[0], x[1], *reduction, meta)?,
        Op::Gather { dim } => gather(x[0], *dim, x[1])?,
        Op::IndexBounds { op, dim, size } => {
            if let Some(&t) = x[0]
                .value
                .data
                .iter()
                .find(|&&t| t < 0.0 || t >= *size as f64)
            {
                bail!(
                    *op,
                    "index {t} is out of bounds for dimension {dim} with size {size}"
                );
            }
            x[0].clone()
        }
        other => bail!(
            "eval",
            "`{}` is not supported by the reference interpreter",
            other.name()
        ),
    })
}

/// A running sum with its propagated bound and the magnitude it rounds at.
#[derive(Default, Clone, Copy)]
struct Acc {
    sum: f64,
    err: f64,
    abs: f64,
    terms: f64,
    unsure: bool,
}

impl Acc {
    fn add(&mut self, v: f64, e: f64, unsure: bool) {
        self.sum += v;
        self.err += e;
        self.abs += v.abs();
        self.terms += 1.0;
        self.unsure |= unsure;
    }
    /// The sum's bound, with its rounding in dtype unit roundoff `u`.
    fn bound(&self, u: f64) -> f64 {
        self.err + (self.terms + 2.0) * u * self.abs
    }
}

/// nll_loss on log-probabilities `logp` (N, C, d...) or (C), class indices
/// `target` (N, d...) or (); `o` = (reduction, ignore_index, label_smoothing).
fn class_loss(
    logp: &Bounded,
    target: &Bounded,
    w: Option<&Bounded>,
    o: (Reduction, i64, f64),
) -> Result<Bounded> {
    let (reduction, ignore, eps) = o;
    let d = &logp.meta().dims;
    let cd = usize::from(d.len() >= 2);
    let c = d[cd];
    let inner: usize = d[cd + 1..].iter().product();
    let u = unit_roundoff(logp.dtype());
    let at = |k: usize, class: usize| (k / inner * c + class) * inner + k % inner;
    let weight = |class: usize| match w {
        Some(w) => (w.value.data[class], w.err[class], w.unsure[class]),
        None => (1.0, 0.0, false),
    };
    let tdims = &target.meta().dims;
    let positions = target.value.numel();
    // per position: (nll, its bound, smooth, its bound, weight, its bound, unsure)
    let mut per = Vec::with_capacity(positions);
    for k in 0..positions {
        let t = target.value.data[k] as i64;
        let mut unsure = target.unsure[k];
        if t == ignore {
            per.push([0.0; 6].map(|v| (v, unsure)));
            continue;
        }
        if t < 0 || t >= c as i64 {
            bail!("nll_loss", "target {t} is out of range for {c} classes");
        }
        let (wt, ewt, uw) = weight(t as usize);
        let i = at(k, t as usize);
        let lp = logp.value.data[i];
        unsure |= uw || logp.unsure[i];
        let nll = -wt * lp;
        let enll = mul0(wt.abs(), logp.err[i]) + mul0(lp.abs(), ewt) + u * nll.abs();
        let mut s = Acc::default();
        if eps > 0.0 {
            for class in 0..c {
                let (wc, ewc, uwc) = weight(class);
                let j = at(k, class);
                let e = mul0(wc.abs(), logp.err[j]) + mul0(logp.value.data[j].abs(), ewc);
                s.add(-wc * logp.value.data[j], e, uwc || logp.unsure[j]);
            }
        }
        unsure |= s.unsure;
        per.push([nll, enll, s.sum, s.bound(u), wt, ewt].map(|v| (v, unsure)));
    }
    let mix = |nll: f64, s: f64| (1.0 - eps) * nll + eps / c as f64 * s;
    let mix_err = |en: f64, es: f64, nll: f64, s: f64| {
        (1.0 - eps) * en + eps / c as f64 * es + 3.0 * u * (nll.abs() + s.abs())
    };
    if reduction == Reduction::None {
        let mut out = new_out(logp.dtype(), tdims)?;
        for (k, p) in per.iter().enumerate() {
            let [nll, en, s, es, ..] = p.map(|(v, _)| v);
            out.set(k, mix(nll, s), mix_err(en, es, nll, s), p[0].1);
        }
        return Ok(out);
    }
    let (mut a, mut b, mut wsum) = (Acc::default(), Acc::default(), Acc::default());
    for p in &per {
        let [nll, en, s, es, wt, ewt] = p.map(|(v, _)| v);
        a.add(nll, en, p[0].1);
        b.add(s, es, false);
        wsum.add(wt, ewt, false);
    }
    let (ea, eb) = (a.bound(u), b.bound(u));
    let mut v = mix(a.sum, b.sum);
    let mut e = mix_err(ea, eb, a.sum, b.sum);
    if reduction == Reduction::Mean {
        v /= wsum.sum;
        e = e / wsum.sum + v.abs() * wsum.bound(u) / wsum.sum + 2.0 * u * v.abs();
    }
    let mut out = new_out(logp.dtype(), &[])?;
    out.set(0, v, e, a.unsure);
    Ok(out)
}

/// mse, l1, smooth_l1 (beta 1) and huber (delta 1) of `x - y`, broadcast.
fn pair_loss(name: &str, x: &Bounded, y: &Bounded, r: Reduction, meta: &Meta) -> Result<Bounded> {
    let dims = broadcast_shapes(name, &x.meta().dims, &y.meta().dims)?;
    let u = unit_roundoff(meta.dtype);
    let mut each = new_out(meta.dtype, &dims)?;
    let mut acc = Acc::default();
    let mut res = Ok(());
    for_each_index(&dims, |flat, idx| {
        let (i, j) = (
            bcast_index(idx, &x.meta().dims),
            bcast_index(idx, &y.meta().dims),
        );
        let d = x.value.data[i] - y.value.data[j];
        let z = d.abs();
        // value and |derivative| (smooth_l1 and huber agree for beta = delta = 1)
        let (l, slope) = match name {
            "mse" => (d * d, 2.0 * z),
            "l1" => (z, 1.0),
            "smooth_l1" | "huber" if z < 1.0 => (0.5 * d * d, z),
            "smooth_l1" | "huber" => (z - 0.5, 1.0),
            other => {
                res = Err(crate::Error::op(
                    "eval",
                    format!("the {other} loss is not supported by the reference interpreter"),
                ));
                (0.0, 0.0)
            }
        };
        let e = mul0(slope, x.err[i] + y.err[j] + u * z) + 3.0 * u * l;
        let unsure = x.unsure[i] || y.unsure[j];
        each.set(flat, l, e, unsure);
        acc.add(l, e, unsure);
    });
    res?;
    if r == Reduction::None {
        return Ok(each);
    }
    let mut out = new_out(meta.dtype, &[])?;
    let (mut v, mut e) = (acc.sum, acc.bound(u));
    if r == Reduction::Mean {
        v /= acc.terms;
        e = e / acc.terms + 2.0 * u * v.abs();
    }
    out.set(0, v, e, acc.unsure);
    Ok(out)
}

/// `gather(x, dim, index)`: out[i] = x[i with dim `dim` replaced by index[i]].
fn gather(x: &Bounded, dim: i64, index: &Bounded) -> Result<Bounded> {
    let (dx, di) = (&x.meta().dims, &index.meta().dims);
    let k = norm_dim("gather", dim, dx.len())?;
    if di.len() != dx.len() || (0..dx.len()).any(|j| j != k && di[j] > dx[j]) {
        bail!("gather", "index {} for input {}", index.meta(), x.meta());
    }
    let mut out = x.clone();
    out.value.meta.dims = di.clone();
    let n = index.value.numel();
    out.value.data = vec![0.0; n];
    out.err = vec![0.0; n];
    out.unsure = vec![false; n];
    let mut res = Ok(());
    for_each_index(di, |flat, idx| {
        let size = dx.get(k).copied().unwrap_or(1) as i64;
        let t = index.value.data[flat] as i64;
        // negative indices are out of bounds, as in PyTorch
        if t < 0 || t >= size {
            res = Err(crate::Error::op(
                "gather",
                format!(
                    "index {t} is out of bounds for dimension {k} with size {size} (input {})",
                    x.meta()
                ),
            ));
            return;
        }
        let mut src = idx.to_vec();
        if !src.is_empty() {
            src[k] = t as usize;
        }
        let s = flat_of(&src, dx);
        out.value.data[flat] = x.value.data[s];
        out.err[flat] = x.err[s];
        out.unsure[flat] = x.unsure[s] || index.unsure[flat];
    });
    res?;
    Ok(out)
}
