//! The scalar meaning of rounding, predicates (`isnan`, ...), `nan_to_num`
//! and the special functions built from primitives (log2, erfc, erfinv,
//! logit), lowered onto [`super::ScalarOps`].

use super::{clamp, Cmp, Prim1 as P, Prim2::*, ScalarOps};
use crate::op::{BinaryOp, UnaryOp};
use crate::DType;

/// Every unary op neither primitive nor an activation.
pub(super) fn lower<S: ScalarOps>(s: &mut S, op: UnaryOp, x: S::V, dt: DType) -> S::V {
    let c = |s: &mut S, v: f64| s.constant(v, dt);
    match op {
        UnaryOp::Round { decimals } => round(s, x, decimals.0, dt),
        UnaryOp::Frac => {
            let t = s.unary(P::Trunc, x, dt);
            s.binary(Sub, x, t, dt)
        }
        // (0 < x) - (x < 0): zero and NaN give 0
        UnaryOp::Sign if dt == DType::Bool => x,
        UnaryOp::Sign => {
            let zero = c(s, 0.0);
            let one = c(s, 1.0);
            let m1 = c(s, -1.0);
            let pos = s.compare(Cmp::Gt, x, zero, dt);
            let neg = s.compare(Cmp::Lt, x, zero, dt);
            let r = s.select(neg, m1, zero, dt);
            s.select(pos, one, r, dt)
        }
        UnaryOp::IsNan | UnaryOp::IsInf | UnaryOp::IsFinite => predicate(s, op, x, dt),
        UnaryOp::IsPosInf | UnaryOp::IsNegInf => predicate(s, op, x, dt),
        UnaryOp::NanToNum { .. } if !dt.is_float() => x,
        UnaryOp::NanToNum {
            nan,
            posinf,
            neginf,
        } => {
            let is_nan = s.compare(Cmp::Ne, x, x, dt);
            let v = c(s, nan.0);
            let r = s.select(is_nan, v, x, dt);
            let inf = c(s, f64::INFINITY);
            let is_pos = s.compare(Cmp::Eq, x, inf, dt);
            let v = c(s, posinf.0);
            let r = s.select(is_pos, v, r, dt);
            let ninf = c(s, f64::NEG_INFINITY);
            let is_neg = s.compare(Cmp::Eq, x, ninf, dt);
            let v = c(s, neginf.0);
            s.select(is_neg, v, r, dt)
        }
        UnaryOp::Log2 | UnaryOp::Log10 => {
            let l = s.unary(P::Log, x, dt);
            let base = if op == UnaryOp::Log2 { 2.0f64 } else { 10.0 };
            let k = c(s, base.ln());
            s.binary(Div, l, k, dt)
        }
        UnaryOp::Exp2 => {
            let two = c(s, 2.0);
            s.binary(Pow, two, x, dt)
        }
        UnaryOp::Erfc => {
            let e = s.unary(P::Erf, x, dt);
            let one = c(s, 1.0);
            s.binary(Sub, one, e, dt)
        }
        UnaryOp::Erfinv => erfinv(s, x, dt),
        // log(x / (1 - x)), x clamped to [eps, 1 - eps] first when eps >= 0
        UnaryOp::Logit { eps } => {
            let x = if eps.0 >= 0.0 {
                clamp(s, x, eps.0, 1.0 - eps.0, dt)
            } else {
                x
            };
            let one = c(s, 1.0);
            let d = s.binary(Sub, one, x, dt);
            let q = s.binary(Div, x, d, dt);
            s.unary(P::Log, q, dt)
        }
        UnaryOp::BitwiseNot if dt == DType::Bool => s.unary(P::Not, x, dt),
        UnaryOp::BitwiseNot => {
            let ones = c(s, -1.0);
            s.binary(Xor, x, ones, dt)
        }
        other => unreachable!("{other} is lowered by lower_unary or the activations"),
    }
}

/// Round half to even at `decimals` digits, as PyTorch: `round(x * 10^d) /
/// 10^d`, or `round(x / 10^-d) * 10^-d` for negative `d`.
fn round<S: ScalarOps>(s: &mut S, x: S::V, decimals: f64, dt: DType) -> S::V {
    if decimals == 0.0 {
        return s.unary(P::Round, x, dt);
    }
    let k = s.constant(10f64.powf(decimals.abs()), dt);
    let (scale, unscale) = if decimals > 0.0 {
        (Mul, Div)
    } else {
        (Div, Mul)
    };
    let y = s.binary(scale, x, k, dt);
    let r = s.unary(P::Round, y, dt);
    s.binary(unscale, r, k, dt)
}

/// isnan, isinf, isfinite, isposinf, isneginf as 1 or 0 in `dt` (the
/// compute dtype, like every unary result; the kernel casts it to bool).
/// Integers are always finite.
fn predicate<S: ScalarOps>(s: &mut S, op: UnaryOp, x: S::V, dt: DType) -> S::V {
    if !dt.is_float() {
        let v = matches!(op, UnaryOp::IsFinite) as u8 as f64;
        return s.constant(v, dt);
    }
    let inf = s.constant(f64::INFINITY, dt);
    let cond = match op {
        UnaryOp::IsNan => s.compare(Cmp::Ne, x, x, dt),
        UnaryOp::IsInf => {
            let a = s.unary(P::Abs, x, dt);
            s.compare(Cmp::Eq, a, inf, dt)
        }
        UnaryOp::IsFinite => {
            let a = s.unary(P::Abs, x, dt);
            s.compare(Cmp::Lt, a, inf, dt)
        }
        UnaryOp::IsPosInf => s.compare(Cmp::Eq, x, inf, dt),
        _ => {
            let ninf = s.constant(f64::NEG_INFINITY, dt);
            s.compare(Cmp::Eq, x, ninf, dt)
        }
    };
    let one = s.constant(1.0, dt);
    let zero = s.constant(0.0, dt);
    s.select(cond, one, zero, dt)
}

/// `p(w)` by Horner's rule, coefficients from the highest degree.
fn horner<S: ScalarOps>(s: &mut S, w: S::V, coeffs: &[f64], dt: DType) -> S::V {
    let mut p = s.constant(coeffs[0], dt);
    for &k in &coeffs[1..] {
        let pw = s.binary(Mul, p, w, dt);
        let kc = s.constant(k, dt);
        p = s.binary(Add, kc, pw, dt);
    }
    p
}

/// The inverse error function: M. Giles' single-precision approximation
/// ("Approximating the erfinv function", GPU Computing Gems, 2011), in two
/// branches on `w = -log((1 - x)(1 + x))`; `erfinv(+-1) = +-inf`, NaN
/// outside [-1, 1].
fn erfinv<S: ScalarOps>(s: &mut S, x: S::V, dt: DType) -> S::V {
    const CENTRAL: [f64; 9] = [
        2.810_226_36e-08,
        3.432_739_39e-07,
        -3.523_387_7e-06,
        -4.391_506_54e-06,
        0.000_218_580_87,
        -0.001_253_725_03,
        -0.004_177_681_64,
        0.246_640_727,
        1.501_409_41,
    ];
    const TAIL: [f64; 9] = [
        -0.000_200_214_257,
        0.000_100_950_558,
        0.001_349_343_22,
        -0.003_673_428_44,
        0.005_739_507_73,
        -0.007_622_461_3,
        0.009_438_870_47,
        1.001_674_06,
        2.832_976_82,
    ];
    let one = s.constant(1.0, dt);
    let a = s.binary(Sub, one, x, dt);
    let b = s.binary(Add, one, x, dt);
    let ab = s.binary(Mul, a, b, dt);
    let l = s.unary(P::Log, ab, dt);
    let w = s.unary(P::Neg, l, dt);
    let k = s.constant(2.5, dt);
    let wc = s.binary(Sub, w, k, dt);
    let central = horner(s, wc, &CENTRAL, dt);
    let r = s.unary(P::Sqrt, w, dt);
    let k = s.constant(3.0, dt);
    let wt = s.binary(Sub, r, k, dt);
    let tail = horner(s, wt, &TAIL, dt);
    let five = s.constant(5.0, dt);
    let small = s.compare(Cmp::Lt, w, five, dt);
    let p = s.select(small, central, tail, dt);
    let y = s.binary(Mul, p, x, dt);
    // at |x| = 1 the tail polynomial overflows with the wrong sign
    let ax = s.unary(P::Abs, x, dt);
    let edge = s.compare(Cmp::Eq, ax, one, dt);
    let inf = s.constant(f64::INFINITY, dt);
    let yi = s.binary(Mul, x, inf, dt);
    s.select(edge, yi, y, dt)
}

/// copysign and xlogy, built from primitives.
pub(super) fn lower_binary<S: ScalarOps>(
    s: &mut S,
    op: BinaryOp,
    a: S::V,
    b: S::V,
    dt: DType,
) -> S::V {
    match op {
        // |a| negated when b's sign bit is set (b < 0, or b is -0: 1/b < 0)
        BinaryOp::Copysign => {
            let zero = s.constant(0.0, dt);
            let one = s.constant(1.0, dt);
            let lt = s.compare(Cmp::Lt, b, zero, dt);
            let is0 = s.compare(Cmp::Eq, b, zero, dt);
            let inv = s.binary(Div, one, b, dt);
            let inv_neg = s.compare(Cmp::Lt, inv, zero, dt);
            let neg0 = s.binary(And, is0, inv_neg, DType::Bool);
            let neg = s.binary(Or, lt, neg0, DType::Bool);
            let m = s.unary(P::Abs, a, dt);
            let nm = s.unary(P::Neg, m, dt);
            s.select(neg, nm, m, dt)
        }
        // isnan(b) ? b : (a == 0 ? 0 : a * log(b))
        BinaryOp::Xlogy => {
            let zero = s.constant(0.0, dt);
            let l = s.unary(P::Log, b, dt);
            let p = s.binary(Mul, a, l, dt);
            let a0 = s.compare(Cmp::Eq, a, zero, dt);
            let r = s.select(a0, zero, p, dt);
            let nan = s.compare(Cmp::Ne, b, b, dt);
            s.select(nan, b, r, dt)
        }
        other => unreachable!("{other} is lowered by lower_binary"),
    }
}
