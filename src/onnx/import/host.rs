//! Values flowing between imported nodes: kiln tensors, or small integer
//! tensors kept on the host (shapes and the arithmetic on them), which turn
//! into tensors only when a tensor op reads them.

use crate::{DType, Result, Tensor};
use kiln_ir::bail;

/// Largest integer constant kept on the host (shape vectors are far smaller).
const HOST_MAX: usize = 64;

/// A small integer tensor on the host.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Host {
    pub dims: Vec<usize>,
    pub data: Vec<i64>,
    pub dtype: DType,
}

impl Host {
    pub fn vec(data: Vec<i64>) -> Host {
        Host {
            dims: vec![data.len()],
            data,
            dtype: DType::I64,
        }
    }

    pub fn scalar(v: i64, dtype: DType) -> Host {
        Host {
            dims: vec![],
            data: vec![v],
            dtype,
        }
    }

    pub fn tensor(&self) -> Result<Tensor> {
        Tensor::from_vec(self.data.clone(), &self.dims)?.to_dtype(self.dtype)
    }
}

#[derive(Clone)]
pub(crate) enum Value {
    T(Tensor),
    Host(Host),
    /// An omitted optional input (`""`).
    None,
    /// A sequence of tensors (the sequence ops, `ops_seq.rs`).
    Seq(Vec<Tensor>),
}

fn is_int(d: DType) -> bool {
    matches!(
        d,
        DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U8
    )
}

impl Value {
    /// An initializer or `Constant`: small integer ones go to the host.
    pub fn constant(t: Tensor) -> Value {
        if is_int(t.dtype()) && t.numel() <= HOST_MAX {
            // read directly (no cast op): under a trace this tensor is no graph value yet
            return Value::Host(Host {
                dims: t.dims().to_vec(),
                data: t.to_f64_vec().iter().map(|v| *v as i64).collect(),
                dtype: t.dtype(),
            });
        }
        Value::T(t)
    }

    pub fn is_none(&self) -> bool {
        matches!(self, Value::None)
    }

    pub fn host(&self) -> Option<&Host> {
        match self {
            Value::Host(h) => Some(h),
            _ => None,
        }
    }

    /// The value as a kiln tensor.
    pub fn tensor(&self) -> Result<Tensor> {
        match self {
            Value::T(t) => Ok(t.clone()),
            Value::Host(h) => h.tensor(),
            Value::None => bail!("onnx", "an omitted optional input was read"),
            Value::Seq(_) => bail!("onnx", "a sequence was read as a tensor"),
        }
    }

    pub fn dims(&self) -> Vec<usize> {
        match self {
            Value::T(t) => t.dims().to_vec(),
            Value::Host(h) => h.dims.clone(),
            Value::None | Value::Seq(_) => vec![],
        }
    }

    pub fn dtype(&self) -> DType {
        match self {
            Value::T(t) => t.dtype(),
            Value::Host(h) => h.dtype,
            Value::None | Value::Seq(_) => DType::F32,
        }
    }

    /// The elements as integers (a shape, axes, pads): read from the host, or
    /// from a tensor (a traced value read this way is a graph break).
    pub fn ints(&self) -> Result<Vec<i64>> {
        match self {
            Value::Host(h) => Ok(h.data.clone()),
            Value::T(t) => Ok(t.to_f64_vec().iter().map(|v| *v as i64).collect()),
            Value::None => bail!("onnx", "an omitted optional input was read"),
            Value::Seq(_) => bail!("onnx", "a sequence was read as integers"),
        }
    }

    /// The elements as `f64` (a Clip bound, a Pad value).
    pub fn floats(&self) -> Result<Vec<f64>> {
        match self {
            Value::Host(h) => Ok(h.data.iter().map(|v| *v as f64).collect()),
            Value::T(t) => Ok(t.to_f64_vec()),
            Value::None => bail!("onnx", "an omitted optional input was read"),
            Value::Seq(_) => bail!("onnx", "a sequence was read as numbers"),
        }
    }
}
