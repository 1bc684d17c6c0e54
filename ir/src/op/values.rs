//! Small value types carried by [`Op`](crate::op::Op) variants: a Python
//! scalar operand ([`ScalarValue`]) and a loss reduction ([`Reduction`]).

use crate::dtype::Category;
use crate::Float;
use std::fmt;

/// A Python number recorded by value (`x * 2` vs `x * 2.0` vs `x | True`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarValue {
    Bool(bool),
    Int(i64),
    Float(Float),
}

impl ScalarValue {
    /// The kind that takes part in type promotion.
    pub fn category(self) -> Category {
        match self {
            ScalarValue::Bool(_) => Category::Bool,
            ScalarValue::Int(_) => Category::Int,
            ScalarValue::Float(_) => Category::Float,
        }
    }

    /// The value as an `f64` (`true` is 1).
    pub fn to_f64(self) -> f64 {
        match self {
            ScalarValue::Bool(b) => b as u8 as f64,
            ScalarValue::Int(i) => i as f64,
            ScalarValue::Float(x) => x.0,
        }
    }
}

/// Prints `true`, `2`, `2.0`: the text form tells the three kinds apart.
impl fmt::Display for ScalarValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScalarValue::Bool(b) => write!(f, "{b}"),
            ScalarValue::Int(i) => write!(f, "{i}"),
            ScalarValue::Float(x) => write!(f, "{x}"),
        }
    }
}

/// A loss's `reduction=` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Reduction {
    /// One loss per element (per sample for the class losses).
    None,
    #[default]
    Mean,
    Sum,
}

impl Reduction {
    pub const ALL: [Reduction; 3] = [Reduction::None, Reduction::Mean, Reduction::Sum];

    /// Parses PyTorch's spelling, naming the op family on error.
    pub fn parse(s: &str) -> crate::Result<Reduction> {
        match s {
            "none" => Ok(Reduction::None),
            "mean" => Ok(Reduction::Mean),
            "sum" => Ok(Reduction::Sum),
            _ => crate::bail!(
                "loss",
                "reduction must be 'none', 'mean' or 'sum', got '{s}'"
            ),
        }
    }

    /// PyTorch's spelling: `none`, `mean`, `sum`.
    pub fn name(self) -> &'static str {
        match self {
            Reduction::None => "none",
            Reduction::Mean => "mean",
            Reduction::Sum => "sum",
        }
    }
}
