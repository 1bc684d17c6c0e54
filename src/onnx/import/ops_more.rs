//! More imported ops that PyTorch's exporter writes for transformers and
//! detection heads: the remaining trigonometric and hyperbolic functions,
//! Round, IsNaN/IsInf, GatherElements, Trilu, CumSum and Mod.

use super::attrs::Node;
use super::host::Value;
use super::ops::input;
use crate::ir::{BinaryOp, UnaryOp};
use crate::{DType, Result, Tensor};

fn t(v: Tensor) -> Result<Vec<Value>> {
    Ok(vec![Value::T(v)])
}

/// Every op this file runs.
pub(super) const OPS: &[&str] = &[
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
    "CumSum",
    "Mod",
];

/// An axis attribute or input resolved against `rank`.
fn axis(n: &Node, a: i64, rank: usize) -> Result<i64> {
    let r = rank as i64;
    if a < -r || a >= r.max(1) {
        return Err(n.err(format!("axis {a} for a rank-{rank} input")));
    }
    Ok(if a < 0 { a + r } else { a })
}

/// Runs one node.
pub(super) fn run(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    if n.op() == "Mod" {
        return modulo(n, ins);
    }
    let x = input(n, ins, 0)?;
    let unary = |u: UnaryOp| -> Result<Vec<Value>> {
        if !x.dtype().is_float() {
            return Err(n.unsupported(format!("{} on {}", n.op(), x.dtype())));
        }
        t(x.unary(u)?)
    };
    match n.op() {
        "Tan" => unary(UnaryOp::Tan),
        "Asin" => unary(UnaryOp::Asin),
        "Acos" => unary(UnaryOp::Acos),
        "Atan" => unary(UnaryOp::Atan),
        "Sinh" => unary(UnaryOp::Sinh),
        "Cosh" => unary(UnaryOp::Cosh),
        // half to even, as ONNX rounds
        "Round" => {
            if !x.dtype().is_float() {
                return Err(n.unsupported(format!("Round on {}", x.dtype())));
            }
            t(x.round()?)
        }
        "IsNaN" => unary(UnaryOp::IsNan),
        "IsInf" => {
            let (neg, pos) = (
                n.int_or("detect_negative", 1)? != 0,
                n.int_or("detect_positive", 1)? != 0,
            );
            match (neg, pos) {
                (true, true) => unary(UnaryOp::IsInf),
                (false, true) => unary(UnaryOp::IsPosInf),
                (true, false) => unary(UnaryOp::IsNegInf),
                (false, false) => t(Tensor::zeros(x.dims(), DType::Bool)),
            }
        }
        "GatherElements" => {
            let a = axis(n, n.int_or("axis", 0)?, x.rank())?;
            let idx = input(n, ins, 1)?;
            // negative indices count from the end
            let len = Tensor::full(&[], x.dims()[a as usize] as f64, idx.dtype());
            let zero = Tensor::zeros(&[], idx.dtype());
            let idx = Tensor::where_(&idx.lt(&zero)?, &idx.add(&len)?, &idx)?;
            t(x.gather(a, &idx)?)
        }
        "Trilu" => {
            if x.rank() < 2 {
                return Err(n.err(format!("input of rank {} (at least 2)", x.rank())));
            }
            let k = match ins.get(1) {
                Some(v) if !v.is_none() => *v.ints()?.first().unwrap_or(&0),
                _ => 0,
            };
            if x.numel() == 0 {
                let _ = n.int_or("upper", 1)?;
                return t(x);
            }
            t(if n.int_or("upper", 1)? != 0 {
                x.triu(k)?
            } else {
                x.tril(k)?
            })
        }
        "CumSum" => {
            let a = match ins.get(1) {
                Some(v) if !v.is_none() => *v
                    .ints()?
                    .first()
                    .ok_or_else(|| n.err("input `axis` is empty"))?,
                _ => return Err(n.err("input `axis` is required")),
            };
            let a = axis(n, a, x.rank())?;
            let (exclusive, reverse) =
                (n.int_or("exclusive", 0)? != 0, n.int_or("reverse", 0)? != 0);
            let mut y = if reverse { x.flip(&[a])? } else { x.clone() };
            let len = y.dims()[a as usize];
            if exclusive && len > 0 {
                // shifted by one along the axis, a zero first: exact sums
                let mut dims = y.dims().to_vec();
                dims[a as usize] = 1;
                let zeros = Tensor::zeros(&dims, y.dtype());
                let head = y.narrow(a, 0, len - 1)?;
                y = Tensor::cat(&[&zeros, &head], a)?;
            }
            // kiln sums integers in i64 (as PyTorch does); ONNX keeps the dtype
            let y = y.cumsum(a, Some(x.dtype()))?.to_dtype(x.dtype())?;
            t(if reverse { y.flip(&[a])? } else { y })
        }
        op => unreachable!("{op} is not in ops_more"),
    }
}

/// ONNX `Mod`: `fmod=0` takes the divisor's sign (Python's `%`, kiln's
/// `remainder`), `fmod=1` the dividend's (C's `fmod`). Shape arithmetic (host
/// integers, as `nn.MultiheadAttention`'s export computes head sizes) stays
/// on the host.
fn modulo(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let fmod = n.int_or("fmod", 0)? != 0;
    if let (Some(a), Some(b)) = (ins[0].host(), ins.get(1).and_then(|v| v.host())) {
        let f: fn(i64, i64) -> Option<i64> = if fmod {
            |x, y| x.checked_rem(y)
        } else {
            |x, y| {
                x.checked_rem(y).map(|r| {
                    if r != 0 && (r < 0) != (y < 0) {
                        r + y
                    } else {
                        r
                    }
                })
            }
        };
        if let Some(h) = super::ops_binary::host_map(a, b, f) {
            return Ok(vec![Value::Host(h)]);
        }
    }
    let (a, b) = (input(n, ins, 0)?, input(n, ins, 1)?);
    let op = if fmod {
        BinaryOp::Fmod
    } else {
        BinaryOp::Remainder
    };
    t(a.binary(op, &b)?)
}
