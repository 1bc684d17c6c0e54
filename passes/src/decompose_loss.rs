//! Loss functions as compositions of primitives, with PyTorch's conventions
//! (`reduction='mean'` by default; weighted means divide by the weight sum).

use crate::decompose::{log_softmax, Builder};
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, BinaryOp, DType, ReduceKind, Result, UnaryOp};

/// `reduction=` of PyTorch's losses (one definition, in the IR vocabulary).
pub use kiln_ir::op::Reduction;

pub(crate) fn reduce<B: Builder>(b: &mut B, loss: &B::T, r: Reduction) -> Result<B::T> {
    let rank = b.dims(loss).len() as i64;
    let all: Vec<i64> = (0..rank).collect();
    match r {
        Reduction::None => Ok(loss.clone()),
        Reduction::Sum => b.reduce(ReduceKind::Sum, loss, &all, false),
        Reduction::Mean => b.mean(loss, &all, false),
    }
}

pub(crate) fn same_shape<B: Builder>(b: &B, op: &str, x: &B::T, y: &B::T) -> Result<()> {
    if b.dims(x) != b.dims(y) {
        bail!(
            op,
            "input {} and target {} must have the same shape",
            fmt_dims(&b.dims(x)),
            fmt_dims(&b.dims(y))
        );
    }
    Ok(())
}

/// PyTorch's regression losses broadcast input and target (the frontend
/// warns when their shapes differ); shapes that cannot broadcast are an error.
pub(crate) fn broadcastable<B: Builder>(b: &B, op: &str, x: &B::T, y: &B::T) -> Result<()> {
    let (xs, ys) = (b.dims(x), b.dims(y));
    if kiln_ir::shape::broadcast_shapes(op, &xs, &ys).is_err() {
        bail!(
            op,
            "input {} and target {} cannot broadcast (the target size must match the input size)",
            fmt_dims(&xs),
            fmt_dims(&ys)
        );
    }
    Ok(())
}

/// mean((x - y)^2)
pub fn mse_loss<B: Builder>(b: &mut B, x: &B::T, y: &B::T, r: Reduction) -> Result<B::T> {
    broadcastable(b, "mse_loss", x, y)?;
    let d = b.binary(BinaryOp::Sub, x, y)?;
    let sq = b.binary(BinaryOp::Mul, &d, &d)?;
    reduce(b, &sq, r)
}

/// mean(|x - y|)
pub fn l1_loss<B: Builder>(b: &mut B, x: &B::T, y: &B::T, r: Reduction) -> Result<B::T> {
    broadcastable(b, "l1_loss", x, y)?;
    let d = b.binary(BinaryOp::Sub, x, y)?;
    let a = b.unary(UnaryOp::Abs, &d)?;
    reduce(b, &a, r)
}

/// |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta   (beta = 0 is L1)
pub fn smooth_l1_loss<B: Builder>(
    b: &mut B,
    x: &B::T,
    y: &B::T,
    r: Reduction,
    beta: f64,
) -> Result<B::T> {
    broadcastable(b, "smooth_l1_loss", x, y)?;
    let d = b.binary(BinaryOp::Sub, x, y)?;
    let z = b.unary(UnaryOp::Abs, &d)?;
    if beta == 0.0 {
        return reduce(b, &z, r);
    }
    let small = b.scalar(BinaryOp::Lt, &z, beta)?;
    let sq = b.binary(BinaryOp::Mul, &z, &z)?;
    let quad = b.scalar(BinaryOp::Mul, &sq, 0.5 / beta)?;
    let lin = b.scalar(BinaryOp::Sub, &z, 0.5 * beta)?;
    let l = b.select(&small, &quad, &lin)?;
    reduce(b, &l, r)
}

/// |d| < delta ? 0.5 d^2 : delta (|d| - 0.5 delta)
pub fn huber_loss<B: Builder>(
    b: &mut B,
    x: &B::T,
    y: &B::T,
    r: Reduction,
    delta: f64,
) -> Result<B::T> {
    broadcastable(b, "huber_loss", x, y)?;
    let d = b.binary(BinaryOp::Sub, x, y)?;
    let z = b.unary(UnaryOp::Abs, &d)?;
    let small = b.scalar(BinaryOp::Lt, &z, delta)?;
    let sq = b.binary(BinaryOp::Mul, &z, &z)?;
    let quad = b.scalar(BinaryOp::Mul, &sq, 0.5)?;
    let zl = b.scalar(BinaryOp::Sub, &z, 0.5 * delta)?;
    let lin = b.scalar(BinaryOp::Mul, &zl, delta)?;
    let l = b.select(&small, &quad, &lin)?;
    reduce(b, &l, r)
}

/// (1 - y) x - log_weight * log_sigmoid(x), log_sigmoid(x) = min(x, 0) - log1p(exp(-|x|)):
/// stable for huge logits.
pub fn bce_with_logits<B: Builder>(
    b: &mut B,
    x: &B::T,
    y: &B::T,
    weight: Option<&B::T>,
    pos_weight: Option<&B::T>,
    r: Reduction,
) -> Result<B::T> {
    same_shape(b, "binary_cross_entropy_with_logits", x, y)?;
    let ax = b.unary(UnaryOp::Abs, x)?;
    let nax = b.unary(UnaryOp::Neg, &ax)?;
    let e = b.unary(UnaryOp::Exp, &nax)?;
    let l1p = b.unary(UnaryOp::Log1p, &e)?;
    let mn = b.scalar(BinaryOp::Minimum, x, 0.0)?;
    let mut log_sig = b.binary(BinaryOp::Sub, &mn, &l1p)?;
    if let Some(pw) = pos_weight {
        let pw1 = b.scalar(BinaryOp::Sub, pw, 1.0)?;
        let t = b.binary(BinaryOp::Mul, &pw1, y)?;
        let lw = b.scalar(BinaryOp::Add, &t, 1.0)?;
        log_sig = b.binary(BinaryOp::Mul, &log_sig, &lw)?;
    }
    let ym1 = b.scalar(BinaryOp::Sub, y, 1.0)?;
    let one_minus_y = b.unary(UnaryOp::Neg, &ym1)?;
    let a = b.binary(BinaryOp::Mul, &one_minus_y, x)?;
    let mut loss = b.binary(BinaryOp::Sub, &a, &log_sig)?;
    if let Some(w) = weight {
        loss = b.binary(BinaryOp::Mul, &loss, w)?;
    }
    reduce(b, &loss, r)
}

/// (y - 1) max(log1p(-p), -100) - y max(log p, -100)
pub fn binary_cross_entropy<B: Builder>(
    b: &mut B,
    p: &B::T,
    y: &B::T,
    weight: Option<&B::T>,
    r: Reduction,
) -> Result<B::T> {
    same_shape(b, "binary_cross_entropy", p, y)?;
    let np = b.unary(UnaryOp::Neg, p)?;
    let l1 = b.unary(UnaryOp::Log1p, &np)?;
    let l1 = b.scalar(BinaryOp::Maximum, &l1, -100.0)?;
    let lp = b.unary(UnaryOp::Log, p)?;
    let lp = b.scalar(BinaryOp::Maximum, &lp, -100.0)?;
    let ym1 = b.scalar(BinaryOp::Sub, y, 1.0)?;
    let a = b.binary(BinaryOp::Mul, &ym1, &l1)?;
    let c = b.binary(BinaryOp::Mul, y, &lp)?;
    let mut loss = b.binary(BinaryOp::Sub, &a, &c)?;
    if let Some(w) = weight {
        loss = b.binary(BinaryOp::Mul, &loss, w)?;
    }
    reduce(b, &loss, r)
}

/// Options of `F.nll_loss` / `F.cross_entropy`.
#[derive(Debug, Clone, Copy)]
pub struct ClassLossOpts {
    pub reduction: Reduction,
    pub ignore_index: i64,
    pub label_smoothing: f64,
}

impl Default for ClassLossOpts {
    fn default() -> Self {
        ClassLossOpts {
            reduction: Reduction::Mean,
            ignore_index: -100,
            label_smoothing: 0.0,
        }
    }
}

/// `[1, C, 1, ...]`-shaped weight for broadcasting along the class dim.
fn class_weight<B: Builder>(b: &mut B, w: &B::T, rank: usize, class_dim: usize) -> Result<B::T> {
    let c = b.dims(w).iter().product::<usize>() as i64;
    let s: Vec<i64> = (0..rank)
        .map(|i| if i == class_dim { c } else { 1 })
        .collect();
    b.reshape(w, &s)
}

/// `F.nll_loss(logp, target)` for logp (N, C, *) or (C,), integer target (N, *) or ().
pub fn nll_loss<B: Builder>(
    b: &mut B,
    logp: &B::T,
    target: &B::T,
    weight: Option<&B::T>,
    o: ClassLossOpts,
) -> Result<B::T> {
    let ls = b.dims(logp);
    let ts = b.dims(target);
    let class_dim = usize::from(ls.len() >= 2);
    let expected: Vec<usize> = ls
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != class_dim)
        .map(|(_, &d)| d)
        .collect();
    if ls.is_empty() || ts.as_slice() != expected.as_slice() {
        bail!(
            "nll_loss",
            "input {} and target {} do not match: expected target shape {}",
            fmt_dims(&ls),
            fmt_dims(&ts),
            fmt_dims(&expected)
        );
    }
    if b.dtype(target).is_float() {
        bail!(
            "nll_loss",
            "target must hold class indices (an integer tensor), got {}",
            b.dtype(target)
        );
    }
    let c = ls[class_dim];
    if let Some(w) = weight {
        if b.dims(w).as_slice() != [c] {
            bail!(
                "nll_loss",
                "weight has shape {} but the input has {c} classes",
                fmt_dims(&b.dims(w))
            );
        }
    }
    let target = b.cast(target, DType::I64)?;
    let keep = b.scalar(BinaryOp::Ne, &target, o.ignore_index as f64)?;
    let safe_t = b.select_scalar(&keep, &target, 0.0)?;
    let mut idx_shape: Vec<i64> = ts.iter().map(|&d| d as i64).collect();
    idx_shape.insert(class_dim, 1);
    let idx = b.reshape(&safe_t, &idx_shape)?;
    let picked = b.gather(logp, class_dim as i64, &idx)?;
    let picked = b.reshape(&picked, &ts.iter().map(|&d| d as i64).collect::<Vec<_>>())?;
    let keepf = b.cast(&keep, b.dtype(logp))?;
    let w_t = match weight {
        Some(w) => {
            let flat = b.reshape(&safe_t, &[-1])?;
            let g = b.gather(w, 0, &flat)?;
            let g = b.reshape(&g, &ts.iter().map(|&d| d as i64).collect::<Vec<_>>())?;
            b.binary(BinaryOp::Mul, &g, &keepf)?
        }
        None => keepf,
    };
    let wl = b.binary(BinaryOp::Mul, &picked, &w_t)?;
    let loss = b.unary(UnaryOp::Neg, &wl)?;
    let all: Vec<i64> = (0..ts.len() as i64).collect();
    match o.reduction {
        Reduction::None => Ok(loss),
        Reduction::Sum => b.reduce(ReduceKind::Sum, &loss, &all, false),
        Reduction::Mean => {
            let s = b.reduce(ReduceKind::Sum, &loss, &all, false)?;
            let ws = b.reduce(ReduceKind::Sum, &w_t, &all, false)?;
            b.binary(BinaryOp::Div, &s, &ws)
        }
    }
}

/// `F.cross_entropy(input, target)`: class indices (integer target) or class
/// probabilities (float target of the input's shape), with weight,
/// ignore_index and label_smoothing as in PyTorch.
pub fn cross_entropy<B: Builder>(
    b: &mut B,
    x: &B::T,
    target: &B::T,
    weight: Option<&B::T>,
    o: ClassLossOpts,
) -> Result<B::T> {
    let xs = b.dims(x);
    if xs.is_empty() {
        bail!(
            "cross_entropy",
            "input must have at least one dim (the classes), got a 0-dim tensor"
        );
    }
    let class_dim = usize::from(xs.len() >= 2);
    let c = xs[class_dim];
    let logp = log_softmax(b, x, class_dim as i64)?;
    let eps = o.label_smoothing;
    let rank = xs.len();
    if b.dtype(target).is_float() {
        same_shape(b, "cross_entropy", x, target)?;
        let t = if eps > 0.0 {
            let t = b.scalar(BinaryOp::Mul, target, 1.0 - eps)?;
            b.scalar(BinaryOp::Add, &t, eps / c as f64)?
        } else {
            target.clone()
        };
        let mut prod = b.binary(BinaryOp::Mul, &logp, &t)?;
        if let Some(w) = weight {
            let w = class_weight(b, w, rank, class_dim)?;
            prod = b.binary(BinaryOp::Mul, &prod, &w)?;
        }
        let s = b.reduce(ReduceKind::Sum, &prod, &[class_dim as i64], false)?;
        let loss = b.unary(UnaryOp::Neg, &s)?;
        let all: Vec<i64> = (0..rank as i64 - 1).collect();
        return match o.reduction {
            Reduction::None => Ok(loss),
            Reduction::Sum => b.reduce(ReduceKind::Sum, &loss, &all, false),
            Reduction::Mean => {
                let s = b.reduce(ReduceKind::Sum, &loss, &all, false)?;
                b.scalar(
                    BinaryOp::Div,
                    &s,
                    (xs.iter().product::<usize>() / c.max(1)) as f64,
                )
            }
        };
    }
    let nll = nll_loss(b, &logp, target, weight, o)?;
    if eps <= 0.0 {
        return Ok(nll);
    }
    // smoothing term: -sum_c w_c logp_c, zero at ignored positions
    let mut lw = logp.clone();
    if let Some(w) = weight {
        let w = class_weight(b, w, rank, class_dim)?;
        lw = b.binary(BinaryOp::Mul, &lw, &w)?;
    }
    let s = b.reduce(ReduceKind::Sum, &lw, &[class_dim as i64], false)?;
    let smooth = b.unary(UnaryOp::Neg, &s)?;
    let t64 = b.cast(target, DType::I64)?;
    let keep = b.scalar(BinaryOp::Ne, &t64, o.ignore_index as f64)?;
    let smooth = b.select_scalar(&keep, &smooth, 0.0)?;
    let ts = b.dims(target);
    let all: Vec<i64> = (0..ts.len() as i64).collect();
    let smooth_red = match o.reduction {
        Reduction::None => smooth,
        Reduction::Sum => b.reduce(ReduceKind::Sum, &smooth, &all, false)?,
        Reduction::Mean => {
            let s = b.reduce(ReduceKind::Sum, &smooth, &all, false)?;
            let keepf = b.cast(&keep, b.dtype(x))?;
            let denom = match weight {
                Some(w) => {
                    let safe = b.select_scalar(&keep, &t64, 0.0)?;
                    let flat = b.reshape(&safe, &[-1])?;
                    let g = b.gather(w, 0, &flat)?;
                    let kf = b.reshape(&keepf, &[-1])?;
                    b.binary(BinaryOp::Mul, &g, &kf)?
                }
                None => keepf,
            };
            let nd = b.dims(&denom).len() as i64;
            let den = b.reduce(ReduceKind::Sum, &denom, &(0..nd).collect::<Vec<_>>(), false)?;
            b.binary(BinaryOp::Div, &s, &den)?
        }
    };
    let a = b.scalar(BinaryOp::Mul, &nll, 1.0 - eps)?;
    let s2 = b.scalar(BinaryOp::Mul, &smooth_red, eps / c as f64)?;
    b.binary(BinaryOp::Add, &a, &s2)
}
