//! Backward rules of the table's activations (clamp, hardswish, mish, ...),
//! rounding ops and special functions, and of atan2, hypot, copysign and
//! xlogy. The formulas follow PyTorch's derivatives.yaml, including which
//! side of a kink or bound gets the gradient (clamp passes it strictly
//! inside the bounds, hardtanh everywhere but on or outside them).

use super::{add_s, keep, mul_s, rsub_s};
use crate::Tensor;
use kiln_ir::{BinaryOp, Result, UnaryOp};
use std::f64::consts::{LN_10, LN_2, PI};

fn cmp(x: &Tensor, op: BinaryOp, v: f64) -> Result<Tensor> {
    x.binary_scalar(op, v, false)
}

/// `where(cond, 0, g)`.
fn zero_where(cond: &Tensor, g: &Tensor) -> Result<Tensor> {
    keep(&cond.logical_not()?, g)
}

/// `where(x <= lo || x >= hi, 0, g)`: hardtanh's rule (NaN keeps g).
fn outside_zero(g: &Tensor, x: &Tensor, lo: f64, hi: f64) -> Result<Tensor> {
    let out = cmp(x, BinaryOp::Le, lo)?.binary(BinaryOp::Or, &cmp(x, BinaryOp::Ge, hi)?)?;
    zero_where(&out, g)
}

/// `where(lo < x < hi, g, 0)` (NaN gets 0).
fn inside_keep(g: &Tensor, x: &Tensor, lo: f64, hi: f64) -> Result<Tensor> {
    let inside = cmp(x, BinaryOp::Gt, lo)?.binary(BinaryOp::And, &cmp(x, BinaryOp::Lt, hi)?)?;
    keep(&inside, g)
}

fn zeros_like(x: &Tensor) -> Result<Tensor> {
    Tensor::zeros_on(x.dims(), x.dtype(), x.device())
}

/// The input gradient of the activations and clamps (`None`: not one).
fn activation_grad(op: UnaryOp, g: &Tensor, x: &Tensor, y: &Tensor) -> Result<Option<Tensor>> {
    use UnaryOp::*;
    Ok(Some(match op {
        Clamp { min, max } => inside_keep(g, x, min.0, max.0)?,
        Hardtanh { min_val, max_val } => outside_zero(g, x, min_val.0, max_val.0)?,
        Relu6 => outside_zero(g, x, 0.0, 6.0)?,
        Hardswish => {
            let mid = g.mul(&add_s(&mul_s(x, 1.0 / 3.0)?, 0.5)?)?;
            let hi = Tensor::where_(&cmp(x, BinaryOp::Ge, 3.0)?, g, &mid)?;
            zero_where(&cmp(x, BinaryOp::Le, -3.0)?, &hi)?
        }
        Hardsigmoid => inside_keep(&mul_s(g, 1.0 / 6.0)?, x, -3.0, 3.0)?,
        // tanh(sp) + x * sigmoid(x) * (1 - tanh(sp)^2), sp = softplus(x)
        Mish => {
            let t = x.exp()?.unary(Log1p)?.tanh()?;
            let d = x.sigmoid()?.mul(x)?.mul(&rsub_s(&t.mul(&t)?, 1.0)?)?;
            g.mul(&t.add(&d)?)?
        }
        Selu => {
            const ALPHA: f64 = 1.673_263_242_354_377_3;
            const SCALE: f64 = 1.050_700_987_355_480_5;
            let neg = mul_s(&g.mul(&x.exp()?)?, ALPHA * SCALE)?;
            Tensor::where_(&cmp(x, BinaryOp::Gt, 0.0)?, &mul_s(g, SCALE)?, &neg)?
        }
        Celu { alpha } => {
            let neg = g.mul(&mul_s(x, 1.0 / alpha.0)?.exp()?)?;
            Tensor::where_(&cmp(x, BinaryOp::Gt, 0.0)?, g, &neg)?
        }
        LogSigmoid => g.mul(&x.neg()?.sigmoid()?)?,
        Softsign => {
            let d = add_s(&x.abs()?, 1.0)?;
            g.div(&d.mul(&d)?)?
        }
        Threshold { threshold, .. } => zero_where(&cmp(x, BinaryOp::Le, threshold.0)?, g)?,
        Hardshrink { lambd } | Softshrink { lambd } => {
            let lo = cmp(x, BinaryOp::Ge, -lambd.0)?;
            let inside = lo.binary(BinaryOp::And, &cmp(x, BinaryOp::Le, lambd.0)?)?;
            zero_where(&inside, g)?
        }
        Tanhshrink => {
            let t = x.tanh()?;
            g.mul(&t.mul(&t)?)?
        }
        _ => return special_grad(op, g, x, y),
    }))
}

/// The input gradient of the rounding ops, predicates and special functions.
fn special_grad(op: UnaryOp, g: &Tensor, x: &Tensor, y: &Tensor) -> Result<Option<Tensor>> {
    use UnaryOp::*;
    let k = 2.0 / PI.sqrt();
    Ok(Some(match op {
        Round { .. } | Ceil | Trunc | Sign => zeros_like(x)?,
        Frac => g.clone(),
        IsNan | IsInf | IsFinite | IsPosInf | IsNegInf | BitwiseNot => return Ok(None),
        NanToNum { .. } => keep(&x.unary(IsFinite)?, g)?,
        Log2 => g.div(&mul_s(x, LN_2)?)?,
        Log10 => g.div(&mul_s(x, LN_10)?)?,
        Exp2 => g.mul(&mul_s(y, LN_2)?)?,
        Sinh => g.mul(&x.unary(Cosh)?)?,
        Cosh => g.mul(&x.unary(Sinh)?)?,
        Tan => g.mul(&add_s(&y.mul(y)?, 1.0)?)?,
        Asin => g.div(&rsub_s(&x.mul(x)?, 1.0)?.sqrt()?)?,
        Acos => g.neg()?.div(&rsub_s(&x.mul(x)?, 1.0)?.sqrt()?)?,
        Atan => g.div(&add_s(&x.mul(x)?, 1.0)?)?,
        Erfc => mul_s(&g.mul(&x.square()?.neg()?.exp()?)?, -k)?,
        Erfinv => mul_s(&g.mul(&y.square()?.exp()?)?, PI.sqrt() / 2.0)?,
        Logit { eps } => {
            let d = g.div(&x.mul(&rsub_s(x, 1.0)?)?)?;
            if eps.0 < 0.0 {
                d
            } else {
                let lo = cmp(x, BinaryOp::Lt, eps.0)?;
                let out = lo.binary(BinaryOp::Or, &cmp(x, BinaryOp::Gt, 1.0 - eps.0)?)?;
                zero_where(&out, &d)?
            }
        }
        other => unreachable!("{other} has its rule in pointwise.rs"),
    }))
}

/// The gradient of one of the table's later unary ops (see `unary_grad`).
pub(super) fn unary_grad(
    op: UnaryOp,
    g: &Tensor,
    x: &Tensor,
    y: &Tensor,
) -> Result<Option<Tensor>> {
    activation_grad(op, g, x, y)
}

/// `[d/da, d/db]` of atan2, hypot, copysign and xlogy.
pub(super) fn binary_grads(
    op: BinaryOp,
    g: &Tensor,
    a: &Tensor,
    b: &Tensor,
    y: &Tensor,
) -> Result<[Tensor; 2]> {
    Ok(match op {
        BinaryOp::Atan2 => {
            let r2 = a.mul(a)?.add(&b.mul(b)?)?;
            [g.mul(b)?.div(&r2)?, g.neg()?.mul(a)?.div(&r2)?]
        }
        BinaryOp::Hypot => [g.mul(a)?.div(y)?, g.mul(b)?.div(y)?],
        // y / a, 0 where a == 0
        BinaryOp::Copysign => {
            let a0 = cmp(a, BinaryOp::Eq, 0.0)?;
            let ratio = zero_where(&a0, &y.div(a)?)?;
            [g.mul(&ratio)?, zeros_like(b)?.mul(g)?]
        }
        // PyTorch: xlogy(g, b) masked to 0 where a == 0 and b <= 0; g * a / b
        BinaryOp::Xlogy => {
            let a0 = cmp(a, BinaryOp::Eq, 0.0)?;
            let masked = a0.binary(BinaryOp::And, &cmp(b, BinaryOp::Le, 0.0)?)?;
            let ga = g.binary(BinaryOp::Xlogy, b)?;
            [zero_where(&masked, &ga)?, g.mul(a)?.div(b)?]
        }
        other => unreachable!("{other} has its rule in pointwise.rs"),
    })
}
