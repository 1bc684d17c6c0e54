//! Composite ops as compositions of primitives — the one table that the eager
//! path (and later the tracer) call, so a composite means the same everywhere.
//!
//! Each function is written against [`Builder`]: the eager frontend implements
//! it by running kernels, a tracer by recording graph nodes. Formulations are
//! the numerically stable ones PyTorch uses (max-shifted softmax and
//! log-sum-exp, biased variance to normalise, unbiased for running_var), in
//! one pass over the data where a one-pass reduction exists: softmax is
//! exp(x - lse) with an online log-sum-exp, the normalisations take mean and
//! rstd from one Welford pass.

use kiln_ir::shape::{fmt_dims, Dims};
use kiln_ir::{bail, BinaryOp, DType, ReduceKind, Result, UnaryOp};

/// The primitives composites are built from.
pub trait Builder {
    type T: Clone;
    fn dims(&self, x: &Self::T) -> Dims;
    fn dtype(&self, x: &Self::T) -> DType;
    fn unary(&mut self, op: UnaryOp, x: &Self::T) -> Result<Self::T>;
    fn binary(&mut self, op: BinaryOp, a: &Self::T, b: &Self::T) -> Result<Self::T>;
    /// `a op s` for a Python float `s`.
    fn scalar(&mut self, op: BinaryOp, a: &Self::T, s: f64) -> Result<Self::T>;
    /// `cond ? a : b`.
    fn select(&mut self, cond: &Self::T, a: &Self::T, b: &Self::T) -> Result<Self::T>;
    /// `cond ? a : s`.
    fn select_scalar(&mut self, cond: &Self::T, a: &Self::T, s: f64) -> Result<Self::T>;
    fn reduce(
        &mut self,
        kind: ReduceKind,
        x: &Self::T,
        dims: &[i64],
        keepdim: bool,
    ) -> Result<Self::T>;
    fn mean(&mut self, x: &Self::T, dims: &[i64], keepdim: bool) -> Result<Self::T>;
    fn reshape(&mut self, x: &Self::T, shape: &[i64]) -> Result<Self::T>;
    fn cast(&mut self, x: &Self::T, dt: DType) -> Result<Self::T>;
    /// `gather(x, dim, index)`.
    fn gather(&mut self, x: &Self::T, dim: i64, index: &Self::T) -> Result<Self::T>;
    /// The log-sum-exp of `x` over `dims` (kept, size 1) as an unevaluated
    /// sum `(shift, logsum)`: `x - lse` is `(x - shift) - logsum`, so softmax
    /// never rounds lse to the dtype at the logits' magnitude (1e4 logits
    /// would lose 3 digits). Rows whose max is ±inf or NaN give NaN softmax
    /// and log_softmax, as PyTorch's do. The default is the two-pass
    /// max-shifted sum; a builder may compute both in one pass
    /// ([`ReduceKind::LogSumExp`]'s parts).
    fn lse_parts(&mut self, x: &Self::T, dims: &[i64]) -> Result<(Self::T, Self::T)> {
        let m = self.reduce(ReduceKind::Max, x, dims, true)?;
        let shifted = self.binary(BinaryOp::Sub, x, &m)?;
        let e = self.unary(UnaryOp::Exp, &shifted)?;
        let s = self.reduce(ReduceKind::Sum, &e, dims, true)?;
        Ok((m, self.unary(UnaryOp::Log, &s)?))
    }
    /// Mean, biased variance and `rsqrt(var + eps)` of `x` over `dims`
    /// (kept). The default is two passes (the mean, then the mean of squared
    /// deviations); a builder may compute them in one ([`ReduceKind::Welford`]).
    fn moments(&mut self, x: &Self::T, dims: &[i64], eps: f64) -> Result<Moments<Self::T>> {
        let mean = self.mean(x, dims, true)?;
        let d = self.binary(BinaryOp::Sub, x, &mean)?;
        let sq = self.binary(BinaryOp::Mul, &d, &d)?;
        let var = self.mean(&sq, dims, true)?;
        let ve = self.scalar(BinaryOp::Add, &var, eps)?;
        let rstd = self.unary(UnaryOp::Rsqrt, &ve)?;
        Ok(Moments { mean, var, rstd })
    }
}

/// What [`Builder::moments`] gives (each with the reduced dims kept).
pub struct Moments<T> {
    pub mean: T,
    /// The biased variance.
    pub var: T,
    /// `1 / sqrt(var + eps)`.
    pub rstd: T,
}

fn ishape(d: &[usize]) -> Vec<i64> {
    d.iter().map(|&x| x as i64).collect()
}

fn all_dims(rank: usize) -> Vec<i64> {
    (0..rank as i64).collect()
}

/// softmax(x) = exp(x - lse(x)) along `dim`, with lse as [`Builder::lse_parts`].
pub fn softmax<B: Builder>(b: &mut B, x: &B::T, dim: i64) -> Result<B::T> {
    // checked here so the error names softmax, not the internal lse
    kiln_ir::shape::norm_dim("softmax", dim, b.dims(x).len())?;
    let (c, l) = b.lse_parts(x, &[dim])?;
    let shifted = b.binary(BinaryOp::Sub, x, &c)?;
    let z = b.binary(BinaryOp::Sub, &shifted, &l)?;
    b.unary(UnaryOp::Exp, &z)
}

/// log_softmax(x) = x - lse(x) = (x - shift) - logsum along `dim`.
pub fn log_softmax<B: Builder>(b: &mut B, x: &B::T, dim: i64) -> Result<B::T> {
    kiln_ir::shape::norm_dim("log_softmax", dim, b.dims(x).len())?;
    let (c, l) = b.lse_parts(x, &[dim])?;
    let shifted = b.binary(BinaryOp::Sub, x, &c)?;
    b.binary(BinaryOp::Sub, &shifted, &l)
}

/// logsumexp: one [`ReduceKind::LogSumExp`] reduction (all -inf rows give
/// -inf, +inf gives +inf, NaN propagates).
pub fn logsumexp<B: Builder>(b: &mut B, x: &B::T, dims: &[i64], keepdim: bool) -> Result<B::T> {
    b.reduce(ReduceKind::LogSumExp, x, dims, keepdim)
}

/// var(x) = sum((x - mean)^2) / (n - correction); an empty `dims` means all dims.
pub fn var<B: Builder>(
    b: &mut B,
    x: &B::T,
    dims: &[i64],
    correction: f64,
    keepdim: bool,
) -> Result<B::T> {
    let shape = b.dims(x);
    let dims: Vec<i64> = if dims.is_empty() {
        all_dims(shape.len())
    } else {
        dims.to_vec()
    };
    let n: usize = dims
        .iter()
        .map(|&d| {
            shape[if d < 0 {
                (d + shape.len() as i64) as usize
            } else {
                d as usize
            }]
        })
        .product::<usize>()
        .max(usize::from(shape.is_empty()));
    // one Welford pass gives the biased variance sum / n; rescale to
    // sum / (n - correction), which is inf/NaN when n - correction <= 0, as in PyTorch
    let v = b.reduce(ReduceKind::Welford, x, &dims, keepdim)?;
    b.scalar(
        BinaryOp::Mul,
        &v,
        n as f64 / (n as f64 - correction).max(0.0),
    )
}

pub fn std<B: Builder>(
    b: &mut B,
    x: &B::T,
    dims: &[i64],
    correction: f64,
    keepdim: bool,
) -> Result<B::T> {
    let v = var(b, x, dims, correction, keepdim)?;
    b.unary(UnaryOp::Sqrt, &v)
}

/// Normalises over `dims` with the biased variance: (x - mean) * rsqrt(var + eps).
fn normalize<B: Builder>(
    b: &mut B,
    x: &B::T,
    dims: &[i64],
    eps: f64,
) -> Result<(B::T, Moments<B::T>)> {
    let m = b.moments(x, dims, eps)?;
    let d = b.binary(BinaryOp::Sub, x, &m.mean)?;
    Ok((b.binary(BinaryOp::Mul, &d, &m.rstd)?, m))
}

/// `F.layer_norm(x, normalized_shape, weight, bias, eps)`.
pub fn layer_norm<B: Builder>(
    b: &mut B,
    x: &B::T,
    normalized_shape: &[usize],
    weight: Option<&B::T>,
    bias: Option<&B::T>,
    eps: f64,
) -> Result<B::T> {
    let shape = b.dims(x);
    let k = normalized_shape.len();
    if k == 0 || k > shape.len() || shape[shape.len() - k..] != *normalized_shape {
        bail!(
            "layer_norm",
            "normalized_shape {} does not match the trailing dims of input {}",
            fmt_dims(normalized_shape),
            fmt_dims(&shape)
        );
    }
    for (name, p) in [("weight", weight), ("bias", bias)] {
        if let Some(p) = p {
            if b.dims(p).as_slice() != normalized_shape {
                bail!(
                    "layer_norm",
                    "{name} has shape {} but normalized_shape is {}",
                    fmt_dims(&b.dims(p)),
                    fmt_dims(normalized_shape)
                );
            }
        }
    }
    let dims: Vec<i64> = ((shape.len() - k) as i64..shape.len() as i64).collect();
    let (mut y, _) = normalize(b, x, &dims, eps)?;
    if let Some(w) = weight {
        y = b.binary(BinaryOp::Mul, &y, w)?;
    }
    if let Some(bi) = bias {
        y = b.binary(BinaryOp::Add, &y, bi)?;
    }
    Ok(y)
}

/// Shape `[C, 1, 1, ...]` so a per-channel vector broadcasts against (N, C, *).
fn per_channel<B: Builder>(b: &mut B, p: &B::T, rank: usize) -> Result<B::T> {
    let c = b.dims(p).iter().product::<usize>() as i64;
    let mut s = vec![c];
    s.extend(std::iter::repeat_n(1, rank.saturating_sub(2)));
    b.reshape(p, &s)
}

fn check_channels<B: Builder>(
    b: &B,
    op: &str,
    x: &B::T,
    params: &[(&str, Option<&B::T>)],
) -> Result<usize> {
    let shape = b.dims(x);
    if shape.len() < 2 {
        bail!(
            op,
            "expected an input of shape (N, C, *), got {}",
            fmt_dims(&shape)
        );
    }
    let c = shape[1];
    for (name, p) in params {
        if let Some(p) = p {
            if b.dims(p).as_slice() != [c] {
                bail!(
                    op,
                    "{name} has shape {} but the input {} has {c} channels",
                    fmt_dims(&b.dims(p)),
                    fmt_dims(&shape)
                );
            }
        }
    }
    Ok(c)
}

/// `F.group_norm(x, groups, weight, bias, eps)` on (N, C, *).
pub fn group_norm<B: Builder>(
    b: &mut B,
    x: &B::T,
    groups: usize,
    weight: Option<&B::T>,
    bias: Option<&B::T>,
    eps: f64,
) -> Result<B::T> {
    let shape = b.dims(x);
    let c = check_channels(b, "group_norm", x, &[("weight", weight), ("bias", bias)])?;
    if groups == 0 || c % groups != 0 {
        bail!(
            "group_norm",
            "{c} channels of input {} cannot be split into {groups} groups",
            fmt_dims(&shape)
        );
    }
    let g = b.reshape(x, &[shape[0] as i64, groups as i64, -1])?;
    let (y, _) = normalize(b, &g, &[2], eps)?;
    let mut y = b.reshape(&y, &ishape(&shape))?;
    if let Some(w) = weight {
        let w = per_channel(b, w, shape.len())?;
        y = b.binary(BinaryOp::Mul, &y, &w)?;
    }
    if let Some(bi) = bias {
        let bi = per_channel(b, bi, shape.len())?;
        y = b.binary(BinaryOp::Add, &y, &bi)?;
    }
    Ok(y)
}

/// Result of [`batch_norm`]: the output and, in training, the new running stats.
pub struct BatchNormOut<T> {
    pub y: T,
    /// (new running_mean, new running_var) when training with running stats.
    pub running: Option<(T, T)>,
    /// Training: the batch's (mean, 1 / sqrt(var + eps)), kept dims, for a
    /// backward rule written in terms of them.
    pub batch: Option<(T, T)>,
}

/// `F.batch_norm` on (N, C, *). Training normalises with the batch's biased
/// variance and moves the running stats toward the batch mean and UNBIASED
/// variance by `momentum`; eval uses the running stats.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm<B: Builder>(
    b: &mut B,
    x: &B::T,
    running_mean: Option<&B::T>,
    running_var: Option<&B::T>,
    weight: Option<&B::T>,
    bias: Option<&B::T>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<BatchNormOut<B::T>> {
    let shape = b.dims(x);
    let c = check_channels(
        b,
        "batch_norm",
        x,
        &[
            ("weight", weight),
            ("bias", bias),
            ("running_mean", running_mean),
            ("running_var", running_var),
        ],
    )?;
    let rank = shape.len();
    let red: Vec<i64> = std::iter::once(0).chain(2..rank as i64).collect();
    let n: usize = shape.iter().product::<usize>() / c.max(1);
    let mut batch = None;
    let (mut y, running) = if training {
        if n <= 1 {
            bail!(
                "batch_norm",
                "expected more than 1 value per channel when training, got input {}",
                fmt_dims(&shape)
            );
        }
        let (y, m) = normalize(b, x, &red, eps)?;
        let running = match (running_mean, running_var) {
            (Some(rm), Some(rv)) => {
                let mean = b.reshape(&m.mean, &[c as i64])?;
                let var = b.reshape(&m.var, &[c as i64])?;
                let unbiased = b.scalar(BinaryOp::Mul, &var, n as f64 / (n - 1) as f64)?;
                let keep_m = b.scalar(BinaryOp::Mul, rm, 1.0 - momentum)?;
                let new_m = b.scalar(BinaryOp::Mul, &mean, momentum)?;
                let new_m = b.binary(BinaryOp::Add, &keep_m, &new_m)?;
                let keep_v = b.scalar(BinaryOp::Mul, rv, 1.0 - momentum)?;
                let new_v = b.scalar(BinaryOp::Mul, &unbiased, momentum)?;
                let new_v = b.binary(BinaryOp::Add, &keep_v, &new_v)?;
                Some((new_m, new_v))
            }
            _ => None,
        };
        batch = Some((m.mean, m.rstd));
        (y, running)
    } else {
        let (Some(rm), Some(rv)) = (running_mean, running_var) else {
            bail!(
                "batch_norm",
                "running_mean and running_var are required in eval mode"
            );
        };
        let rm = per_channel(b, rm, rank)?;
        let rv = per_channel(b, rv, rank)?;
        let d = b.binary(BinaryOp::Sub, x, &rm)?;
        let ve = b.scalar(BinaryOp::Add, &rv, eps)?;
        let r = b.unary(UnaryOp::Rsqrt, &ve)?;
        (b.binary(BinaryOp::Mul, &d, &r)?, None)
    };
    if let Some(w) = weight {
        let w = per_channel(b, w, rank)?;
        y = b.binary(BinaryOp::Mul, &y, &w)?;
    }
    if let Some(bi) = bias {
        let bi = per_channel(b, bi, rank)?;
        y = b.binary(BinaryOp::Add, &y, &bi)?;
    }
    Ok(BatchNormOut { y, running, batch })
}
