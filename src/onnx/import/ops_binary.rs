//! The importer's binary and variadic elementwise ops: arithmetic,
//! comparisons and logic with ONNX broadcasting (and the pre-opset-7
//! `broadcast`/`axis` form), shape arithmetic kept on the host, and
//! Max/Min/Sum/Mean over any number of inputs.

use super::attrs::Node;
use super::host::{Host, Value};
use super::ops::{input, t};
use crate::ir::BinaryOp;
use crate::{DType, Result, Tensor};

/// Before opset 7, `broadcast=1` with `axis` aligns `b` with `a` from `axis`
/// (PyTorch's old exporter wrote it); PRelu's slope aligns at dim 1.
pub(super) fn legacy_align(n: &Node, a: &Tensor, b: Tensor, default_axis: i64) -> Result<Tensor> {
    let axis = if n.op() == "PRelu" {
        // a per-channel slope of shape [C] applies along dim 1
        if b.rank() == 1 && a.rank() > 1 && b.dims()[0] == a.dims()[1] && b.dims()[0] != 1 {
            Some(default_axis)
        } else {
            None
        }
    } else {
        n.int("axis")?
    };
    match axis {
        Some(axis) if n.opset < 7 || n.op() == "PRelu" => {
            let axis = if axis < 0 {
                axis + a.rank() as i64
            } else {
                axis
            } as usize;
            let trailing = a.rank().saturating_sub(axis + b.rank());
            let mut dims: Vec<i64> = b.dims().iter().map(|&d| d as i64).collect();
            dims.extend(std::iter::repeat_n(1, trailing));
            b.reshape(&dims)
        }
        _ => Ok(b),
    }
}

fn host_binary(op: &str, a: &Host, b: &Host) -> Option<Host> {
    let f: fn(i64, i64) -> Option<i64> = match op {
        "Add" => |x, y| x.checked_add(y),
        "Sub" => |x, y| x.checked_sub(y),
        "Mul" => |x, y| x.checked_mul(y),
        "Div" => |x, y| x.checked_div(y),
        "Equal" => |x, y| Some((x == y) as i64),
        _ => return None,
    };
    let mut h = host_map(a, b, f)?;
    if op == "Equal" {
        h.dtype = DType::Bool;
    }
    Some(h)
}

/// `f` over two host integer tensors of one shape, or one of them a scalar.
pub(super) fn host_map(a: &Host, b: &Host, f: fn(i64, i64) -> Option<i64>) -> Option<Host> {
    let (dims, n) = if a.data.len() == b.data.len() && a.dims == b.dims {
        (a.dims.clone(), a.data.len())
    } else if b.data.len() == 1 && b.dims.len() <= a.dims.len() {
        (a.dims.clone(), a.data.len())
    } else if a.data.len() == 1 && a.dims.len() <= b.dims.len() {
        (b.dims.clone(), b.data.len())
    } else {
        return None;
    };
    let at = |h: &Host, i: usize| h.data[if h.data.len() == 1 { 0 } else { i }];
    let data = (0..n)
        .map(|i| f(at(a, i), at(b, i)))
        .collect::<Option<Vec<_>>>()?;
    Some(Host {
        dims,
        data,
        dtype: a.dtype,
    })
}

pub(super) fn binary(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    n.ignore(&["broadcast"]);
    if let (Some(a), Some(b)) = (ins[0].host(), ins.get(1).and_then(|v| v.host())) {
        if n.int("axis")?.is_none() {
            if let Some(h) = host_binary(n.op(), a, b) {
                return Ok(vec![Value::Host(h)]);
            }
        }
    }
    let a = input(n, ins, 0)?;
    let b = legacy_align(n, &a, input(n, ins, 1)?, 0)?;
    let int = |d: DType| !d.is_float() && d != DType::Bool;
    t(match n.op() {
        "Add" => a.add(&b)?,
        "Sub" => a.sub(&b)?,
        "Mul" => a.mul(&b)?,
        // ONNX integer division truncates: floor division, one up where the
        // signs differ and it is inexact
        "Div" if int(a.dtype()) && int(b.dtype()) => {
            let q = a.binary(BinaryOp::FloorDiv, &b)?;
            let r = a.binary(BinaryOp::Remainder, &b)?;
            let z = Tensor::zeros(&[], a.dtype());
            let signs = a.lt(&z)?.ne(&b.lt(&z)?)?;
            let fix = r.ne(&z)?.binary(BinaryOp::And, &signs)?;
            q.add(&fix.to_dtype(q.dtype())?)?
        }
        "Div" => a.div(&b)?,
        "Pow" => {
            let y = a.pow(&b.to_dtype(a.dtype())?)?;
            y.to_dtype(a.dtype())?
        }
        "Equal" => a.eq(&b)?,
        "Less" => a.lt(&b)?,
        "LessOrEqual" => a.le(&b)?,
        "Greater" => a.gt(&b)?,
        "GreaterOrEqual" => a.ge(&b)?,
        "And" => a.binary(BinaryOp::And, &b)?,
        "Or" => a.binary(BinaryOp::Or, &b)?,
        op => unreachable!("{op} is not binary"),
    })
}

pub(super) fn variadic(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let xs = (0..ins.len())
        .map(|i| input(n, ins, i))
        .collect::<Result<Vec<_>>>()?;
    let Some(first) = xs.first() else {
        return Err(n.err("needs at least one input"));
    };
    let mut acc = first.clone();
    for x in &xs[1..] {
        acc = match n.op() {
            "Max" => acc.maximum(x)?,
            "Min" => acc.minimum(x)?,
            _ => acc.add(x)?,
        };
    }
    if n.op() == "Mean" {
        acc = &acc * (1.0 / xs.len() as f64);
    }
    t(acc)
}
