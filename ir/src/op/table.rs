//! The pointwise op table: every unary and binary op is declared once here,
//! as one line of [`unary_ops!`] / [`binary_ops!`].
//!
//! An entry gives the op's variant (with its `Float` attributes: field name,
//! text-form name and PyTorch's default), its text name, its dtype rule and
//! the input domain the random tests draw from. The macros derive the enum,
//! `name()`, the text form (`Display`, [`UnaryOp::attrs`],
//! [`UnaryOp::from_text`]), the dtype rule inference applies, and the
//! `EXAMPLES` / `ALL` lists every corpus, differential and backend test
//! iterates — so an op cannot be missing from a test list. What an op
//! *computes* lives in [`crate::scalar::lower_unary`] (one meaning for the
//! interpreter, Cranelift and CUDA C) and its gradient in the frontend's
//! autograd rules; both are exhaustive matches, so a new entry that lacks
//! either does not compile.

use super::Float;
use std::fmt;

/// How a unary op's result dtype follows its input's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryDtype {
    /// The input's dtype (integers stay integers).
    Keep,
    /// As `Keep`, but a bool input is an error (negation).
    KeepNoBool,
    /// Floating result: integer and bool inputs compute in f32.
    Float,
    /// A bool result computed in the input's dtype (`logical_not`, `isnan`).
    Bool,
    /// Integer or bool inputs only (bitwise ops); the dtype is kept.
    Integer,
}

/// How a binary op's operands promote and what dtype it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryDtype {
    /// PyTorch's promotion of the two operands.
    Promote,
    /// As `Promote`, but two bools are an error (subtraction).
    PromoteNoBool,
    /// As `Promote`, but integer operands compute in f32 (true division).
    TrueDiv,
    /// Floating-only ops (`atan2`, `hypot`): integer operands compute in f32.
    FloatOnly,
    /// Always f64 (`float_power`).
    F64,
    /// A bool result, computed in the promoted dtype (comparisons).
    Compare,
    /// Bool operands and result (`logical_and`).
    Logical,
    /// Integer or bool operands only (`bitwise_and`).
    Integer,
}

/// The inputs random tests (the differential generator, the corpus tests)
/// feed an op, so its result is finite and well conditioned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Domain {
    /// Any finite value.
    Any,
    /// Strictly positive values (log, sqrt, reciprocal).
    Positive,
    /// Non-negative values.
    NonNegative,
    /// Values at most 3 (exp-like growth).
    Capped,
    /// Values strictly inside (-1, 1) (asin, erfinv).
    Unit,
    /// Values strictly inside (0, 1) (logit).
    Probability,
    /// Bool operands only (not drawn for float graphs).
    Bool,
    /// Any value, but the op jumps (round, sign, threshold): the random
    /// graphs of the differential test leave it to the corpus tests.
    Jump,
    /// Integer operands only.
    Integer,
    /// Second operand strictly positive (division, remainders).
    PositiveRhs,
    /// Positive base, small exponent (pow).
    PowLike,
}

macro_rules! unary_ops {
    ($( $(#[$doc:meta])* $var:ident $({ $($field:ident / $text:literal = $def:expr),* $(,)? })?
        => $name:literal, $dt:ident, $dom:ident; )*) => {
        /// Unary pointwise ops (primitives and composites; see
        /// [`crate::scalar::lower_unary`]), declared in `op/table.rs`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum UnaryOp {
            $( $(#[$doc])* $var $({ $($field: Float),* })?, )*
        }

        impl UnaryOp {
            /// One of each unary op, parameterised ones with PyTorch's
            /// defaults, in table order: what every test list iterates.
            pub const EXAMPLES: [UnaryOp; [$($name),*].len()] =
                [ $( UnaryOp::$var $({ $($field: Float($def)),* })?, )* ];

            /// The op's name in the text form (and in error messages).
            pub fn name(&self) -> &'static str {
                match self { $( UnaryOp::$var { .. } => $name, )* }
            }

            /// The table's dtype rule (applied by [`crate::op::infer::unary`]).
            pub fn dtype_rule(&self) -> UnaryDtype {
                match self { $( UnaryOp::$var { .. } => UnaryDtype::$dt, )* }
            }

            /// The inputs random tests draw for this op.
            pub fn domain(&self) -> Domain {
                match self { $( UnaryOp::$var { .. } => Domain::$dom, )* }
            }

            /// The attributes as `(field, text-form name, value)`, in
            /// declaration order.
            #[allow(unused_variables)]
            pub fn attrs(&self) -> Vec<(&'static str, &'static str, Float)> {
                match *self {
                    $( UnaryOp::$var $({ $($field),* })? =>
                        vec![ $($( (stringify!($field), $text, $field) ),*)? ], )*
                }
            }

            /// The op called `name` in the text form, its attributes read
            /// with `attr(text_name)`; `None` when no unary op has that name.
            #[allow(unused_mut, unused_variables)]
            pub fn from_text(
                name: &str,
                mut attr: impl FnMut(&'static str) -> crate::Result<Float>,
            ) -> Option<crate::Result<UnaryOp>> {
                match name {
                    $( $name => Some((|| -> crate::Result<UnaryOp> {
                        Ok(UnaryOp::$var $({ $($field: attr($text)?),* })?)
                    })()), )*
                    _ => None,
                }
            }
        }
    };
}

macro_rules! binary_ops {
    ($( $(#[$doc:meta])* $var:ident => $name:literal, $dt:ident, $dom:ident; )*) => {
        /// Binary pointwise ops (see [`crate::scalar::lower_binary`]),
        /// declared in `op/table.rs`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum BinaryOp {
            $( $(#[$doc])* $var, )*
        }

        impl BinaryOp {
            /// Every binary op, in table order.
            pub const ALL: [BinaryOp; [$($name),*].len()] = [ $( BinaryOp::$var, )* ];

            /// The op's name in the text form.
            pub fn name(&self) -> &'static str {
                match self { $( BinaryOp::$var => $name, )* }
            }

            /// The table's dtype rule (applied by [`crate::op::infer::binary`]).
            pub fn dtype_rule(&self) -> BinaryDtype {
                match self { $( BinaryOp::$var => BinaryDtype::$dt, )* }
            }

            /// The operands random tests draw for this op.
            pub fn domain(&self) -> Domain {
                match self { $( BinaryOp::$var => Domain::$dom, )* }
            }

            /// The op called `name` in the text form.
            pub fn from_name(name: &str) -> Option<BinaryOp> {
                match name { $( $name => Some(BinaryOp::$var), )* _ => None }
            }
        }
    };
}

unary_ops! {
    Neg => "neg", KeepNoBool, Any;
    Abs => "abs", Keep, Any;
    Exp => "exp", Float, Capped;
    Log => "log", Float, Positive;
    Log1p => "log1p", Float, NonNegative;
    Expm1 => "expm1", Float, Capped;
    Sqrt => "sqrt", Float, Positive;
    Rsqrt => "rsqrt", Float, Positive;
    Reciprocal => "reciprocal", Float, Positive;
    Square => "square", Keep, Any;
    Sin => "sin", Float, Any;
    Cos => "cos", Float, Any;
    Tanh => "tanh", Float, Any;
    Erf => "erf", Float, Any;
    Floor => "floor", Float, Any;
    /// Logical not (any dtype; the result is bool).
    Not => "logical_not", Bool, Bool;
    Sigmoid => "sigmoid", Float, Any;
    Relu => "relu", Keep, Any;
    Gelu => "gelu", Float, Any;
    GeluTanh => "gelu_tanh", Float, Any;
    Silu => "silu", Float, Any;
    Softplus { beta / "beta" = 1.0, threshold / "threshold" = 20.0 } => "softplus", Float, Any;
    LeakyRelu { slope / "negative_slope" = 0.01 } => "leaky_relu", Float, Any;
    Elu { alpha / "alpha" = 1.0 } => "elu", Float, Any;
    /// `min(max(x, min), max)`; an infinite bound is no bound (so integer
    /// tensors clamp to one side too). NaN stays NaN.
    Clamp { max / "max" = f64::INFINITY, min / "min" = f64::NEG_INFINITY } => "clamp", Keep, Any;
    Hardtanh { max_val / "max_val" = 1.0, min_val / "min_val" = -1.0 } => "hardtanh", Float, Any;
    Relu6 => "relu6", Float, Any;
    Hardswish => "hardswish", Float, Any;
    Hardsigmoid => "hardsigmoid", Float, Any;
    Mish => "mish", Float, Any;
    Selu => "selu", Float, Any;
    Celu { alpha / "alpha" = 1.0 } => "celu", Float, Any;
    LogSigmoid => "logsigmoid", Float, Any;
    Softsign => "softsign", Float, Any;
    /// `x > threshold ? x : value`.
    Threshold { threshold / "threshold" = 0.0, value / "value" = 0.0 } => "threshold", Float, Jump;
    Hardshrink { lambd / "lambd" = 0.5 } => "hardshrink", Float, Jump;
    Softshrink { lambd / "lambd" = 0.5 } => "softshrink", Float, Any;
    Tanhshrink => "tanhshrink", Float, Any;
    /// Round half to even at `decimals` decimal digits (negative: tens, ...).
    Round { decimals / "decimals" = 0.0 } => "round", Float, Jump;
    Ceil => "ceil", Float, Jump;
    Trunc => "trunc", Float, Jump;
    Frac => "frac", Float, Jump;
    /// -1, 0 or 1 (NaN gives 0, as in PyTorch).
    Sign => "sign", Keep, Jump;
    IsNan => "isnan", Bool, Jump;
    IsInf => "isinf", Bool, Jump;
    IsFinite => "isfinite", Bool, Jump;
    IsPosInf => "isposinf", Bool, Jump;
    IsNegInf => "isneginf", Bool, Jump;
    /// NaN, +inf and -inf replaced (the frontend resolves PyTorch's `None`
    /// to the dtype's largest and lowest finite values).
    NanToNum { nan / "nan" = 0.0, neginf / "neginf" = -3.4028234663852886e38, posinf / "posinf" = 3.4028234663852886e38 } => "nan_to_num", Keep, Any;
    Log2 => "log2", Float, Positive;
    Log10 => "log10", Float, Positive;
    Exp2 => "exp2", Float, Capped;
    Sinh => "sinh", Float, Capped;
    Cosh => "cosh", Float, Capped;
    Tan => "tan", Float, Unit;
    Asin => "asin", Float, Unit;
    Acos => "acos", Float, Unit;
    Atan => "atan", Float, Any;
    Erfc => "erfc", Float, Any;
    Erfinv => "erfinv", Float, Unit;
    /// `log(x / (1 - x))`, x first clamped to `[eps, 1 - eps]` when `eps >= 0`
    /// (a negative `eps` is PyTorch's `None`: no clamp).
    Logit { eps / "eps" = -1.0 } => "logit", Float, Probability;
    /// `~x` of an integer tensor, `logical_not` of a bool one.
    BitwiseNot => "bitwise_not", Integer, Integer;
}

binary_ops! {
    Add => "add", Promote, Any;
    Sub => "sub", PromoteNoBool, Any;
    Mul => "mul", Promote, Any;
    /// True division: integers divide as floats.
    Div => "div", TrueDiv, PositiveRhs;
    Pow => "pow", Promote, PowLike;
    Maximum => "maximum", Promote, Any;
    Minimum => "minimum", Promote, Any;
    /// Python's `%`: the sign of the divisor.
    Remainder => "remainder", Promote, PositiveRhs;
    /// C's fmod: the sign of the dividend.
    Fmod => "fmod", Promote, PositiveRhs;
    FloorDiv => "floor_divide", Promote, PositiveRhs;
    Eq => "eq", Compare, Any;
    Ne => "ne", Compare, Any;
    Lt => "lt", Compare, Any;
    Le => "le", Compare, Any;
    Gt => "gt", Compare, Any;
    Ge => "ge", Compare, Any;
    And => "logical_and", Logical, Bool;
    Or => "logical_or", Logical, Bool;
    Xor => "logical_xor", Logical, Bool;
    BitwiseAnd => "bitwise_and", Integer, Integer;
    BitwiseOr => "bitwise_or", Integer, Integer;
    BitwiseXor => "bitwise_xor", Integer, Integer;
    /// `atan2(a, b)`: the angle of the point (b, a), signed zeros respected.
    Atan2 => "atan2", FloatOnly, Any;
    Hypot => "hypot", FloatOnly, Any;
    /// `|a|` with the sign of `b` (including the sign of a zero).
    Copysign => "copysign", FloatOnly, Any;
    /// `a * log(b)`, 0 where `a == 0` (unless b is NaN).
    Xlogy => "xlogy", FloatOnly, PositiveRhs;
}

impl UnaryOp {
    /// Ops that only make sense on floating values: integer inputs are
    /// promoted to f32 (as `torch.exp(int_tensor)` is float).
    pub fn is_float_only(&self) -> bool {
        self.dtype_rule() == UnaryDtype::Float
    }
}

impl BinaryOp {
    /// Ops whose result is bool computed in the operands' promoted dtype.
    pub fn is_comparison(&self) -> bool {
        self.dtype_rule() == BinaryDtype::Compare
    }
}

/// `name` or `name{field=value, ...}`: how kernels and graphs print the op.
impl fmt::Display for UnaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        let attrs = self.attrs();
        if attrs.is_empty() {
            return Ok(());
        }
        let body: Vec<String> = attrs.iter().map(|(k, _, v)| format!("{k}={v}")).collect();
        write!(f, "{{{}}}", body.join(", "))
    }
}

impl fmt::Display for BinaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse_back() {
        for (i, u) in UnaryOp::EXAMPLES.iter().enumerate() {
            assert!(UnaryOp::EXAMPLES[..i].iter().all(|v| v.name() != u.name()));
            let attrs = u.attrs();
            let back = UnaryOp::from_text(u.name(), |k| {
                Ok(attrs.iter().find(|(_, t, _)| *t == k).expect("declared").2)
            });
            assert_eq!(back.expect("a unary op").unwrap(), *u);
        }
        for (i, b) in BinaryOp::ALL.iter().enumerate() {
            assert!(BinaryOp::ALL[..i].iter().all(|v| v.name() != b.name()));
            assert_eq!(BinaryOp::from_name(b.name()), Some(*b));
        }
        assert!(UnaryOp::from_text("no_such_op", |_| Ok(Float(0.0))).is_none());
    }

    #[test]
    fn display_prints_attributes_by_field() {
        let s = UnaryOp::Softplus {
            beta: Float(1.0),
            threshold: Float(20.0),
        };
        assert_eq!(s.to_string(), "softplus{beta=1.0, threshold=20.0}");
        assert_eq!(UnaryOp::Relu.to_string(), "relu");
    }
}
