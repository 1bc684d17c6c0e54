//! Pointwise and reduction op kinds: the vocabulary shared by graphs and kernels.

use std::fmt;

/// An `f64` attribute that can be compared and hashed (by bits), printed so it round-trips.
#[derive(Debug, Clone, Copy)]
pub struct Float(pub f64);

impl PartialEq for Float {
    fn eq(&self, o: &Self) -> bool {
        self.0.to_bits() == o.0.to_bits()
    }
}
impl Eq for Float {}
impl std::hash::Hash for Float {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.0.to_bits().hash(h)
    }
}
impl fmt::Display for Float {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `{:?}` prints the shortest string that parses back to the same f64.
        write!(f, "{:?}", self.0)
    }
}

/// Unary pointwise ops (primitives and composites; see [`crate::scalar::lower_unary`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Log1p,
    Expm1,
    Sqrt,
    Rsqrt,
    Reciprocal,
    Square,
    Sin,
    Cos,
    Tanh,
    Erf,
    Floor,
    Not,
    Sigmoid,
    Relu,
    Gelu,
    GeluTanh,
    Silu,
    Softplus { beta: Float, threshold: Float },
    LeakyRelu { slope: Float },
    Elu { alpha: Float },
}

impl UnaryOp {
    /// One of each unary op, parameterised ones with PyTorch's defaults: the
    /// corpus tests iterate over (a new variant belongs here too).
    pub const EXAMPLES: [UnaryOp; 24] = {
        use UnaryOp::*;
        [
            Neg,
            Abs,
            Exp,
            Log,
            Log1p,
            Expm1,
            Sqrt,
            Rsqrt,
            Reciprocal,
            Square,
            Sin,
            Cos,
            Tanh,
            Erf,
            Floor,
            Not,
            Sigmoid,
            Relu,
            Gelu,
            GeluTanh,
            Silu,
            Softplus {
                beta: Float(1.0),
                threshold: Float(20.0),
            },
            LeakyRelu { slope: Float(0.01) },
            Elu { alpha: Float(1.0) },
        ]
    };

    pub fn name(&self) -> &'static str {
        use UnaryOp::*;
        match self {
            Neg => "neg",
            Abs => "abs",
            Exp => "exp",
            Log => "log",
            Log1p => "log1p",
            Expm1 => "expm1",
            Sqrt => "sqrt",
            Rsqrt => "rsqrt",
            Reciprocal => "reciprocal",
            Square => "square",
            Sin => "sin",
            Cos => "cos",
            Tanh => "tanh",
            Erf => "erf",
            Floor => "floor",
            Not => "logical_not",
            Sigmoid => "sigmoid",
            Relu => "relu",
            Gelu => "gelu",
            GeluTanh => "gelu_tanh",
            Silu => "silu",
            Softplus { .. } => "softplus",
            LeakyRelu { .. } => "leaky_relu",
            Elu { .. } => "elu",
        }
    }

    /// Ops that only make sense on floating values: integer inputs are promoted to f32
    /// (as `torch.exp(int_tensor)` is float).
    pub fn is_float_only(&self) -> bool {
        !matches!(
            self,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Square | UnaryOp::Relu | UnaryOp::Not
        )
    }
}

impl fmt::Display for UnaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        match self {
            UnaryOp::Softplus { beta, threshold } => {
                write!(f, "{{beta={beta}, threshold={threshold}}}")
            }
            UnaryOp::LeakyRelu { slope } => write!(f, "{{slope={slope}}}"),
            UnaryOp::Elu { alpha } => write!(f, "{{alpha={alpha}}}"),
            _ => Ok(()),
        }
    }
}

/// Binary pointwise ops (see [`crate::scalar::lower_binary`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
    Remainder,
    Fmod,
    FloorDiv,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 18] = {
        use BinaryOp::*;
        [
            Add, Sub, Mul, Div, Pow, Maximum, Minimum, Remainder, Fmod, FloorDiv, Eq, Ne, Lt, Le,
            Gt, Ge, And, Or,
        ]
    };

    pub fn name(&self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div => "div",
            Pow => "pow",
            Maximum => "maximum",
            Minimum => "minimum",
            Remainder => "remainder",
            Fmod => "fmod",
            FloorDiv => "floor_divide",
            Eq => "eq",
            Ne => "ne",
            Lt => "lt",
            Le => "le",
            Gt => "gt",
            Ge => "ge",
            And => "logical_and",
            Or => "logical_or",
        }
    }

    pub fn is_comparison(&self) -> bool {
        use BinaryOp::*;
        matches!(self, Eq | Ne | Lt | Le | Gt | Ge)
    }
}

impl fmt::Display for BinaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reductions over one axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Prod,
    /// NaN-propagating, as `torch.amax`.
    Max,
    Min,
    /// Index (i64) of the first maximum; NaN counts as the maximum, as in PyTorch.
    ArgMax,
    ArgMin,
    /// `torch.logsumexp` in one pass (online: a running max with a rescaled
    /// sum). A row of only -inf (or an empty row) gives -inf, a +inf gives
    /// +inf, NaN propagates.
    LogSumExp,
    /// Welford's one-pass mean and variance; the value is the biased
    /// variance (`torch.var(correction=0)`); kernels also read the mean.
    /// An empty row gives NaN.
    Welford,
}

impl ReduceKind {
    pub fn name(&self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Prod => "prod",
            ReduceKind::Max => "amax",
            ReduceKind::Min => "amin",
            ReduceKind::ArgMax => "argmax",
            ReduceKind::ArgMin => "argmin",
            ReduceKind::LogSumExp => "lse",
            ReduceKind::Welford => "welford",
        }
    }

    /// Every kind, in declaration order (for parsers and exhaustive tests).
    pub const ALL: [ReduceKind; 8] = [
        ReduceKind::Sum,
        ReduceKind::Prod,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::ArgMax,
        ReduceKind::ArgMin,
        ReduceKind::LogSumExp,
        ReduceKind::Welford,
    ];

    /// Kinds that only reduce floating values (`lse`, `welford`).
    pub fn float_only(&self) -> bool {
        matches!(self, ReduceKind::LogSumExp | ReduceKind::Welford)
    }
}

impl fmt::Display for ReduceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
