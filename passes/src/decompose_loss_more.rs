//! More of PyTorch's losses as compositions of primitives: KL divergence,
//! Poisson NLL, and the margin / embedding losses (margin_ranking, hinge,
//! soft_margin, multilabel_soft_margin, cosine_embedding, triplet_margin),
//! each with PyTorch's formula, so eager (fused) and traced runs agree.

use crate::decompose::Builder;
use crate::decompose_loss::{broadcastable, reduce, same_shape, Reduction};
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, BinaryOp, ReduceKind, Result, UnaryOp};

/// `reduction=` of `F.kl_div`: a loss reduction, or `batchmean` (the sum
/// divided by the batch size, the true KL divergence per sample).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KlReduction {
    Plain(Reduction),
    BatchMean,
}

impl KlReduction {
    /// PyTorch's spelling (`none`, `mean`, `sum`, `batchmean`).
    pub fn parse(s: &str) -> Result<KlReduction> {
        match s {
            "batchmean" => Ok(KlReduction::BatchMean),
            _ => Reduction::parse(s).map(KlReduction::Plain).map_err(|_| {
                kiln_ir::Error::op(
                    "kl_div",
                    format!("reduction must be 'none', 'mean', 'sum' or 'batchmean', got '{s}'"),
                )
            }),
        }
    }
}

/// `s - x` for a Python float `s` (`1 - x`, `margin - x`).
fn rsub<B: Builder>(b: &mut B, s: f64, x: &B::T) -> Result<B::T> {
    let n = b.unary(UnaryOp::Neg, x)?;
    b.scalar(BinaryOp::Add, &n, s)
}

/// `F.kl_div(input, target)`: input holds log-probabilities; the target
/// probabilities (`xlogy(t, t) - t * input`, so a zero target adds 0) or,
/// with `log_target`, log-probabilities (`exp(t) * (t - input)`).
pub fn kl_div<B: Builder>(
    b: &mut B,
    x: &B::T,
    t: &B::T,
    r: KlReduction,
    log_target: bool,
) -> Result<B::T> {
    broadcastable(b, "kl_div", x, t)?;
    let loss = if log_target {
        let e = b.unary(UnaryOp::Exp, t)?;
        let d = b.binary(BinaryOp::Sub, t, x)?;
        b.binary(BinaryOp::Mul, &e, &d)?
    } else {
        let ent = b.binary(BinaryOp::Xlogy, t, t)?;
        let cross = b.binary(BinaryOp::Mul, t, x)?;
        b.binary(BinaryOp::Sub, &ent, &cross)?
    };
    match r {
        KlReduction::Plain(r) => reduce(b, &loss, r),
        KlReduction::BatchMean => {
            let s = reduce(b, &loss, Reduction::Sum)?;
            match b.dims(x).first() {
                Some(&n) => b.scalar(BinaryOp::Div, &s, n as f64),
                None => Ok(s),
            }
        }
    }
}

/// `F.poisson_nll_loss`: `exp(x) - t x` (`log_input`) or `x - t log(x + eps)`,
/// plus with `full` the Stirling term `t log t - t + log(2 pi t) / 2` where t > 1.
pub fn poisson_nll_loss<B: Builder>(
    b: &mut B,
    x: &B::T,
    t: &B::T,
    log_input: bool,
    full: bool,
    eps: f64,
    r: Reduction,
) -> Result<B::T> {
    broadcastable(b, "poisson_nll_loss", x, t)?;
    let mut loss = if log_input {
        let e = b.unary(UnaryOp::Exp, x)?;
        let tx = b.binary(BinaryOp::Mul, t, x)?;
        b.binary(BinaryOp::Sub, &e, &tx)?
    } else {
        let xe = b.scalar(BinaryOp::Add, x, eps)?;
        let l = b.unary(UnaryOp::Log, &xe)?;
        let tl = b.binary(BinaryOp::Mul, t, &l)?;
        b.binary(BinaryOp::Sub, x, &tl)?
    };
    if full {
        let lt = b.unary(UnaryOp::Log, t)?;
        let tlt = b.binary(BinaryOp::Mul, t, &lt)?;
        let a = b.binary(BinaryOp::Sub, &tlt, t)?;
        let t2pi = b.scalar(BinaryOp::Mul, t, 2.0 * std::f64::consts::PI)?;
        let l2 = b.unary(UnaryOp::Log, &t2pi)?;
        let half = b.scalar(BinaryOp::Mul, &l2, 0.5)?;
        let stirling = b.binary(BinaryOp::Add, &a, &half)?;
        let big = b.scalar(BinaryOp::Gt, t, 1.0)?;
        let stirling = b.select_scalar(&big, &stirling, 0.0)?;
        loss = b.binary(BinaryOp::Add, &loss, &stirling)?;
    }
    reduce(b, &loss, r)
}

/// PyTorch's check of the margin losses: every tensor has the same rank.
fn same_rank<B: Builder>(b: &B, op: &str, xs: &[(&str, &B::T)]) -> Result<()> {
    let rank = b.dims(xs[0].1).len();
    if xs.iter().any(|(_, x)| b.dims(x).len() != rank) {
        let sizes: Vec<String> = xs
            .iter()
            .map(|(n, x)| format!("{n}: {}", fmt_dims(&b.dims(x))))
            .collect();
        bail!(
            op,
            "All input tensors should have same dimension but got sizes: {}",
            sizes.join(", ")
        );
    }
    Ok(())
}

/// `F.margin_ranking_loss`: `max(0, -y (x1 - x2) + margin)`.
pub fn margin_ranking_loss<B: Builder>(
    b: &mut B,
    x1: &B::T,
    x2: &B::T,
    y: &B::T,
    margin: f64,
    r: Reduction,
) -> Result<B::T> {
    let op = "margin_ranking_loss";
    same_rank(b, op, &[("input1", x1), ("input2", x2), ("target", y)])?;
    let d = b.binary(BinaryOp::Sub, x1, x2)?;
    let yd = b.binary(BinaryOp::Mul, y, &d)?;
    let z = rsub(b, margin, &yd)?;
    let loss = b.unary(UnaryOp::Relu, &z)?;
    reduce(b, &loss, r)
}

/// `F.hinge_embedding_loss`: `x` where y = 1, `max(0, margin - x)` where y = -1
/// (a target of neither value adds both).
pub fn hinge_embedding_loss<B: Builder>(
    b: &mut B,
    x: &B::T,
    y: &B::T,
    margin: f64,
    r: Reduction,
) -> Result<B::T> {
    broadcastable(b, "hinge_embedding_loss", x, y)?;
    let m = rsub(b, margin, x)?;
    let m = b.unary(UnaryOp::Relu, &m)?;
    let not_pos = b.scalar(BinaryOp::Ne, y, 1.0)?;
    let not_neg = b.scalar(BinaryOp::Ne, y, -1.0)?;
    let a = b.select_scalar(&not_pos, &m, 0.0)?;
    let c = b.select_scalar(&not_neg, x, 0.0)?;
    let loss = b.binary(BinaryOp::Add, &a, &c)?;
    reduce(b, &loss, r)
}

/// `F.soft_margin_loss`: `log(1 + exp(-y x))`.
pub fn soft_margin_loss<B: Builder>(b: &mut B, x: &B::T, y: &B::T, r: Reduction) -> Result<B::T> {
    broadcastable(b, "soft_margin_loss", x, y)?;
    let yx = b.binary(BinaryOp::Mul, y, x)?;
    let n = b.unary(UnaryOp::Neg, &yx)?;
    let e = b.unary(UnaryOp::Exp, &n)?;
    let loss = b.unary(UnaryOp::Log1p, &e)?;
    reduce(b, &loss, r)
}

/// `F.multilabel_soft_margin_loss`: per sample, the mean over classes of
/// `-(y logsigmoid(x) + (1 - y) logsigmoid(-x))`, times `weight` per class.
pub fn multilabel_soft_margin_loss<B: Builder>(
    b: &mut B,
    x: &B::T,
    y: &B::T,
    weight: Option<&B::T>,
    r: Reduction,
) -> Result<B::T> {
    same_shape(b, "multilabel_soft_margin_loss", x, y)?;
    let dims = b.dims(x);
    let Some(&c) = dims.last() else {
        bail!(
            "multilabel_soft_margin_loss",
            "input must have a class dim, got a 0-dim tensor"
        );
    };
    let pos = b.unary(UnaryOp::LogSigmoid, x)?;
    let nx = b.unary(UnaryOp::Neg, x)?;
    let neg = b.unary(UnaryOp::LogSigmoid, &nx)?;
    let a = b.binary(BinaryOp::Mul, y, &pos)?;
    let one_minus_y = rsub(b, 1.0, y)?;
    let c2 = b.binary(BinaryOp::Mul, &one_minus_y, &neg)?;
    let s = b.binary(BinaryOp::Add, &a, &c2)?;
    let mut loss = b.unary(UnaryOp::Neg, &s)?;
    if let Some(w) = weight {
        loss = b.binary(BinaryOp::Mul, &loss, w)?;
    }
    let per = b.reduce(ReduceKind::Sum, &loss, &[dims.len() as i64 - 1], false)?;
    let per = b.scalar(BinaryOp::Div, &per, c as f64)?;
    reduce(b, &per, r)
}

/// `F.cosine_embedding_loss`: `1 - cos(x1, x2)` where y = 1,
/// `max(0, cos - margin)` where y = -1; cos over the last dim with PyTorch's
/// 1e-12 added to each squared magnitude.
pub fn cosine_embedding_loss<B: Builder>(
    b: &mut B,
    x1: &B::T,
    x2: &B::T,
    y: &B::T,
    margin: f64,
    r: Reduction,
) -> Result<B::T> {
    let op = "cosine_embedding_loss";
    same_shape(b, op, x1, x2)?;
    let (xs, ys) = (b.dims(x1), b.dims(y));
    if !(1..=2).contains(&xs.len()) || ys.len() + 1 != xs.len() {
        bail!(
            op,
            "expects 1-D inputs with a 0-D target or 2-D inputs with a 1-D target, got inputs {} and target {}",
            fmt_dims(&xs),
            fmt_dims(&ys)
        );
    }
    let dim = [xs.len() as i64 - 1];
    let dot = b.binary(BinaryOp::Mul, x1, x2)?;
    let dot = b.reduce(ReduceKind::Sum, &dot, &dim, false)?;
    let mut mags = vec![];
    for x in [x1, x2] {
        let sq = b.binary(BinaryOp::Mul, x, x)?;
        let s = b.reduce(ReduceKind::Sum, &sq, &dim, false)?;
        mags.push(b.scalar(BinaryOp::Add, &s, 1e-12)?);
    }
    let m = b.binary(BinaryOp::Mul, &mags[0], &mags[1])?;
    let denom = b.unary(UnaryOp::Sqrt, &m)?;
    let cos = b.binary(BinaryOp::Div, &dot, &denom)?;
    let pos = rsub(b, 1.0, &cos)?;
    let neg = b.scalar(BinaryOp::Sub, &cos, margin)?;
    let neg = b.unary(UnaryOp::Relu, &neg)?;
    let is_pos = b.scalar(BinaryOp::Eq, y, 1.0)?;
    let is_neg = b.scalar(BinaryOp::Eq, y, -1.0)?;
    let a = b.select_scalar(&is_pos, &pos, 0.0)?;
    let c = b.select_scalar(&is_neg, &neg, 0.0)?;
    let loss = b.binary(BinaryOp::Add, &a, &c)?;
    reduce(b, &loss, r)
}

/// `F.pairwise_distance(x1, x2, p, eps)`: the p-norm of `x1 - x2 + eps`
/// over the last dim.
pub fn pairwise_distance<B: Builder>(
    b: &mut B,
    x1: &B::T,
    x2: &B::T,
    p: f64,
    eps: f64,
) -> Result<B::T> {
    let rank = b.dims(x1).len().max(b.dims(x2).len());
    if rank == 0 {
        bail!("pairwise_distance", "inputs must have at least one dim");
    }
    let d = b.binary(BinaryOp::Sub, x1, x2)?;
    let d = b.scalar(BinaryOp::Add, &d, eps)?;
    let dim = [rank as i64 - 1];
    let a = b.unary(UnaryOp::Abs, &d)?;
    if p == f64::INFINITY {
        return b.reduce(ReduceKind::Max, &a, &dim, false);
    }
    if p == 2.0 {
        let sq = b.binary(BinaryOp::Mul, &d, &d)?;
        let s = b.reduce(ReduceKind::Sum, &sq, &dim, false)?;
        return b.unary(UnaryOp::Sqrt, &s);
    }
    if p == 1.0 {
        return b.reduce(ReduceKind::Sum, &a, &dim, false);
    }
    let ap = b.scalar(BinaryOp::Pow, &a, p)?;
    let s = b.reduce(ReduceKind::Sum, &ap, &dim, false)?;
    b.scalar(BinaryOp::Pow, &s, 1.0 / p)
}

/// Options of `F.triplet_margin_loss` (PyTorch's defaults).
#[derive(Debug, Clone, Copy)]
pub struct TripletOpts {
    pub margin: f64,
    pub p: f64,
    pub eps: f64,
    /// Use the smaller of d(a, n) and d(p, n) as the negative distance.
    pub swap: bool,
    pub reduction: Reduction,
}

impl Default for TripletOpts {
    fn default() -> Self {
        TripletOpts {
            margin: 1.0,
            p: 2.0,
            eps: 1e-6,
            swap: false,
            reduction: Reduction::Mean,
        }
    }
}

/// `F.triplet_margin_loss`: `max(0, margin + d(a, p) - d(a, n))`.
pub fn triplet_margin_loss<B: Builder>(
    b: &mut B,
    anchor: &B::T,
    positive: &B::T,
    negative: &B::T,
    o: TripletOpts,
) -> Result<B::T> {
    let op = "triplet_margin_loss";
    same_rank(
        b,
        op,
        &[
            ("anchor", anchor),
            ("positive", positive),
            ("negative", negative),
        ],
    )?;
    let d_pos = pairwise_distance(b, anchor, positive, o.p, o.eps)?;
    let mut d_neg = pairwise_distance(b, anchor, negative, o.p, o.eps)?;
    if o.swap {
        let d_swap = pairwise_distance(b, positive, negative, o.p, o.eps)?;
        d_neg = b.binary(BinaryOp::Minimum, &d_neg, &d_swap)?;
    }
    let z = b.binary(BinaryOp::Sub, &d_pos, &d_neg)?;
    let z = b.scalar(BinaryOp::Add, &z, o.margin)?;
    let loss = b.unary(UnaryOp::Relu, &z)?;
    reduce(b, &loss, o.reduction)
}
