//! Backward rules of the pointwise ops: unary, binary (tensor and Python
//! number operands), where, masked_fill and casts. The formulas follow
//! PyTorch's derivatives.yaml so edge values (0, inf) give the same gradients.

use super::pointwise_special as special;
use super::{add_s, keep, mul_s, rsub_s};
use crate::autograd::{needs_grad, record, Saved};
use crate::{Scalar, Tensor};
use kiln_ir::{BinaryOp, Result, UnaryOp};

fn gt0(t: &Tensor) -> Result<Tensor> {
    t.binary_scalar(BinaryOp::Gt, 0.0, false)
}

/// d/dx of `x * Phi(x)` (erf gelu).
fn gelu_grad(g: &Tensor, x: &Tensor) -> Result<Tensor> {
    let cdf = mul_s(
        &add_s(
            &mul_s(x, std::f64::consts::FRAC_1_SQRT_2)?.unary(UnaryOp::Erf)?,
            1.0,
        )?,
        0.5,
    )?;
    let beta = std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2 * 0.5;
    let pdf = mul_s(&mul_s(&x.mul(x)?, -0.5)?.exp()?, beta)?;
    g.mul(&cdf.add(&x.mul(&pdf)?)?)
}

/// d/dx of the tanh-approximated gelu.
fn gelu_tanh_grad(g: &Tensor, x: &Tensor) -> Result<Tensor> {
    let beta = std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5;
    let kappa = 0.044715;
    let x2 = x.mul(x)?;
    let x3 = x2.mul(x)?;
    let inner = mul_s(&x.add(&mul_s(&x3, kappa)?)?, beta)?;
    let t = inner.tanh()?;
    let left = mul_s(x, 0.5)?;
    let right = add_s(&t, 1.0)?;
    let left_d = mul_s(&right, 0.5)?;
    let right_d = left.mul(&rsub_s(&t.mul(&t)?, 1.0)?)?;
    let inner_d = mul_s(&add_s(&mul_s(&x2, 3.0 * kappa)?, 1.0)?, beta)?;
    g.mul(&left_d.add(&right_d.mul(&inner_d)?)?)
}

fn unary_grad(op: UnaryOp, g: &Tensor, x: &Tensor, y: &Tensor) -> Result<Option<Tensor>> {
    use UnaryOp::*;
    let dt = x.dtype();
    Ok(Some(match op {
        Neg => g.neg()?,
        Abs => {
            let pos = gt0(x)?.to_dtype(dt)?;
            let neg = x.binary_scalar(BinaryOp::Lt, 0.0, false)?.to_dtype(dt)?;
            g.mul(&pos.sub(&neg)?)?
        }
        Exp => g.mul(y)?,
        Log => g.div(x)?,
        Log1p => g.div(&add_s(x, 1.0)?)?,
        Expm1 => g.mul(&add_s(y, 1.0)?)?,
        Sqrt => g.div(&mul_s(y, 2.0)?)?,
        Rsqrt => mul_s(g, -0.5)?.mul(&y.mul(y)?.mul(y)?)?,
        Reciprocal => g.neg()?.mul(&y.mul(y)?)?,
        Square => mul_s(g, 2.0)?.mul(x)?,
        Sin => g.mul(&x.cos()?)?,
        Cos => g.mul(&x.sin()?.neg()?)?,
        Tanh => g.mul(&rsub_s(&y.mul(y)?, 1.0)?)?,
        Erf => {
            let e = x.square()?.neg()?.exp()?;
            g.mul(&mul_s(&e, 2.0 / std::f64::consts::PI.sqrt())?)?
        }
        Floor => Tensor::zeros_on(x.dims(), dt, x.device())?,
        Not => return Ok(None),
        Sigmoid => g.mul(&rsub_s(y, 1.0)?)?.mul(y)?,
        Relu => keep(&gt0(y)?, g)?,
        Gelu => gelu_grad(g, x)?,
        GeluTanh => gelu_tanh_grad(g, x)?,
        Silu => {
            let s = x.sigmoid()?;
            g.mul(&s.mul(&add_s(&x.mul(&rsub_s(&s, 1.0)?)?, 1.0)?)?)?
        }
        Softplus { beta, threshold } => {
            let bx = mul_s(x, beta.0)?;
            let over = bx.binary_scalar(BinaryOp::Gt, threshold.0, false)?;
            let z = bx.exp()?;
            let soft = g.mul(&z)?.div(&add_s(&z, 1.0)?)?;
            Tensor::where_(&over, g, &soft)?
        }
        LeakyRelu { slope } => Tensor::where_(&gt0(x)?, g, &mul_s(g, slope.0)?)?,
        Elu { alpha } => {
            let neg = mul_s(&g.mul(&x.exp()?)?, alpha.0)?;
            Tensor::where_(&gt0(x)?, g, &neg)?
        }
        Clamp { .. }
        | Hardtanh { .. }
        | Relu6
        | Hardswish
        | Hardsigmoid
        | Mish
        | Selu
        | Celu { .. }
        | LogSigmoid
        | Softsign
        | Threshold { .. }
        | Hardshrink { .. }
        | Softshrink { .. }
        | Tanhshrink
        | Round { .. }
        | Ceil
        | Trunc
        | Frac
        | Sign
        | IsNan
        | IsInf
        | IsFinite
        | IsPosInf
        | IsNegInf
        | NanToNum { .. }
        | Log2
        | Log10
        | Exp2
        | Sinh
        | Cosh
        | Tan
        | Asin
        | Acos
        | Atan
        | Erfc
        | Erfinv
        | Logit { .. }
        | BitwiseNot => return special::unary_grad(op, g, x, y),
    }))
}

/// Records `y = op(x)`.
pub(crate) fn unary(op: UnaryOp, x: &Tensor, y: Tensor) -> Result<Tensor> {
    if !needs_grad(&[x]) || !y.dtype().is_float() {
        return Ok(y);
    }
    let name = op.name();
    let (sx, sy) = (Saved::new(name, x), Saved::new(name, &y));
    record(name, y, &[x], move |g| {
        Ok(vec![unary_grad(op, g, &sx.get()?, &sy.get()?)?])
    })
}

fn differentiable(op: BinaryOp) -> bool {
    use BinaryOp::*;
    matches!(
        op,
        Add | Sub | Mul | Div | Pow | Maximum | Minimum | Atan2 | Hypot | Copysign | Xlogy
    )
}

/// `where(cond, a, b)` with the ties rule of maximum/minimum: a tie splits the gradient.
fn max_min_grads(op: BinaryOp, g: &Tensor, a: &Tensor, b: &Tensor) -> Result<[Tensor; 2]> {
    let half = mul_s(g, 0.5)?;
    let tie = a.eq(b)?;
    let base = Tensor::where_(&tie, &half, g)?;
    let (a_loses, b_loses) = if op == BinaryOp::Maximum {
        (a.lt(b)?, a.gt(b)?)
    } else {
        (a.gt(b)?, a.lt(b)?)
    };
    Ok([
        base.masked_fill_bcast(&a_loses)?,
        base.masked_fill_bcast(&b_loses)?,
    ])
}

impl Tensor {
    /// `where(mask, 0, self)` with `mask` and `self` broadcast together.
    fn masked_fill_bcast(&self, mask: &Tensor) -> Result<Tensor> {
        Tensor::where_scalar(&mask.logical_not()?, self, 0.0)
    }
}

fn binary_grads(
    op: BinaryOp,
    g: &Tensor,
    a: &Tensor,
    b: &Tensor,
    y: &Tensor,
) -> Result<[Tensor; 2]> {
    use BinaryOp::*;
    Ok(match op {
        Mul => [g.mul(b)?, g.mul(a)?],
        Div => [g.div(b)?, g.neg()?.mul(a)?.div(&b.mul(b)?)?],
        Pow => {
            let b0 = b.binary_scalar(Eq, 0.0, false)?;
            let ga = g.mul(b)?.mul(&a.pow(&add_s(b, -1.0)?)?)?;
            let ga = Tensor::where_scalar(&b0.logical_not()?, &ga, 0.0)?;
            let gb = g.mul(&y.mul(&a.log()?)?)?;
            let a0 = a.binary_scalar(Eq, 0.0, false)?;
            let bpos = b.binary_scalar(Ge, 0.0, false)?;
            let both = Tensor::where_scalar(&a0, &bpos.to_dtype(g.dtype())?, 0.0)?;
            let zero_case = gt0(&both)?;
            [
                ga,
                Tensor::where_scalar(&zero_case.logical_not()?, &gb, 0.0)?,
            ]
        }
        Atan2 | Hypot | Copysign | Xlogy => special::binary_grads(op, g, a, b, y)?,
        _ => max_min_grads(op, g, a, b)?,
    })
}

/// Records `y = a op b` (tensor operands).
pub(crate) fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, y: Tensor) -> Result<Tensor> {
    if !needs_grad(&[a, b]) || !differentiable(op) || !y.dtype().is_float() {
        return Ok(y);
    }
    let name = op.name();
    // add/sub need no saved values (like PyTorch's AddBackward): saving the
    // inputs would keep activations alive until backward for nothing
    if matches!(op, BinaryOp::Add | BinaryOp::Sub) {
        return record(name, y, &[a, b], move |g| {
            let gb = if op == BinaryOp::Sub {
                g.neg()?
            } else {
                g.clone()
            };
            Ok(vec![Some(g.clone()), Some(gb)])
        });
    }
    let (sa, sb) = (Saved::new(name, a), Saved::new(name, b));
    let sy = matches!(op, BinaryOp::Pow | BinaryOp::Hypot | BinaryOp::Copysign)
        .then(|| Saved::new(name, &y));
    record(name, y, &[a, b], move |g| {
        let (a, b) = (sa.get()?, sb.get()?);
        let y = match &sy {
            Some(s) => s.get()?,
            None => a.clone(),
        };
        let [ga, gb] = binary_grads(op, g, &a, &b, &y)?;
        Ok(vec![Some(ga), Some(gb)])
    })
}

/// Records `y = a + alpha * b` (or `a - alpha * b`).
pub(crate) fn add_scaled(
    a: &Tensor,
    b: &Tensor,
    alpha: f64,
    subtract: bool,
    y: Tensor,
) -> Result<Tensor> {
    if !needs_grad(&[a, b]) {
        return Ok(y);
    }
    let k = if subtract { -alpha } else { alpha };
    record(if subtract { "sub" } else { "add" }, y, &[a, b], move |g| {
        Ok(vec![Some(g.clone()), Some(mul_s(g, k)?)])
    })
}

/// Records `y = x op s` (or `s op x` when `reversed`).
pub(crate) fn binary_scalar(
    op: BinaryOp,
    x: &Tensor,
    s: Scalar,
    reversed: bool,
    y: Tensor,
) -> Result<Tensor> {
    use BinaryOp::*;
    if !needs_grad(&[x]) || !differentiable(op) || !y.dtype().is_float() {
        return Ok(y);
    }
    let name = op.name();
    let v = s.value();
    let (sx, sy) = (Saved::new(name, x), Saved::new(name, &y));
    record(name, y, &[x], move |g| {
        let x = sx.get()?;
        let gx = match (op, reversed) {
            (Add, _) => g.clone(),
            (Sub, false) => g.clone(),
            (Sub, true) => g.neg()?,
            (Mul, _) => mul_s(g, v)?,
            (Div, false) => g.binary_scalar(Div, v, false)?,
            (Div, true) => mul_s(&g.neg()?, v)?.div(&x.mul(&x)?)?,
            (Pow, false) if v == 0.0 => Tensor::zeros_on(x.dims(), g.dtype(), g.device())?,
            (Pow, false) => g.mul(&mul_s(&x.binary_scalar(Pow, v - 1.0, false)?, v)?)?,
            (Pow, true) if v == 0.0 => {
                let y = sy.get()?;
                let neg = x.binary_scalar(Lt, 0.0, false)?;
                keep(&neg, &g.mul(&mul_s(&y, v.ln())?)?)?
            }
            (Pow, true) => g.mul(&mul_s(&sy.get()?, v.ln())?)?,
            _ => {
                let sx = Tensor::full(&[], v, x.dtype());
                let (a, b) = if reversed {
                    (sx, x.clone())
                } else {
                    (x.clone(), sx)
                };
                let [ga, gb] = if matches!(op, Atan2 | Hypot | Copysign | Xlogy) {
                    special::binary_grads(op, g, &a, &b, &sy.get()?)?
                } else {
                    max_min_grads(op, g, &a, &b)?
                };
                if reversed {
                    gb
                } else {
                    ga
                }
            }
        };
        Ok(vec![Some(gx)])
    })
}

/// Records `where(cond, a, b)`; `b` is None for a Python-number `other`.
pub(crate) fn where_(cond: &Tensor, a: &Tensor, b: Option<&Tensor>, y: Tensor) -> Result<Tensor> {
    let mut ins = vec![cond, a];
    ins.extend(b);
    if !needs_grad(&ins) || !y.dtype().is_float() {
        return Ok(y);
    }
    let sc = Saved::new("where", cond);
    record("where", y, &ins, move |g| {
        let c = sc.get()?;
        Ok(vec![
            None,
            Some(keep(&c, g)?),
            Some(keep(&c.logical_not()?, g)?),
        ])
    })
}

/// Records `x.masked_fill(mask, v)`.
pub(crate) fn masked_fill(x: &Tensor, mask: &Tensor, y: Tensor) -> Result<Tensor> {
    if !needs_grad(&[x]) || !y.dtype().is_float() {
        return Ok(y);
    }
    let sm = Saved::new("masked_fill", mask);
    record("masked_fill", y, &[x], move |g| {
        Ok(vec![Some(keep(&sm.get()?.logical_not()?, g)?)])
    })
}

/// Records a float-to-float cast (the engine casts the gradient back).
pub(crate) fn cast(x: &Tensor, y: Tensor) -> Result<Tensor> {
    if !needs_grad(&[x]) || !y.dtype().is_float() {
        return Ok(y);
    }
    record("to", y, &[x], |g| Ok(vec![Some(g.clone())]))
}
