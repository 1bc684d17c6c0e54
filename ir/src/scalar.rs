//! Scalar semantics, defined once.
//!
//! [`ScalarOps`] is the small set of primitives every backend implements (the
//! reference interpreter, the Cranelift emitter, later the CUDA C emitter).
//! Every pointwise op of [`crate::op`] — primitives and composites such as gelu
//! or softplus — is lowered onto it by exactly one generic function here
//! ([`lower_unary`], [`lower_binary`]), so all backends share one meaning.

use crate::op::{BinaryOp, UnaryOp};
use crate::DType;

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
    /// Logical and of bools.
    And,
    /// Logical or of bools.
    Or,
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

/// Lowers one unary pointwise op. `dt` is the compute dtype of `x` and of the result.
pub fn lower_unary<S: ScalarOps>(s: &mut S, op: UnaryOp, x: S::V, dt: DType) -> S::V {
    use Prim1 as P;
    use Prim2::*;
    let c = |s: &mut S, v: f64| s.constant(v, dt);
    match op {
        UnaryOp::Neg => s.unary(P::Neg, x, dt),
        UnaryOp::Abs => s.unary(P::Abs, x, dt),
        UnaryOp::Exp => s.unary(P::Exp, x, dt),
        UnaryOp::Log => s.unary(P::Log, x, dt),
        UnaryOp::Log1p => s.unary(P::Log1p, x, dt),
        UnaryOp::Expm1 => s.unary(P::Expm1, x, dt),
        UnaryOp::Sqrt => s.unary(P::Sqrt, x, dt),
        UnaryOp::Sin => s.unary(P::Sin, x, dt),
        UnaryOp::Cos => s.unary(P::Cos, x, dt),
        UnaryOp::Tanh => s.unary(P::Tanh, x, dt),
        UnaryOp::Erf => s.unary(P::Erf, x, dt),
        UnaryOp::Floor => s.unary(P::Floor, x, dt),
        UnaryOp::Not => s.unary(P::Not, x, dt),
        UnaryOp::Rsqrt => {
            let r = s.unary(P::Sqrt, x, dt);
            let one = c(s, 1.0);
            s.binary(Div, one, r, dt)
        }
        UnaryOp::Reciprocal => {
            let one = c(s, 1.0);
            s.binary(Div, one, x, dt)
        }
        UnaryOp::Square => s.binary(Mul, x, x, dt),
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
    }
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
