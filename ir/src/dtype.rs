//! Element types and PyTorch's type-promotion rules.

use crate::{bail, Result};

/// An element type. `Bool` is stored as one byte holding 0 or 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Bool,
    U8,
    I8,
    I16,
    I32,
    I64,
    F16,
    BF16,
    F32,
    F64,
}

/// bool < integer < floating: the categories PyTorch's promotion compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    Bool,
    Int,
    Float,
}

impl DType {
    pub const ALL: [DType; 10] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    pub fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::U8 | DType::I8 | DType::I16 | DType::I32 | DType::I64 => Category::Int,
            _ => Category::Float,
        }
    }

    pub fn is_float(self) -> bool {
        self.category() == Category::Float
    }

    pub fn is_int(self) -> bool {
        self.category() == Category::Int
    }

    /// f16 and bf16 are stored narrow but computed in f32, as PyTorch's CPU kernels do.
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// The type arithmetic happens in: f16/bf16 widen to f32.
    pub fn compute(self) -> DType {
        if self.is_half() {
            DType::F32
        } else {
            self
        }
    }

    /// Short name used in dumps: `f32`, `i64`, `bool`.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Parses both kiln's short names and PyTorch's (`float32`, `int64`, `bfloat16`).
    pub fn parse(s: &str) -> Result<DType> {
        Ok(match s {
            "bool" => DType::Bool,
            "u8" | "uint8" => DType::U8,
            "i8" | "int8" => DType::I8,
            "i16" | "int16" => DType::I16,
            "i32" | "int32" => DType::I32,
            "i64" | "int64" | "long" => DType::I64,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "f32" | "float32" | "float" => DType::F32,
            "f64" | "float64" | "double" => DType::F64,
            _ => bail!("dtype", "unknown dtype '{s}'"),
        })
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `torch.promote_types`: the smallest type both values fit in.
pub fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    match (a.category(), b.category()) {
        (Category::Bool, _) => b,
        (_, Category::Bool) => a,
        (Category::Float, Category::Float) => match (a, b) {
            (F16, BF16) | (BF16, F16) => F32,
            _ => a.max(b),
        },
        (Category::Float, _) => a,
        (_, Category::Float) => b,
        (Category::Int, Category::Int) => {
            // u8 is the only unsigned type: with a signed type it needs the next
            // signed width that holds 0..=255.
            let (u, s) = match (a, b) {
                (U8, s) | (s, U8) => (true, s),
                _ => (false, a),
            };
            if u {
                match s {
                    I8 | I16 => I16,
                    other => other,
                }
            } else {
                a.max(b)
            }
        }
    }
}

/// What an operand of a promoting op is, for `result_type`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Operand {
    /// A tensor with at least one dimension.
    Tensor(DType),
    /// A 0-dim tensor: it only decides the type when it is of a higher category.
    ZeroDim(DType),
    /// A Python number (`x + 2.5`): float means the default dtype f32, int means i64.
    Scalar(Category),
}

/// `torch.result_type`: dimensioned tensors win, then 0-dim tensors, then Python
/// scalars, but a lower-priority operand of a higher category lifts the result
/// (`i64_tensor + 2.5` is f32, `f32_tensor + f64_0dim` stays f32).
pub fn result_type(operands: &[Operand]) -> Option<DType> {
    fn fold(it: impl Iterator<Item = DType>) -> Option<DType> {
        it.reduce(promote_types)
    }
    let dim = fold(operands.iter().filter_map(|o| match o {
        Operand::Tensor(d) => Some(*d),
        _ => None,
    }));
    let zero = fold(operands.iter().filter_map(|o| match o {
        Operand::ZeroDim(d) => Some(*d),
        _ => None,
    }));
    let wrapped = fold(operands.iter().filter_map(|o| match o {
        Operand::Scalar(Category::Float) => Some(DType::F32),
        Operand::Scalar(Category::Int) => Some(DType::I64),
        Operand::Scalar(Category::Bool) => Some(DType::Bool),
        _ => None,
    }));
    combine(dim, combine(zero, wrapped))
}

// PyTorch's `combine_categories`: `higher` wins unless `lower` is of a higher category.
fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    let (Some(h), Some(l)) = (higher, lower) else {
        return higher.or(lower);
    };
    if h.is_float() {
        return Some(h);
    }
    if h == DType::Bool || l.is_float() {
        return Some(promote_types(h, l));
    }
    Some(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn promote_table() {
        assert_eq!(promote_types(U8, I8), I16);
        assert_eq!(promote_types(I32, I64), I64);
        assert_eq!(promote_types(F16, BF16), F32);
        assert_eq!(promote_types(BF16, F32), F32);
        assert_eq!(promote_types(I64, F16), F16);
        assert_eq!(promote_types(Bool, U8), U8);
    }

    #[test]
    fn result_type_categories() {
        use Operand::*;
        assert_eq!(result_type(&[Tensor(F32), ZeroDim(F64)]), Some(F32));
        assert_eq!(result_type(&[Tensor(I64), ZeroDim(F64)]), Some(F64));
        assert_eq!(
            result_type(&[Tensor(I64), Scalar(Category::Float)]),
            Some(F32)
        );
        assert_eq!(
            result_type(&[Tensor(I64), Scalar(Category::Int)]),
            Some(I64)
        );
        assert_eq!(result_type(&[Tensor(U8), Scalar(Category::Int)]), Some(U8));
        assert_eq!(
            result_type(&[Tensor(F16), Scalar(Category::Float)]),
            Some(F16)
        );
        assert_eq!(
            result_type(&[ZeroDim(F64), Scalar(Category::Float)]),
            Some(F64)
        );
        assert_eq!(
            result_type(&[Tensor(Bool), Scalar(Category::Int)]),
            Some(I64)
        );
    }
}
