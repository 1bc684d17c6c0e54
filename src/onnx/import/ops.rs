//! The importer's op table: which ONNX ops run, and the elementwise,
//! reduction and softmax ops (binary and variadic ones are in `ops_binary.rs`,
//! layers in `ops_nn.rs`, shapes and data
//! movement in `ops_shape.rs`).

use super::attrs::Node;
use super::host::{Host, Value};
use super::ops_binary::{binary, legacy_align, variadic};
use super::{ops_more, ops_nn, ops_resize, ops_rnn, ops_seq, ops_shape};
use crate::ir::BinaryOp;
use crate::{DType, Result, Tensor};

/// Every op the importer runs (anything else is refused at load time).
pub(crate) const SUPPORTED: &[&str] = &[
    // elementwise
    "Abs",
    "Neg",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Sin",
    "Cos",
    "Tanh",
    "Erf",
    "Floor",
    "Ceil",
    "Sigmoid",
    "Relu",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Softplus",
    "Softsign",
    "HardSigmoid",
    "HardSwish",
    "Gelu",
    "Mish",
    "PRelu",
    "Sign",
    "Not",
    "Clip",
    "Shrink",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Max",
    "Min",
    "Sum",
    "Mean",
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "And",
    "Or",
    "Where",
    "Cast",
    "Identity",
    "Dropout",
    // reductions and softmax
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "ReduceL2",
    "ReduceL1",
    "ArgMax",
    "ArgMin",
    "Softmax",
    "LogSoftmax",
    // layers
    "Conv",
    "ConvTranspose",
    "BatchNormalization",
    "InstanceNormalization",
    "LayerNormalization",
    "Gemm",
    "MatMul",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Pad",
    "LRN",
    "Resize",
    "Upsample",
    // recurrent layers
    "LSTM",
    "GRU",
    "RNN",
    // shapes and data movement
    "Shape",
    "Size",
    "Reshape",
    "Flatten",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Concat",
    "Slice",
    "Gather",
    "Split",
    "Expand",
    "Tile",
    "Constant",
    "ConstantOfShape",
    "Range",
    // ops_more.rs
    "Tan",
    "Asin",
    "Acos",
    "Atan",
    "Sinh",
    "Cosh",
    "Round",
    "IsNaN",
    "IsInf",
    "GatherElements",
    "Trilu",
    "Mod",
    "CumSum",
    // sequences
    "SequenceEmpty",
    "SequenceConstruct",
    "SequenceInsert",
    "SequenceErase",
    "SequenceAt",
    "SequenceLength",
    "ConcatFromSequence",
    "SplitToSequence",
];

pub(crate) fn supported(op: &str) -> bool {
    SUPPORTED.contains(&op)
}

pub(super) fn t(v: Tensor) -> Result<Vec<Value>> {
    Ok(vec![Value::T(v)])
}

/// Input `i` as a tensor (an error naming it when absent).
pub(crate) fn input(n: &Node, ins: &[Value], i: usize) -> Result<Tensor> {
    match ins.get(i) {
        Some(v) if !v.is_none() => v.tensor(),
        _ => Err(n.err(format!("input {i} is required"))),
    }
}

/// Runs one node.
pub(crate) fn run(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let x = || input(n, ins, 0);
    match n.op() {
        "Abs" => t(x()?.abs()?),
        "Neg" if ins[0].host().is_some() => {
            let h = ins[0].host().unwrap();
            Ok(vec![Value::Host(Host {
                data: h.data.iter().map(|v| -v).collect(),
                ..h.clone()
            })])
        }
        "Neg" => t(x()?.neg()?),
        "Exp" => t(x()?.exp()?),
        "Log" => t(x()?.log()?),
        "Sqrt" => t(x()?.sqrt()?),
        "Reciprocal" => t(x()?.reciprocal()?),
        "Sin" => t(x()?.sin()?),
        "Cos" => t(x()?.cos()?),
        "Tanh" => t(x()?.tanh()?),
        "Erf" => t(x()?.unary(crate::ir::UnaryOp::Erf)?),
        "Floor" => t(x()?.unary(crate::ir::UnaryOp::Floor)?),
        "Ceil" => t(x()?.neg()?.unary(crate::ir::UnaryOp::Floor)?.neg()?),
        "Sigmoid" => t(x()?.sigmoid()?),
        "Relu" => t(x()?.relu()?),
        "LeakyRelu" => t(x()?.leaky_relu(n.float_or("alpha", 0.01)?)?),
        "Elu" => t(x()?.elu(n.float_or("alpha", 1.0)?)?),
        "Selu" => {
            let alpha = n.float_or("alpha", 1.673_263_192_176_818_8)?;
            let gamma = n.float_or("gamma", 1.050_701_022_148_132_3)?;
            t(&x()?.elu(alpha)? * gamma)
        }
        "Softplus" => t(x()?.softplus(1.0, f64::INFINITY)?),
        "Softsign" => {
            let x = x()?;
            t(x.div(&(&x.abs()? + 1.0))?)
        }
        "HardSigmoid" => {
            let (a, b) = (n.float_or("alpha", 0.2)?, n.float_or("beta", 0.5)?);
            t(clamp(&(&(&x()? * a) + b), Some(0.0), Some(1.0))?)
        }
        "HardSwish" => {
            let x = x()?;
            t(x.mul(&clamp(&(&(&x * (1.0 / 6.0)) + 0.5), Some(0.0), Some(1.0))?)?)
        }
        "Gelu" => {
            let approx = n.string("approximate")?.unwrap_or_else(|| "none".into());
            match approx.as_str() {
                "none" => t(x()?.gelu(false)?),
                "tanh" => t(x()?.gelu(true)?),
                a => Err(n.unsupported(format!("approximate=`{a}`"))),
            }
        }
        "Mish" => {
            let x = x()?;
            t(x.mul(&x.softplus(1.0, f64::INFINITY)?.tanh()?)?)
        }
        "PRelu" => {
            let (x, slope) = (x()?, input(n, ins, 1)?);
            let slope = legacy_align(n, &x, slope, 1)?;
            let neg = x.lt(&Tensor::zeros(&[], x.dtype()))?;
            t(Tensor::where_(&neg, &x.mul(&slope)?, &x)?)
        }
        "Sign" => {
            let x = x()?;
            let z = Tensor::zeros(&[], x.dtype());
            t(x.gt(&z)?
                .to_dtype(x.dtype())?
                .sub(&x.lt(&z)?.to_dtype(x.dtype())?)?)
        }
        "Not" => t(x()?.logical_not()?),
        "Clip" => clip(n, ins),
        "Shrink" => {
            let (bias, lambd) = (n.float_or("bias", 0.0)?, n.float_or("lambd", 0.5)?);
            let x = x()?;
            let zero = Tensor::zeros(x.dims(), x.dtype());
            let lo = Tensor::where_(
                &x.lt(&Tensor::full(&[], -lambd, x.dtype()))?,
                &(&x + bias),
                &zero,
            )?;
            t(Tensor::where_(
                &x.gt(&Tensor::full(&[], lambd, x.dtype()))?,
                &(&x - bias),
                &lo,
            )?)
        }
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "LessOrEqual" | "Greater"
        | "GreaterOrEqual" | "And" | "Or" => binary(n, ins),
        "Max" | "Min" | "Sum" | "Mean" => variadic(n, ins),
        "Where" => {
            let c = input(n, ins, 0)?;
            t(Tensor::where_(&c, &input(n, ins, 1)?, &input(n, ins, 2)?)?)
        }
        "Cast" => cast(n, ins),
        "Identity" => Ok(vec![ins[0].clone()]),
        "Dropout" => dropout(n, ins),
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd"
        | "ReduceLogSumExp" | "ReduceSumSquare" | "ReduceL2" | "ReduceL1" => reduce(n, ins),
        "ArgMax" | "ArgMin" => {
            let axis = n.int_or("axis", 0)?;
            let keep = n.int_or("keepdims", 1)? != 0;
            let last = n.int_or("select_last_index", 0)? != 0;
            let x = x()?;
            let a = if axis < 0 {
                axis + x.rank() as i64
            } else {
                axis
            };
            let len = x.dims().get(a as usize).copied().unwrap_or(1);
            // the last extremum: the first one of the reversed dim, mapped back
            let xs = if last {
                let rev: Vec<i64> = (0..len as i64).rev().collect();
                x.index_select(a, &Tensor::from_vec(rev, &[len])?)?
            } else {
                x
            };
            let i = if n.op() == "ArgMax" {
                xs.argmax(Some(a), keep)?
            } else {
                xs.argmin(Some(a), keep)?
            };
            t(if last {
                i.binary_scalar(BinaryOp::Sub, len as i64 - 1, true)?
            } else {
                i
            })
        }
        "Softmax" | "LogSoftmax" => softmax(n, ins),
        "Conv"
        | "ConvTranspose"
        | "BatchNormalization"
        | "InstanceNormalization"
        | "LayerNormalization"
        | "Gemm"
        | "MatMul"
        | "MaxPool"
        | "AveragePool"
        | "GlobalAveragePool"
        | "GlobalMaxPool"
        | "Pad" => ops_nn::run(n, ins),
        "LSTM" | "GRU" | "RNN" => ops_rnn::run(n, ins),
        "Resize" | "Upsample" => ops_resize::resize(n, ins),
        "LRN" => ops_resize::lrn(n, ins),
        op if ops_more::OPS.contains(&op) => ops_more::run(n, ins),
        op if op.starts_with("Sequence") || op.ends_with("Sequence") => ops_seq::run(n, ins),
        _ => ops_shape::run(n, ins),
    }
}

/// `min(max(x, lo), hi)` with optional bounds.
pub(crate) fn clamp(x: &Tensor, lo: Option<f64>, hi: Option<f64>) -> Result<Tensor> {
    let mut y = x.clone();
    // an integer bound for an integer tensor: a float one would promote it to float
    let int = !x.dtype().is_float();
    let bound = |v: f64| -> crate::Scalar {
        if int {
            (v as i64).into()
        } else {
            v.into()
        }
    };
    if let Some(lo) = lo {
        y = y.binary_scalar(BinaryOp::Maximum, bound(lo), false)?;
    }
    if let Some(hi) = hi {
        y = y.binary_scalar(BinaryOp::Minimum, bound(hi), false)?;
    }
    Ok(y)
}

fn clip(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let x = input(n, ins, 0)?;
    let (lo, hi) = if n.opset < 11 {
        (
            n.float_or("min", f64::NEG_INFINITY)?,
            n.float_or("max", f64::INFINITY)?,
        )
    } else {
        let bound = |i: usize, d: f64| -> Result<f64> {
            match ins.get(i) {
                Some(v) if !v.is_none() => Ok(v.floats()?[0]),
                _ => Ok(d),
            }
        };
        (bound(1, f64::NEG_INFINITY)?, bound(2, f64::INFINITY)?)
    };
    let lo = (lo > f64::NEG_INFINITY).then_some(lo);
    let hi = (hi < f64::INFINITY).then_some(hi);
    t(clamp(&x, lo, hi)?)
}

fn cast(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let to = n
        .int("to")?
        .ok_or_else(|| n.err("attribute `to` is required"))?;
    n.ignore(&["saturate"]);
    let dtype =
        crate::onnx::tensor::kiln_dtype(to as i32, &format!("Cast node `{}`", n.proto.name))?;
    if let Some(h) = ins[0].host() {
        if !dtype.is_float() {
            let data = if dtype == DType::Bool {
                h.data.iter().map(|v| (*v != 0) as i64).collect()
            } else {
                h.data.clone()
            };
            return Ok(vec![Value::Host(Host {
                dims: h.dims.clone(),
                data,
                dtype,
            })]);
        }
    }
    t(input(n, ins, 0)?.to_dtype(dtype)?)
}

fn dropout(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    n.ignore(&["ratio", "is_test", "seed"]);
    if let Some(v) = ins.get(2) {
        if !v.is_none() && v.ints()?.first().copied().unwrap_or(0) != 0 {
            return Err(n.unsupported("training_mode=true"));
        }
    }
    if n.proto.output.len() > 1 && !n.proto.output[1].is_empty() {
        let x = input(n, ins, 0)?;
        return Ok(vec![
            ins[0].clone(),
            Value::T(Tensor::ones(x.dims(), DType::Bool)),
        ]);
    }
    Ok(vec![ins[0].clone()])
}

fn reduce(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let x = input(n, ins, 0)?;
    let keep = n.int_or("keepdims", 1)? != 0;
    // the axes moved from an attribute to an input: ReduceSum at 13, the others at 18
    let from_input = n.opset >= 18 || (n.op() == "ReduceSum" && n.opset >= 13);
    let axes = if from_input {
        match ins.get(1) {
            Some(v) if !v.is_none() => Some(v.ints()?),
            _ => None,
        }
    } else {
        n.ints("axes")?
    };
    let axes = axes.filter(|a| !a.is_empty());
    let noop = n.int_or("noop_with_empty_axes", 0)? != 0;
    if axes.is_none() && noop {
        return Ok(vec![ins[0].clone()]);
    }
    let all: Vec<i64> = (0..x.rank() as i64).collect();
    let dims = axes.unwrap_or(all);
    let d = Some(dims.as_slice());
    let empty = dims.iter().any(|&a| {
        x.dims().get(if a < 0 {
            (a + x.rank() as i64) as usize
        } else {
            a as usize
        }) == Some(&0)
    });
    // the maximum of nothing is -inf (false), the minimum +inf (true)
    let float_or_bool = x.dtype().is_float() || x.dtype() == DType::Bool;
    if empty && float_or_bool && matches!(n.op(), "ReduceMax" | "ReduceMin") {
        let max = n.op() == "ReduceMax";
        let fill = match (x.dtype() == DType::Bool, max) {
            (true, m) => (!m) as i64 as f64,
            (false, true) => f64::NEG_INFINITY,
            (false, false) => f64::INFINITY,
        };
        let dims = x.to_dtype(DType::F32)?.sum(d, keep)?.dims().to_vec();
        return t(Tensor::try_full(&dims, fill, x.dtype())?);
    }
    if empty && matches!(n.op(), "ReduceMax" | "ReduceMin") {
        return Err(n.unsupported(format!(
            "{} over an empty dim (shape {:?})",
            n.op(),
            x.dims()
        )));
    }
    t(match n.op() {
        "ReduceSum" => x.sum(d, keep)?,
        "ReduceMean" => x.mean(d, keep)?,
        "ReduceMax" => x.amax(d, keep)?,
        "ReduceMin" => x.amin(d, keep)?,
        "ReduceProd" => x.prod(d, keep)?,
        "ReduceLogSumExp" => x.logsumexp(&dims, keep)?,
        "ReduceSumSquare" => x.square()?.sum(d, keep)?,
        "ReduceL2" => x.square()?.sum(d, keep)?.sqrt()?,
        "ReduceL1" => x.abs()?.sum(d, keep)?,
        op => unreachable!("{op} is not a reduction"),
    })
}

/// Softmax/LogSoftmax: before opset 13 over the input flattened to 2-D at `axis`.
fn softmax(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let x = input(n, ins, 0)?;
    let log = n.op() == "LogSoftmax";
    let r = x.rank() as i64;
    let f = |x: &Tensor, dim: i64| {
        if log {
            x.log_softmax(dim)
        } else {
            x.softmax(dim)
        }
    };
    if n.opset >= 13 {
        return t(f(&x, n.int_or("axis", -1)?)?);
    }
    let axis = n.int_or("axis", 1)?;
    let axis = if axis < 0 { axis + r } else { axis };
    if axis == r - 1 {
        return t(f(&x, -1)?);
    }
    let outer: usize = x.dims()[..axis as usize].iter().product();
    let flat = x.reshape(&[outer as i64, -1])?;
    let dims: Vec<i64> = x.dims().iter().map(|&d| d as i64).collect();
    t(f(&flat, 1)?.reshape(&dims)?)
}
