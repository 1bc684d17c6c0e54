//! Shape and dtype inference with argument checks for pointwise ops and
//! reductions — written once, used by eager execution (and later the tracer).

use super::{BinaryDtype, BinaryOp, ReduceKind, UnaryDtype, UnaryOp};
use crate::dtype::{result_type, Category, Operand};
use crate::shape::{broadcast_shapes, fmt_dims, norm_dim, Dims};
use crate::{bail, DType, Result};

/// Type and shape of a tensor value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Meta {
    pub dtype: DType,
    pub dims: Dims,
}

/// `f32[2,3]`, as the text form prints a value's type.
impl std::fmt::Display for Meta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.dtype, crate::shape::fmt_dims(&self.dims))
    }
}

impl Meta {
    pub fn new(dtype: DType, dims: &[usize]) -> Meta {
        Meta {
            dtype,
            dims: dims.into(),
        }
    }
    /// The promotion operand this tensor counts as (0-dim tensors rank lower).
    pub fn operand(&self) -> Operand {
        if self.dims.is_empty() {
            Operand::ZeroDim(self.dtype)
        } else {
            Operand::Tensor(self.dtype)
        }
    }
}

/// One side of a binary op: a tensor or a Python number.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg<'a> {
    Tensor(&'a Meta),
    Scalar(Category),
}

impl Arg<'_> {
    fn operand(&self) -> Operand {
        match self {
            Arg::Tensor(m) => m.operand(),
            Arg::Scalar(c) => Operand::Scalar(*c),
        }
    }
    fn dims(&self) -> &[usize] {
        match self {
            Arg::Tensor(m) => &m.dims,
            Arg::Scalar(_) => &[],
        }
    }
}

/// What a pointwise op computes in and produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointwiseSig {
    /// dtype the operands are cast to before the op (f32 for f16/bf16 storage).
    pub compute: DType,
    /// dtype of the result tensor.
    pub out: DType,
    pub dims: Dims,
}

pub fn unary(op: UnaryOp, x: &Meta) -> Result<PointwiseSig> {
    let name = op.name();
    let (compute, out) = match op.dtype_rule() {
        UnaryDtype::Bool => (x.dtype.compute(), DType::Bool),
        UnaryDtype::KeepNoBool if x.dtype == DType::Bool => {
            bail!(
                name,
                "negation of a bool tensor is not supported; use logical_not (input {} {})",
                x.dtype,
                fmt_dims(&x.dims)
            )
        }
        UnaryDtype::Integer if x.dtype.is_float() => {
            bail!(
                name,
                "only integer and bool tensors are supported, got {} {}",
                x.dtype,
                fmt_dims(&x.dims)
            )
        }
        UnaryDtype::Float if !x.dtype.is_float() => (DType::F32, DType::F32),
        _ => (x.dtype.compute(), x.dtype),
    };
    Ok(PointwiseSig {
        compute,
        out,
        dims: x.dims.clone(),
    })
}

pub fn binary(op: BinaryOp, a: Arg, b: Arg) -> Result<PointwiseSig> {
    let name = op.name();
    let dims = broadcast_shapes(name, a.dims(), b.dims())?;
    let promoted = result_type(&[a.operand(), b.operand()]).expect("two operands");
    let (compute, out) = match op.dtype_rule() {
        BinaryDtype::Compare => (promoted.compute(), DType::Bool),
        BinaryDtype::Logical => (DType::Bool, DType::Bool),
        BinaryDtype::F64 => (DType::F64, DType::F64),
        // true division of integers is floating (the default dtype)
        BinaryDtype::TrueDiv | BinaryDtype::FloatOnly if !promoted.is_float() => {
            (DType::F32, DType::F32)
        }
        BinaryDtype::PromoteNoBool if promoted == DType::Bool => {
            bail!(
                name,
                "subtraction of bool tensors is not supported; use logical_xor"
            )
        }
        BinaryDtype::Integer if promoted.is_float() => {
            bail!(
                name,
                "only integer and bool tensors are supported, got {promoted}"
            )
        }
        _ => (promoted.compute(), promoted),
    };
    Ok(PointwiseSig { compute, out, dims })
}

/// `where(cond, a, b)`: cond must be bool; a and b promote.
pub fn where_(cond: &Meta, a: Arg, b: Arg) -> Result<PointwiseSig> {
    if cond.dtype != DType::Bool {
        bail!(
            "where",
            "condition must be a bool tensor, got {} {}",
            cond.dtype,
            fmt_dims(&cond.dims)
        );
    }
    let dims = broadcast_shapes(
        "where",
        &cond.dims,
        &broadcast_shapes("where", a.dims(), b.dims())?,
    )?;
    let out = result_type(&[a.operand(), b.operand()]).expect("two operands");
    Ok(PointwiseSig {
        compute: out.compute(),
        out,
        dims,
    })
}

/// Normalises a list of reduction dims (empty = all dims), rejecting repeats.
pub fn reduce_dims(op: &str, rank: usize, dims: Option<&[i64]>) -> Result<Vec<usize>> {
    let mut out = match dims {
        None => (0..rank).collect::<Vec<_>>(),
        Some([]) => (0..rank).collect(),
        Some(ds) => ds
            .iter()
            .map(|&d| norm_dim(op, d, rank))
            .collect::<Result<Vec<_>>>()?,
    };
    out.sort_unstable();
    let n = out.len();
    out.dedup();
    if out.len() != n {
        bail!(
            op,
            "dim {:?} appears more than once in the list of dims",
            dims.unwrap_or(&[])
        );
    }
    if rank == 0 {
        out.clear();
    }
    Ok(out)
}

/// Shape after reducing `dims` (sorted, normalised).
pub fn reduced_shape(shape: &[usize], dims: &[usize], keepdim: bool) -> Dims {
    let mut out = Dims::new();
    for (i, &d) in shape.iter().enumerate() {
        if dims.contains(&i) {
            if keepdim {
                out.push(1);
            }
        } else {
            out.push(d);
        }
    }
    out
}

/// Result dtype of a reduction, with PyTorch's rules: sum/prod of integers and
/// bools accumulate in i64; arg-reductions give i64; max/min keep the dtype;
/// lse and welford need a floating input and keep its dtype (over an empty
/// dim they give -inf and NaN, as `torch.logsumexp` and `torch.var` do).
pub fn reduce(kind: ReduceKind, x: &Meta, dims: &[usize], keepdim: bool) -> Result<Meta> {
    let name = kind.name();
    let reduces_empty =
        dims.iter().any(|&d| x.dims[d] == 0) || (dims.is_empty() && x.dims.contains(&0));
    if kind.float_only() {
        require_float(name, x)?;
    }
    let has_identity = matches!(
        kind,
        ReduceKind::Sum | ReduceKind::Prod | ReduceKind::LogSumExp | ReduceKind::Welford
    );
    if reduces_empty && !has_identity {
        bail!(
            name,
            "cannot reduce over an empty dim of shape {} (the op has no identity)",
            fmt_dims(&x.dims)
        );
    }
    let dtype = match kind {
        ReduceKind::Sum | ReduceKind::Prod if !x.dtype.is_float() => DType::I64,
        ReduceKind::ArgMax | ReduceKind::ArgMin => DType::I64,
        _ => x.dtype,
    };
    Ok(Meta {
        dtype,
        dims: reduced_shape(&x.dims, dims, keepdim),
    })
}

/// Ops that need floating input (mean, var, softmax, norms, ...).
pub fn require_float(op: &str, x: &Meta) -> Result<()> {
    if !x.dtype.is_float() {
        bail!(
            op,
            "expected a floating-point input, got {} {} (cast with .to(f32) first)",
            x.dtype,
            fmt_dims(&x.dims)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_promotion_and_bcast() {
        let a = Meta::new(DType::I64, &[3, 4]);
        let s = binary(BinaryOp::Add, Arg::Tensor(&a), Arg::Scalar(Category::Float)).unwrap();
        assert_eq!((s.out, s.dims.as_slice()), (DType::F32, &[3usize, 4][..]));
        let s = binary(BinaryOp::Div, Arg::Tensor(&a), Arg::Tensor(&a)).unwrap();
        assert_eq!(s.out, DType::F32);
        let h = Meta::new(DType::BF16, &[2]);
        let s = binary(BinaryOp::Mul, Arg::Tensor(&h), Arg::Tensor(&h)).unwrap();
        assert_eq!((s.compute, s.out), (DType::F32, DType::BF16));
    }

    #[test]
    fn reduce_rules() {
        let x = Meta::new(DType::I32, &[2, 3]);
        let d = reduce_dims("sum", 2, Some(&[-1])).unwrap();
        assert_eq!(
            reduce(ReduceKind::Sum, &x, &d, true).unwrap(),
            Meta::new(DType::I64, &[2, 1])
        );
        assert!(reduce_dims("sum", 2, Some(&[1, -1])).is_err());
        let e = Meta::new(DType::F32, &[0, 3]);
        assert!(reduce(ReduceKind::Max, &e, &[0], false).is_err());
        let lse = reduce(ReduceKind::LogSumExp, &e, &[0], false).unwrap();
        assert_eq!(lse, Meta::new(DType::F32, &[3]));
        let err = reduce(ReduceKind::Welford, &x, &[1], false).unwrap_err();
        assert!(err.to_string().contains("floating"), "{err}");
    }
}
