//! The reference interpreter's composite ops — softmax, log_softmax,
//! logsumexp, var, std, layer/group/batch norm (the losses and gather are in
//! `loss.rs`) — and the multi-result reductions they lower to (`lse_parts`,
//! `moments`).
//!
//! Composites are evaluated by their textbook formula in `f64` (max-shifted
//! exp-sums, two-pass mean and variance), not through kiln's decomposition
//! table, so a test comparing kiln with them checks the decomposition as well
//! as the kernels; each result rounds once to the node's dtype.
//!
//! Error bounds (see the module docs of `eval`): the inputs' bounds pushed
//! through the formula's first derivative (plus the second-order term where
//! that derivative is unbounded: a standard deviation at zero variance), and
//! the rounding of an implementation that evaluates the decomposition in the
//! node's dtype with one-pass reductions: a log-sum-exp of `n` values is off
//! by `(3n + 20 + 4|logsum|)` ulps of 1 (the shifted exps, the online
//! rescaling and the sum), Welford's variance by `(n + 2)` ulps of
//! `2 spread^2 + 2 |mean| spread` (spread = max |x - mean|: the error grows
//! with the mean/spread ratio), its mean by `(n + 2)` ulps of max |x|.
//! An element is unsure when any element its row reads is.
//!
//! Rows that are not all finite follow what kiln's one-pass kernels produce
//! (`codegen/src/online.rs`): a log-sum-exp row holding a NaN gives NaN
//! everywhere; one whose max is +inf has shift +inf, logsum NaN and lse +inf;
//! an all -inf (or empty) row keeps the lowest finite shift with logsum and
//! lse -inf. Softmax and log_softmax are NaN on rows whose max is not finite
//! (as PyTorch's). Moments and variances of rows with a NaN or an infinity
//! are the textbook ones (NaN variance, mean sum/n), of an empty row NaN.

use super::nd::groups;
use super::{mul0, unit_roundoff, Bounded, HostTensor};
use crate::interp::round_to;
use crate::op::{Meta, Op};
use crate::shape::Dims;
use crate::{bail, DType, Result};

/// Evaluates a composite (or an op only this module and `loss.rs` know).
pub(super) fn eval(op: &Op, x: &[&Bounded], meta: &Meta) -> Result<Bounded> {
    let opt = |k: usize, present: bool| if present { x.get(k).copied() } else { None };
    Ok(match op {
        Op::Softmax { dim } => softmax(x[0], *dim, false)?,
        Op::LogSoftmax { dim } => softmax(x[0], *dim, true)?,
        Op::LogSumExp { dims, keepdim } => logsumexp(x[0], dims, *keepdim)?,
        Op::Var {
            dims,
            correction,
            keepdim,
        } => var(x[0], dims, correction.0, *keepdim, false)?,
        Op::Std {
            dims,
            correction,
            keepdim,
        } => var(x[0], dims, correction.0, *keepdim, true)?,
        Op::LayerNorm {
            normalized_shape,
            eps,
            has_weight,
            has_bias,
        } => {
            let w = opt(1, *has_weight);
            let b = opt(1 + *has_weight as usize, *has_bias);
            layer_norm(x[0], normalized_shape.len(), w, b, eps.0)?
        }
        Op::GroupNorm {
            groups,
            eps,
            has_weight,
            has_bias,
        } => {
            let w = opt(1, *has_weight);
            let b = opt(1 + *has_weight as usize, *has_bias);
            group_norm(x[0], *groups, w, b, eps.0)?
        }
        Op::BatchNorm {
            training: false,
            eps,
            has_running_stats: true,
            has_weight,
            has_bias,
            ..
        } => {
            let w = opt(3, *has_weight);
            let b = opt(3 + *has_weight as usize, *has_bias);
            batch_norm_eval(x[0], x[1], x[2], w, b, eps.0)?
        }
        other => super::loss::eval(other, x, meta)?,
    })
}

/// Evaluates a multi-result op: its results in order.
pub(super) fn eval_multi(op: &Op, x: &[&Bounded]) -> Result<Vec<Bounded>> {
    match op {
        Op::LseParts { dims } => lse_parts(x[0], dims),
        Op::Moments { dims, eps } => moments(x[0], dims, eps.0),
        other => bail!(
            "eval",
            "`{}` (multi-output) is not supported by the reference interpreter",
            other.name()
        ),
    }
}

/// The elements of `x` reduced together over `dims` (every dim when empty,
/// and for a 0-dim `x`), one row per output element; the output dims.
fn rows(x: &Meta, dims: &[i64], keepdim: bool) -> Result<(Vec<Vec<usize>>, Dims)> {
    let dims = if x.dims.is_empty() { &[][..] } else { dims };
    let (g, out) = groups(x, dims, keepdim)?;
    let rows = g
        .into_iter()
        .map(|r| r.into_iter().map(|(i, _)| i).collect())
        .collect();
    Ok((rows, out))
}

/// A float output of `dims` (values, bounds and flags filled in later).
pub(super) fn new_out(dtype: DType, dims: &[usize]) -> Result<Bounded> {
    if !dtype.is_float() {
        bail!("eval", "expects a float tensor, got {dtype}");
    }
    let n: usize = dims.iter().product();
    Ok(Bounded {
        value: HostTensor::new(Meta::new(dtype, dims), vec![0.0; n])?,
        err: vec![0.0; n],
        unsure: vec![false; n],
    })
}

impl Bounded {
    /// Sets element `o` to `v` rounded to the dtype, with bound `e`.
    pub(super) fn set(&mut self, o: usize, v: f64, e: f64, unsure: bool) {
        self.value.data[o] = round_to(v, self.dtype());
        self.err[o] = e;
        self.unsure[o] = unsure;
    }
}

/// The lowest finite value of `dt`: kiln's log-sum-exp starting shift.
fn lowest(dt: DType) -> f64 {
    round_to(
        if dt == DType::F64 {
            f64::MIN
        } else {
            f32::MIN as f64
        },
        dt,
    )
}

/// The log-sum-exp of one row with what its bounds need.
pub(super) struct LseRow {
    pub shift: f64,
    pub logsum: f64,
    pub lse: f64,
    /// max of the elements' bounds
    pub emax: f64,
    /// sum of softmax weight times bound (`emax` when the row is not finite)
    pub prop: f64,
    /// rounding of `logsum`, in absolute terms
    pub round: f64,
    pub unsure: bool,
}

pub(super) fn lse_row(x: &Bounded, row: &[usize]) -> LseRow {
    let dt = x.dtype();
    let xs: Vec<f64> = row.iter().map(|&i| x.value.data[i]).collect();
    let es: Vec<f64> = row.iter().map(|&i| x.err[i]).collect();
    let m = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (shift, logsum, lse) = if xs.iter().any(|v| v.is_nan()) {
        (f64::NAN, f64::NAN, f64::NAN)
    } else if m == f64::INFINITY {
        (m, f64::NAN, m)
    } else if m == f64::NEG_INFINITY {
        (lowest(dt), m, m)
    } else {
        let l = xs.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        (m, l, m + l)
    };
    let emax = es.iter().copied().fold(0.0, f64::max);
    let prop = if logsum.is_finite() {
        xs.iter()
            .zip(&es)
            .map(|(v, e)| mul0((v - m - logsum).exp(), *e))
            .sum()
    } else {
        emax
    };
    let n = xs.len() as f64;
    LseRow {
        shift,
        logsum,
        lse,
        emax,
        prop,
        round: (3.0 * n + 20.0 + 4.0 * logsum.abs()) * unit_roundoff(dt),
        unsure: row.iter().any(|&i| x.unsure[i]),
    }
}

/// `lse_parts`: (shift, logsum) over `dims`, kept.
fn lse_parts(x: &Bounded, dims: &[i64]) -> Result<Vec<Bounded>> {
    let (rows, odims) = rows(x.meta(), dims, true)?;
    let mut shift = new_out(x.dtype(), &odims)?;
    let mut logsum = shift.clone();
    for (o, row) in rows.iter().enumerate() {
        let r = lse_row(x, row);
        shift.set(o, r.shift, r.emax, r.unsure);
        logsum.set(o, r.logsum, r.prop + r.emax + r.round, r.unsure);
    }
    Ok(vec![shift, logsum])
}

fn logsumexp(x: &Bounded, dims: &[i64], keepdim: bool) -> Result<Bounded> {
    let (rows, odims) = rows(x.meta(), dims, keepdim)?;
    let mut out = new_out(x.dtype(), &odims)?;
    let u = unit_roundoff(x.dtype());
    for (o, row) in rows.iter().enumerate() {
        let r = lse_row(x, row);
        let e = r.prop + r.round + u * (r.shift.abs() + r.lse.abs());
        out.set(o, r.lse, e, r.unsure);
    }
    Ok(out)
}

/// softmax (or log_softmax when `log`) along `dim`.
pub(super) fn softmax(x: &Bounded, dim: i64, log: bool) -> Result<Bounded> {
    let (rows, _) = rows(x.meta(), &[dim], true)?;
    let mut out = new_out(x.dtype(), &x.meta().dims)?;
    let u = unit_roundoff(x.dtype());
    for row in &rows {
        let r = lse_row(x, row);
        let finite = r.shift.is_finite() && r.logsum.is_finite();
        for &i in row {
            let z = if finite {
                (x.value.data[i] - r.shift) - r.logsum
            } else {
                f64::NAN
            };
            // (x - shift) - logsum, each rounded, and logsum's own error
            let ez = x.err[i] + r.prop + r.round + u * (2.0 * z.abs() + r.logsum.abs());
            let (v, e) = if log {
                (z, ez + u * z.abs())
            } else {
                (z.exp(), z.exp() * (ez + 20.0 * u))
            };
            out.set(i, v, e, r.unsure);
        }
    }
    Ok(out)
}

/// Mean, variance and their bounds of one row (see the module docs).
pub(super) struct MomentsRow {
    pub n: f64,
    pub mean: f64,
    /// sum of squared deviations
    pub ss: f64,
    pub mean_err: f64,
    /// first-order propagation into `ss`: sum 2 |x - mean| e
    pub ss_prop: f64,
    /// second-order term: sum e^2
    pub ss_prop2: f64,
    /// rounding of Welford's biased variance (absolute)
    pub var_round: f64,
    pub unsure: bool,
}

pub(super) fn moments_row(x: &Bounded, row: &[usize]) -> MomentsRow {
    let u = unit_roundoff(x.dtype());
    let xs: Vec<f64> = row.iter().map(|&i| x.value.data[i]).collect();
    let es: Vec<f64> = row.iter().map(|&i| x.err[i]).collect();
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let ss: f64 = xs.iter().map(|v| (v - mean) * (v - mean)).sum();
    let spread = xs.iter().map(|v| (v - mean).abs()).fold(0.0, f64::max);
    let amax = xs.iter().map(|v| v.abs()).fold(0.0, f64::max);
    MomentsRow {
        n,
        mean,
        ss,
        mean_err: es.iter().sum::<f64>() / n + (n + 2.0) * u * amax,
        ss_prop: xs
            .iter()
            .zip(&es)
            .map(|(v, e)| 2.0 * mul0((v - mean).abs(), *e))
            .sum(),
        ss_prop2: es.iter().map(|e| e * e).sum(),
        var_round: (n + 2.0) * u * (2.0 * spread * spread + 2.0 * mean.abs() * spread),
        unsure: row.iter().any(|&i| x.unsure[i]),
    }
}

impl MomentsRow {
    /// The biased variance and its bound.
    pub(super) fn var(&self) -> (f64, f64) {
        let e = (self.ss_prop + self.ss_prop2) / self.n + self.var_round;
        (self.ss / self.n, e)
    }
}

/// `moments`: (mean, biased var, rsqrt(var + eps)) over `dims`, kept.
fn moments(x: &Bounded, dims: &[i64], eps: f64) -> Result<Vec<Bounded>> {
    let (rows, odims) = rows(x.meta(), dims, true)?;
    let mut out = vec![new_out(x.dtype(), &odims)?; 3];
    let u = unit_roundoff(x.dtype());
    for (o, row) in rows.iter().enumerate() {
        let m = moments_row(x, row);
        let (v, ev) = m.var();
        let r = 1.0 / (v + eps).sqrt();
        let er = 0.5 * ev * r * r * r + 3.0 * u * r;
        out[0].set(o, m.mean, m.mean_err, m.unsure);
        out[1].set(o, v, ev + u * v, m.unsure);
        out[2].set(o, r, er, m.unsure);
    }
    Ok(out)
}

/// var (or std) with `correction`: sum of squared deviations / (n - correction).
fn var(x: &Bounded, dims: &[i64], correction: f64, keepdim: bool, std: bool) -> Result<Bounded> {
    let (rows, odims) = rows(x.meta(), dims, keepdim)?;
    let mut out = new_out(x.dtype(), &odims)?;
    let u = unit_roundoff(x.dtype());
    for (o, row) in rows.iter().enumerate() {
        let m = moments_row(x, row);
        let d = (m.n - correction).max(0.0);
        let v = m.ss / d;
        // Welford's biased variance, scaled by n / d
        let ev = (m.ss_prop + m.ss_prop2) / d + m.var_round * m.n / d + 2.0 * u * v;
        if std {
            let s = v.sqrt();
            let es = if s > 0.0 {
                (ev / (2.0 * s)).min(ev.sqrt())
            } else {
                ev.sqrt()
            };
            out.set(o, s, es + 2.0 * u * s, m.unsure);
        } else {
            out.set(o, v, ev, m.unsure);
        }
    }
    Ok(out)
}

/// `(x - mean) * rsqrt(var + eps)` for every element of `row`, written into
/// `out` with `affine(element index) = (w, e_w, b, e_b, unsure)`.
fn normalize_row(
    x: &Bounded,
    row: &[usize],
    eps: f64,
    out: &mut Bounded,
    affine: impl Fn(usize) -> Affine,
) {
    let u = unit_roundoff(x.dtype());
    let m = moments_row(x, row);
    let s2 = m.var().0 + eps;
    let s = s2.sqrt();
    let ebar = row.iter().map(|&i| x.err[i]).sum::<f64>() / m.n;
    for &i in row {
        let d = x.value.data[i] - m.mean;
        let yh = d / s;
        // first order through mean and var, plus rounding of x - mean,
        // Welford's mean and var, rsqrt and the product
        let prop = (x.err[i] + ebar) / s + yh.abs() * (m.ss_prop + m.ss_prop2) / m.n / (2.0 * s2);
        let round =
            (m.mean_err - ebar + u * d.abs()) / s + yh.abs() * (m.var_round / (2.0 * s2) + 4.0 * u);
        let a = affine(i);
        let (y, e) = a.apply(yh, prop + round, u);
        out.set(i, y, e, m.unsure || a.unsure);
    }
}

/// An optional elementwise `* w + b` after a normalisation.
#[derive(Default)]
struct Affine {
    w: Option<(f64, f64)>,
    b: Option<(f64, f64)>,
    unsure: bool,
}

impl Affine {
    fn of(w: Option<&Bounded>, b: Option<&Bounded>, k: usize) -> Affine {
        let get = |t: Option<&Bounded>| t.map(|t| (t.value.data[k], t.err[k]));
        let uns = |t: Option<&Bounded>| t.is_some_and(|t| t.unsure[k]);
        Affine {
            w: get(w),
            b: get(b),
            unsure: uns(w) || uns(b),
        }
    }
    fn apply(&self, y: f64, e: f64, u: f64) -> (f64, f64) {
        let (mut y, mut e) = (y, e);
        if let Some((w, ew)) = self.w {
            e = mul0(e, w.abs()) + mul0(y.abs(), ew) + u * (y * w).abs();
            y *= w;
        }
        if let Some((b, eb)) = self.b {
            y += b;
            e += eb + u * y.abs();
        }
        (y, e)
    }
}

/// `layer_norm` over the last `k` dims.
fn layer_norm(
    x: &Bounded,
    k: usize,
    w: Option<&Bounded>,
    b: Option<&Bounded>,
    eps: f64,
) -> Result<Bounded> {
    let d = &x.meta().dims;
    if k == 0 || k > d.len() {
        bail!("layer_norm", "normalizes {k} dims of {}", x.meta());
    }
    let dims: Vec<i64> = (d.len() - k..d.len()).map(|i| i as i64).collect();
    let inner: usize = d[d.len() - k..].iter().product();
    let (rows, _) = rows(x.meta(), &dims, true)?;
    let mut out = new_out(x.dtype(), d)?;
    for row in &rows {
        normalize_row(x, row, eps, &mut out, |i| Affine::of(w, b, i % inner));
    }
    Ok(out)
}

/// (N, C, spatial size) of an (N, C, *) input.
fn ncs(op: &str, x: &Meta) -> Result<(usize, usize, usize)> {
    if x.dims.len() < 2 {
        bail!(op, "expects (N, C, *), got {x}");
    }
    Ok((x.dims[0], x.dims[1], x.dims[2..].iter().product()))
}

fn group_norm(
    x: &Bounded,
    groups: usize,
    w: Option<&Bounded>,
    b: Option<&Bounded>,
    eps: f64,
) -> Result<Bounded> {
    let (n, c, s) = ncs("group_norm", x.meta())?;
    if groups == 0 || c % groups != 0 {
        bail!("group_norm", "{c} channels in {groups} groups");
    }
    let grouped = Meta::new(x.dtype(), &[n, groups, c / groups * s]);
    let (rows, _) = rows(&grouped, &[2], true)?;
    let mut out = new_out(x.dtype(), &x.meta().dims)?;
    for row in &rows {
        normalize_row(x, row, eps, &mut out, |i| Affine::of(w, b, i / s % c));
    }
    Ok(out)
}

/// Eval-mode batch_norm: `(x - running_mean) * rsqrt(running_var + eps)`, per channel.
fn batch_norm_eval(
    x: &Bounded,
    rm: &Bounded,
    rv: &Bounded,
    w: Option<&Bounded>,
    b: Option<&Bounded>,
    eps: f64,
) -> Result<Bounded> {
    let (_, c, s) = ncs("batch_norm", x.meta())?;
    let mut out = new_out(x.dtype(), &x.meta().dims)?;
    let u = unit_roundoff(x.dtype());
    for i in 0..x.value.numel() {
        let ch = i / s % c;
        let d = x.value.data[i] - rm.value.data[ch];
        let s2 = rv.value.data[ch] + eps;
        let sd = s2.sqrt();
        let yh = d / sd;
        let e = (x.err[i] + rm.err[ch] + u * d.abs()) / sd
            + yh.abs() * (rv.err[ch] / (2.0 * s2) + 5.0 * u);
        let a = Affine::of(w, b, ch);
        let (y, e) = a.apply(yh, e, u);
        let unsure = x.unsure[i] || rm.unsure[ch] || rv.unsure[ch] || a.unsure;
        out.set(i, y, e, unsure);
    }
    Ok(out)
}
