//! Scalar semantics, defined once.
//!
//! [`ScalarOps`] is the small set of primitives every backend implements (the
//! reference interpreter, the Cranelift emitter, later the CUDA C emitter).
//! Every pointwise op of [`crate::op`] — primitives and composites such as gelu
//! or softplus — is lowered onto it by exactly one generic function here
//! ([`lower_unary`], [`lower_binary`]), so all backends share one meaning.

use crate::op::{BinaryOp, UnaryOp};
use crate::DType;

mod activation;
mod special;

/// Unary primitives a backend must provide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prim1 {
    Neg,
    Abs,
    Sqrt,
    Floor,
    Exp,
    Log,
    Log1p,
    Expm1,
    Tanh,
    Erf,
    Sin,
    Cos,
    /// Logical not of a bool.
    Not,
    Ceil,
    /// Round toward zero.
    Trunc,
    /// Round half to even (`torch.round`, IEEE `nearest`).
    Round,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
}

/// Binary primitives a backend must provide. Operands share one dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prim2 {
    Add,
    Sub,
    Mul,
    /// True division for floats; truncating division for integers (x/0 is 0 for
    /// integers rather than a trap; PyTorch raises, the frontend checks first).
    Div,
    /// NaN-propagating maximum (`torch.maximum`).
    Max,
    /// NaN-propagating minimum.
    Min,
    Pow,
    /// C's fmod / Rust's `%`: the remainder has the sign of the dividend.
    Fmod,
    /// Logical and of bools; bitwise and of integers.
    And,
    /// Logical or of bools; bitwise or of integers.
    Or,
    /// Logical xor of bools; bitwise xor of integers.
    Xor,
    /// `atan2(a, b)` (floats).
    Atan2,
    /// `sqrt(a^2 + b^2)` without overflow (floats).
    Hypot,
}

/// Comparisons; the result is a `Bool` value. Any comparison with NaN is false except `Ne`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// The primitives of scalar semantics. `dt` is the dtype of the operands (a
/// compute dtype: never f16/bf16, those are widened to f32 on load).
pub trait ScalarOps {
    type V: Copy;
    fn constant(&mut self, value: f64, dt: DType) -> Self::V;
    fn unary(&mut self, op: Prim1, x: Self::V, dt: DType) -> Self::V;
    fn binary(&mut self, op: Prim2, a: Self::V, b: Self::V, dt: DType) -> Self::V;
    fn compare(&mut self, op: Cmp, a: Self::V, b: Self::V, dt: DType) -> Self::V;
    /// `cond ? a : b` with `cond` a Bool value and `a`, `b` of dtype `dt`.
    fn select(&mut self, cond: Self::V, a: Self::V, b: Self::V, dt: DType) -> Self::V;
    /// Converts between dtypes with PyTorch's rules: float to int truncates toward
    /// zero, int to narrower int wraps, anything to bool is `!= 0`.
    fn cast(&mut self, x: Self::V, from: DType, to: DType) -> Self::V;
}

/// Lowers one unary pointwise op. `dt` is the compute dtype of `x` and of
/// the result (bool for the predicates: `isnan`, `logical_not`, ...).
pub fn lower_unary<S: ScalarOps>(s: &mut S, op: UnaryOp, x: S::V, dt: DType) -> S::V {
    use Prim1 as P;
    use Prim2::*;
    let prim = match op {
        UnaryOp::Neg => P::Neg,
        UnaryOp::Abs => P::Abs,
        UnaryOp::Exp => P::Exp,
        UnaryOp::Log => P::Log,
        UnaryOp::Log1p => P::Log1p,
        UnaryOp::Expm1 => P::Expm1,
        UnaryOp::Sqrt => P::Sqrt,
        UnaryOp::Sin => P::Sin,
        UnaryOp::Cos => P::Cos,
        UnaryOp::Tanh => P::Tanh,
        UnaryOp::Erf => P::Erf,
        UnaryOp::Floor => P::Floor,
        UnaryOp::Not => P::Not,
        UnaryOp::Ceil => P::Ceil,
        UnaryOp::Trunc => P::Trunc,
        UnaryOp::Sinh => P::Sinh,
        UnaryOp::Cosh => P::Cosh,
        UnaryOp::Tan => P::Tan,
        UnaryOp::Asin => P::Asin,
        UnaryOp::Acos => P::Acos,
        UnaryOp::Atan => P::Atan,
        UnaryOp::Rsqrt => {
            let r = s.unary(P::Sqrt, x, dt);
            let one = s.constant(1.0, dt);
            return s.binary(Div, one, r, dt);
        }
        UnaryOp::Reciprocal => {
            let one = s.constant(1.0, dt);
            return s.binary(Div, one, x, dt);
        }
        UnaryOp::Square => return s.binary(Mul, x, x, dt),
        _ => match activation::lower(s, op, x, dt) {
            Some(v) => return v,
            None => return special::lower(s, op, x, dt),
        },
    };
    s.unary(prim, x, dt)
}

/// `min(max(x, lo), hi)` with NaN kept; an infinite bound is skipped (so it
/// also clamps integers, which have no infinity).
pub(crate) fn clamp<S: ScalarOps>(s: &mut S, x: S::V, lo: f64, hi: f64, dt: DType) -> S::V {
    let mut x = x;
    if lo.is_nan() || hi.is_nan() {
        // a NaN bound makes every element NaN, as the maximum with it does
        let l = s.constant(lo, dt);
        let h = s.constant(hi, dt);
        x = s.binary(Prim2::Max, x, l, dt);
        return s.binary(Prim2::Min, x, h, dt);
    }
    // A compare and a select against the bound give the NaN-propagating
    // maximum's bits (a NaN `x` fails the compare and is kept; at a +0 bound
    // `<=` turns -0 into +0, as max(-0, +0) = +0), and on the CPU they are two
    // vector instructions where a vector fmax is about seven: hardswish ran
    // at 0.27 ns an element.
    if lo != f64::NEG_INFINITY {
        let below = match lo == 0.0 && lo.is_sign_positive() {
            true => Cmp::Le,
            false => Cmp::Lt,
        };
        x = replace_where(s, below, x, lo, dt);
    }
    if hi != f64::INFINITY {
        // at a -0 bound `>=` turns +0 into -0, as min(+0, -0) = -0
        let above = match hi == 0.0 && hi.is_sign_negative() {
            true => Cmp::Ge,
            false => Cmp::Gt,
        };
        x = replace_where(s, above, x, hi, dt);
    }
    x
}

/// `bound` where `x cmp bound`, else `x`.
fn replace_where<S: ScalarOps>(s: &mut S, cmp: Cmp, x: S::V, bound: f64, dt: DType) -> S::V {
    let b = s.constant(bound, dt);
    let c = s.compare(cmp, x, b, dt);
    s.select(c, b, x, dt)
}

/// Lowers one binary pointwise op. `dt` is the compute dtype of both operands;
/// comparisons return Bool values.
pub fn lower_binary<S: ScalarOps>(s: &mut S, op: BinaryOp, a: S::V, b: S::V, dt: DType) -> S::V {
    use Prim2::*;
    match op {
        BinaryOp::Add => s.binary(Add, a, b, dt),
        BinaryOp::Sub => s.binary(Sub, a, b, dt),
        BinaryOp::Mul => s.binary(Mul, a, b, dt),
        BinaryOp::Div => s.binary(Div, a, b, dt),
        BinaryOp::Pow => s.binary(Pow, a, b, dt),
        BinaryOp::Maximum => s.binary(Max, a, b, dt),
        BinaryOp::Minimum => s.binary(Min, a, b, dt),
        BinaryOp::Fmod => s.binary(Fmod, a, b, dt),
        BinaryOp::And => s.binary(And, a, b, dt),
        BinaryOp::Or => s.binary(Or, a, b, dt),
        BinaryOp::Xor => s.binary(Xor, a, b, dt),
        BinaryOp::BitwiseAnd => s.binary(And, a, b, dt),
        BinaryOp::BitwiseOr => s.binary(Or, a, b, dt),
        BinaryOp::BitwiseXor => s.binary(Xor, a, b, dt),
        BinaryOp::Atan2 => s.binary(Atan2, a, b, dt),
        BinaryOp::Hypot => s.binary(Hypot, a, b, dt),
        BinaryOp::Copysign | BinaryOp::Xlogy => special::lower_binary(s, op, a, b, dt),
        BinaryOp::Eq => s.compare(Cmp::Eq, a, b, dt),
        BinaryOp::Ne => s.compare(Cmp::Ne, a, b, dt),
        BinaryOp::Lt => s.compare(Cmp::Lt, a, b, dt),
        BinaryOp::Le => s.compare(Cmp::Le, a, b, dt),
        BinaryOp::Gt => s.compare(Cmp::Gt, a, b, dt),
        BinaryOp::Ge => s.compare(Cmp::Ge, a, b, dt),
        // Python's %: the remainder takes the sign of the divisor.
        BinaryOp::Remainder => {
            let r = s.binary(Fmod, a, b, dt);
            let zero = s.constant(0.0, dt);
            let nonzero = s.compare(Cmp::Ne, r, zero, dt);
            let r_neg = s.compare(Cmp::Lt, r, zero, dt);
            let b_neg = s.compare(Cmp::Lt, b, zero, dt);
            let differ = s.compare(Cmp::Ne, r_neg, b_neg, DType::Bool);
            let fix = s.binary(And, nonzero, differ, DType::Bool);
            let shifted = s.binary(Add, r, b, dt);
            s.select(fix, shifted, r, dt)
        }
        // Python's //: rounds toward negative infinity.
        BinaryOp::FloorDiv => {
            if dt.is_float() {
                // PyTorch's div_floor: (a - fmod(a, b)) / b, corrected by one when the
                // signs differ, then rounded to the nearest integer to absorb the
                // division's rounding (floor, plus one above .5): the quotient is an
                // integer up to rounding, and can land an ulp below it.
                let m = s.binary(Fmod, a, b, dt);
                let am = s.binary(Sub, a, m, dt);
                let q = s.binary(Div, am, b, dt);
                let zero = s.constant(0.0, dt);
                let nonzero = s.compare(Cmp::Ne, m, zero, dt);
                let m_neg = s.compare(Cmp::Lt, m, zero, dt);
                let b_neg = s.compare(Cmp::Lt, b, zero, dt);
                let differ = s.compare(Cmp::Ne, m_neg, b_neg, DType::Bool);
                let fix = s.binary(And, nonzero, differ, DType::Bool);
                let one = s.constant(1.0, dt);
                let q1 = s.binary(Sub, q, one, dt);
                let q = s.select(fix, q1, q, dt);
                let f = s.unary(Prim1::Floor, q, dt);
                let frac = s.binary(Sub, q, f, dt);
                let half = s.constant(0.5, dt);
                let up = s.compare(Cmp::Gt, frac, half, dt);
                let f1 = s.binary(Add, f, one, dt);
                let floored = s.select(up, f1, f, dt);
                // PyTorch's div_floor_floating: a zero quotient keeps the sign
                // of a / b (copysign(0, a / b)), and a zero divisor gives the
                // IEEE a / b (inf, -inf or nan by sign) rather than fmod's nan
                let exact = s.binary(Div, a, b, dt);
                let q_zero = s.compare(Cmp::Eq, q, zero, dt);
                let signed_zero = s.binary(Mul, exact, zero, dt);
                let r = s.select(q_zero, signed_zero, floored, dt);
                let b_zero = s.compare(Cmp::Eq, b, zero, dt);
                s.select(b_zero, exact, r, dt)
            } else {
                let q = s.binary(Div, a, b, dt);
                let r = s.binary(Fmod, a, b, dt);
                let zero = s.constant(0.0, dt);
                let nonzero = s.compare(Cmp::Ne, r, zero, dt);
                let r_neg = s.compare(Cmp::Lt, r, zero, dt);
                let b_neg = s.compare(Cmp::Lt, b, zero, dt);
                let differ = s.compare(Cmp::Ne, r_neg, b_neg, DType::Bool);
                let fix = s.binary(And, nonzero, differ, DType::Bool);
                let one = s.constant(1.0, dt);
                let q1 = s.binary(Sub, q, one, dt);
                s.select(fix, q1, q, dt)
            }
        }
    }
}
