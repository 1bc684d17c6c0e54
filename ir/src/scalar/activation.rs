//! The activations' scalar meaning (relu, gelu, softplus, hardswish, ...),
//! lowered onto the primitives of [`super::ScalarOps`] like every op.

use super::{clamp, Cmp, Prim1 as P, Prim2::*, ScalarOps};
use crate::op::UnaryOp;
use crate::DType;

/// SELU's constants (PyTorch's, to f64 precision).
const SELU_ALPHA: f64 = 1.673_263_242_354_377_3;
const SELU_SCALE: f64 = 1.050_700_987_355_480_5;

/// `x <= 0 ? expm1(x * in_scale) * neg_scale : x * pos_scale`: PyTorch's
/// ELU kernel, shared by elu, selu and celu.
fn elu_like<S: ScalarOps>(
    s: &mut S,
    x: S::V,
    in_scale: f64,
    neg_scale: f64,
    pos_scale: f64,
    dt: DType,
) -> S::V {
    let zero = s.constant(0.0, dt);
    let pos = s.compare(Cmp::Gt, x, zero, dt);
    let xi = if in_scale == 1.0 {
        x
    } else {
        let k = s.constant(in_scale, dt);
        s.binary(Mul, x, k, dt)
    };
    let e = s.unary(P::Expm1, xi, dt);
    let k = s.constant(neg_scale, dt);
    let neg = s.binary(Mul, e, k, dt);
    let p = if pos_scale == 1.0 {
        x
    } else {
        let k = s.constant(pos_scale, dt);
        s.binary(Mul, x, k, dt)
    };
    s.select(pos, p, neg, dt)
}

/// The activation `op`, or `None` when `op` is not one.
pub(super) fn lower<S: ScalarOps>(s: &mut S, op: UnaryOp, x: S::V, dt: DType) -> Option<S::V> {
    let c = |s: &mut S, v: f64| s.constant(v, dt);
    Some(match op {
        // relu(NaN) is NaN in PyTorch: select on `x < 0` keeps NaN.
        UnaryOp::Relu => {
            let zero = c(s, 0.0);
            let neg = s.compare(Cmp::Lt, x, zero, dt);
            s.select(neg, zero, x, dt)
        }
        // 1 / (1 + exp(-x)): saturates to exactly 0 and 1 without NaN.
        UnaryOp::Sigmoid => {
            let nx = s.unary(P::Neg, x, dt);
            let e = s.unary(P::Exp, nx, dt);
            let one = c(s, 1.0);
            let d = s.binary(Add, one, e, dt);
            s.binary(Div, one, d, dt)
        }
        // x / (1 + exp(-x)), PyTorch's formulation.
        UnaryOp::Silu => {
            let nx = s.unary(P::Neg, x, dt);
            let e = s.unary(P::Exp, nx, dt);
            let one = c(s, 1.0);
            let d = s.binary(Add, one, e, dt);
            s.binary(Div, x, d, dt)
        }
        // x * 0.5 * (1 + erf(x / sqrt 2))
        UnaryOp::Gelu => {
            let k = c(s, std::f64::consts::FRAC_1_SQRT_2);
            let u = s.binary(Mul, x, k, dt);
            let e = s.unary(P::Erf, u, dt);
            let one = c(s, 1.0);
            let t = s.binary(Add, one, e, dt);
            let half = c(s, 0.5);
            let hx = s.binary(Mul, x, half, dt);
            s.binary(Mul, hx, t, dt)
        }
        // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
        UnaryOp::GeluTanh => {
            let x2 = s.binary(Mul, x, x, dt);
            let x3 = s.binary(Mul, x2, x, dt);
            let k1 = c(s, 0.044715);
            let a = s.binary(Mul, x3, k1, dt);
            let inner = s.binary(Add, x, a, dt);
            let k0 = c(s, (2.0 / std::f64::consts::PI).sqrt());
            let u = s.binary(Mul, inner, k0, dt);
            let t = s.unary(P::Tanh, u, dt);
            let one = c(s, 1.0);
            let t1 = s.binary(Add, one, t, dt);
            let half = c(s, 0.5);
            let hx = s.binary(Mul, x, half, dt);
            s.binary(Mul, hx, t1, dt)
        }
        // x*beta > threshold ? x : log1p(exp(x*beta)) / beta
        UnaryOp::Softplus { beta, threshold } => {
            let b = c(s, beta.0);
            let xb = s.binary(Mul, x, b, dt);
            let th = c(s, threshold.0);
            let big = s.compare(Cmp::Gt, xb, th, dt);
            let e = s.unary(P::Exp, xb, dt);
            let l = s.unary(P::Log1p, e, dt);
            let soft = s.binary(Div, l, b, dt);
            s.select(big, x, soft, dt)
        }
        // x > 0 ? x : x * slope
        UnaryOp::LeakyRelu { slope } => {
            let zero = c(s, 0.0);
            let pos = s.compare(Cmp::Gt, x, zero, dt);
            let k = c(s, slope.0);
            let neg = s.binary(Mul, x, k, dt);
            s.select(pos, x, neg, dt)
        }
        // x > 0 ? x : alpha * expm1(x)
        UnaryOp::Elu { alpha } => {
            let zero = c(s, 0.0);
            let pos = s.compare(Cmp::Gt, x, zero, dt);
            let e = s.unary(P::Expm1, x, dt);
            let k = c(s, alpha.0);
            let neg = s.binary(Mul, e, k, dt);
            s.select(pos, x, neg, dt)
        }
        _ => return lower_more(s, op, x, dt),
    })
}

/// The activations added with the op table: clamps, hard* and the shrinks,
/// mish, selu, celu, logsigmoid, softsign.
fn lower_more<S: ScalarOps>(s: &mut S, op: UnaryOp, x: S::V, dt: DType) -> Option<S::V> {
    let c = |s: &mut S, v: f64| s.constant(v, dt);
    Some(match op {
        UnaryOp::Clamp { min, max } => clamp(s, x, min.0, max.0, dt),
        UnaryOp::Hardtanh { min_val, max_val } => clamp(s, x, min_val.0, max_val.0, dt),
        UnaryOp::Relu6 => clamp(s, x, 0.0, 6.0, dt),
        // x * min(max(x + 3, 0), 6) / 6, in PyTorch's order
        UnaryOp::Hardswish | UnaryOp::Hardsigmoid => {
            let three = c(s, 3.0);
            let t = s.binary(Add, x, three, dt);
            let r = clamp(s, t, 0.0, 6.0, dt);
            let six = c(s, 6.0);
            if op == UnaryOp::Hardswish {
                let xr = s.binary(Mul, x, r, dt);
                s.binary(Div, xr, six, dt)
            } else {
                s.binary(Div, r, six, dt)
            }
        }
        // x * tanh(log1p(exp(x)))
        UnaryOp::Mish => {
            let e = s.unary(P::Exp, x, dt);
            let sp = s.unary(P::Log1p, e, dt);
            let t = s.unary(P::Tanh, sp, dt);
            s.binary(Mul, x, t, dt)
        }
        UnaryOp::Selu => elu_like(s, x, 1.0, SELU_ALPHA * SELU_SCALE, SELU_SCALE, dt),
        UnaryOp::Celu { alpha } => elu_like(s, x, 1.0 / alpha.0, alpha.0, 1.0, dt),
        // min(x, 0) - log1p(exp(-|x|)): no overflow either side
        UnaryOp::LogSigmoid => {
            let zero = c(s, 0.0);
            let m = s.binary(Min, x, zero, dt);
            let a = s.unary(P::Abs, x, dt);
            let na = s.unary(P::Neg, a, dt);
            let e = s.unary(P::Exp, na, dt);
            let l = s.unary(P::Log1p, e, dt);
            s.binary(Sub, m, l, dt)
        }
        UnaryOp::Softsign => {
            let a = s.unary(P::Abs, x, dt);
            let one = c(s, 1.0);
            let d = s.binary(Add, one, a, dt);
            s.binary(Div, x, d, dt)
        }
        // x <= threshold ? value : x (NaN passes through)
        UnaryOp::Threshold { threshold, value } => {
            let th = c(s, threshold.0);
            let below = s.compare(Cmp::Le, x, th, dt);
            let v = c(s, value.0);
            s.select(below, v, x, dt)
        }
        // -lambd <= x <= lambd ? 0 : x
        UnaryOp::Hardshrink { lambd } => {
            let hi = c(s, lambd.0);
            let lo = c(s, -lambd.0);
            let ge = s.compare(Cmp::Ge, x, lo, dt);
            let le = s.compare(Cmp::Le, x, hi, dt);
            let inside = s.binary(And, ge, le, DType::Bool);
            let zero = c(s, 0.0);
            s.select(inside, zero, x, dt)
        }
        // x > l ? x - l : (x < -l ? x + l : x * 0)
        UnaryOp::Softshrink { lambd } => {
            let l = c(s, lambd.0);
            let nl = c(s, -lambd.0);
            let above = s.compare(Cmp::Gt, x, l, dt);
            let below = s.compare(Cmp::Lt, x, nl, dt);
            let down = s.binary(Sub, x, l, dt);
            let up = s.binary(Add, x, l, dt);
            let zero = c(s, 0.0);
            let mid = s.binary(Mul, x, zero, dt);
            let r = s.select(below, up, mid, dt);
            s.select(above, down, r, dt)
        }
        UnaryOp::Tanhshrink => {
            let t = s.unary(P::Tanh, x, dt);
            s.binary(Sub, x, t, dt)
        }
        _ => return None,
    })
}
