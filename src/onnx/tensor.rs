//! ONNX `TensorProto` <-> kiln [`Tensor`]: dtypes, raw little-endian data
//! and the typed `*_data` fields the older exporters wrote.
//!
//! ```
//! use kiln::onnx::tensor::{from_proto, to_proto};
//! let t = kiln::Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
//! let back = from_proto(&to_proto("w", &t)?)?;
//! assert_eq!(back.to_vec::<f32>()?, vec![1.0, 2.0, 3.0]);
//! # Ok::<(), kiln::Error>(())
//! ```

use super::proto::{data_type as dt, TensorProto};
use crate::{DType, Result, Tensor};
use kiln_ir::bail;

/// The ONNX `TensorProto.DataType` of a kiln dtype.
pub fn onnx_dtype(d: DType) -> i32 {
    match d {
        DType::Bool => dt::BOOL,
        DType::U8 => dt::UINT8,
        DType::I8 => dt::INT8,
        DType::I16 => dt::INT16,
        DType::I32 => dt::INT32,
        DType::I64 => dt::INT64,
        DType::F16 => dt::FLOAT16,
        DType::BF16 => dt::BFLOAT16,
        DType::F32 => dt::FLOAT,
        DType::F64 => dt::DOUBLE,
    }
}

/// The kiln dtype of an ONNX `TensorProto.DataType` (`what` names the value in errors).
pub fn kiln_dtype(code: i32, what: &str) -> Result<DType> {
    Ok(match code {
        dt::BOOL => DType::Bool,
        dt::UINT8 => DType::U8,
        dt::INT8 => DType::I8,
        dt::INT16 => DType::I16,
        dt::INT32 => DType::I32,
        dt::INT64 => DType::I64,
        dt::FLOAT16 => DType::F16,
        dt::BFLOAT16 => DType::BF16,
        dt::FLOAT => DType::F32,
        dt::DOUBLE => DType::F64,
        c => bail!(
            "onnx",
            "{what}: ONNX data type {c} ({}) is not supported by kiln",
            type_name(c)
        ),
    })
}

fn type_name(c: i32) -> &'static str {
    match c {
        dt::UNDEFINED => "UNDEFINED",
        dt::UINT16 => "UINT16",
        dt::STRING => "STRING",
        dt::UINT32 => "UINT32",
        dt::UINT64 => "UINT64",
        14 => "COMPLEX64",
        15 => "COMPLEX128",
        17..=20 => "FLOAT8",
        _ => "unknown",
    }
}

/// A tensor from a `TensorProto` (raw or typed data; external data is refused).
pub fn from_proto(p: &TensorProto) -> Result<Tensor> {
    let what = if p.name.is_empty() {
        "tensor".to_string()
    } else {
        format!("tensor `{}`", p.name)
    };
    let dtype = kiln_dtype(p.data_type, &what)?;
    if p.data_location == 1 || !p.external_data.is_empty() {
        bail!(
            "onnx",
            "{what}: external data is not supported (store the weights inside the model)"
        );
    }
    let dims = p
        .dims
        .iter()
        .map(|&d| {
            usize::try_from(d)
                .map_err(|_| kiln_ir::Error::op("onnx", format!("{what}: negative dim {d}")))
        })
        .collect::<Result<Vec<usize>>>()?;
    let n: usize = dims.iter().product();
    let size = dtype.size();
    let bytes: Vec<u8> = if !p.raw_data.is_empty() || n == 0 {
        p.raw_data.clone()
    } else {
        match dtype {
            DType::F32 => p.float_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F64 => p.double_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::I64 => p.int64_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            // int32_data holds every narrower type, one element per entry;
            // f16/bf16 as their bit patterns
            DType::I32 => p.int32_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::I16 | DType::F16 | DType::BF16 => p
                .int32_data
                .iter()
                .flat_map(|v| (*v as u16).to_le_bytes())
                .collect(),
            DType::I8 | DType::U8 | DType::Bool => p.int32_data.iter().map(|v| *v as u8).collect(),
        }
    };
    if bytes.len() != n * size {
        bail!(
            "onnx",
            "{what}: {} bytes of data for a {dtype}{:?} tensor ({} expected)",
            bytes.len(),
            dims,
            n * size
        );
    }
    if dtype == DType::Bool && bytes.iter().any(|b| *b > 1) {
        bail!("onnx", "{what}: bool data holds bytes other than 0 and 1");
    }
    Ok(Tensor::from_bytes(dtype, &dims, &bytes))
}

/// A `TensorProto` named `name` holding `t` as raw data.
pub fn to_proto(name: &str, t: &Tensor) -> Result<TensorProto> {
    Ok(TensorProto {
        dims: t.dims().iter().map(|&d| d as i64).collect(),
        data_type: onnx_dtype(t.dtype()),
        name: name.to_string(),
        raw_data: t.contiguous()?.to_bytes(),
        ..Default::default()
    })
}
