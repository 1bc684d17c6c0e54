//! Imported sequence ops (opset 11+): a sequence is a list of kiln tensors
//! between nodes (`Value::Seq`); graph inputs and outputs stay tensors.
//! SequenceEmpty, SequenceConstruct, SequenceInsert, SequenceErase,
//! SequenceAt, SequenceLength, ConcatFromSequence, SplitToSequence.

use super::attrs::Node;
use super::host::{Host, Value};
use super::ops::input;
use crate::{DType, Result, Tensor};

fn seq(n: &Node, ins: &[Value], i: usize) -> Result<Vec<Tensor>> {
    match ins.get(i) {
        Some(Value::Seq(s)) => Ok(s.clone()),
        Some(v) if !v.is_none() => Err(n.err(format!("input {i} is a tensor, not a sequence"))),
        _ => Err(n.err(format!("input {i} (a sequence) is required"))),
    }
}

/// An optional scalar position input, resolved against `len` (`len + 1`
/// valid places when inserting).
fn position(n: &Node, ins: &[Value], i: usize, len: usize, insert: bool) -> Result<Option<usize>> {
    let Some(v) = ins.get(i).filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let p = *v
        .ints()?
        .first()
        .ok_or_else(|| n.err("position is empty"))?;
    // inclusive: inserting may append at `len`
    let max = if insert { len as i64 } else { len as i64 - 1 };
    let q = if p < 0 { p + len as i64 } else { p };
    if q < 0 || q > max {
        return Err(n.err(format!(
            "position {p} is out of range for a sequence of {len}"
        )));
    }
    Ok(Some(q as usize))
}

fn axis(n: &Node, a: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    if a < -r || a >= r {
        return Err(n.err(format!("axis {a} for a rank-{rank} tensor")));
    }
    Ok(if a < 0 { a + r } else { a } as usize)
}

/// Runs one sequence node.
pub(super) fn run(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let out = match n.op() {
        "SequenceEmpty" => {
            let _ = n.int("dtype")?;
            Value::Seq(vec![])
        }
        "SequenceConstruct" => Value::Seq(
            (0..ins.len())
                .map(|i| input(n, ins, i))
                .collect::<Result<_>>()?,
        ),
        "SequenceInsert" => {
            let mut s = seq(n, ins, 0)?;
            let t = input(n, ins, 1)?;
            let at = position(n, ins, 2, s.len(), true)?.unwrap_or(s.len());
            s.insert(at, t);
            Value::Seq(s)
        }
        "SequenceErase" => {
            let mut s = seq(n, ins, 0)?;
            if s.is_empty() {
                return Err(n.err("erase from an empty sequence"));
            }
            let at = position(n, ins, 1, s.len(), false)?.unwrap_or(s.len() - 1);
            s.remove(at);
            Value::Seq(s)
        }
        "SequenceAt" => {
            let s = seq(n, ins, 0)?;
            let at = position(n, ins, 1, s.len(), false)?
                .ok_or_else(|| n.err("input `position` is required"))?;
            Value::T(s[at].clone())
        }
        "SequenceLength" => Value::Host(Host::scalar(seq(n, ins, 0)?.len() as i64, DType::I64)),
        "ConcatFromSequence" => {
            let s = seq(n, ins, 0)?;
            let first = s.first().ok_or_else(|| n.err("an empty sequence"))?;
            let new_axis = n.int_or("new_axis", 0)? != 0;
            let a = n
                .int("axis")?
                .ok_or_else(|| n.err("attribute `axis` is required"))?;
            let k = axis(n, a, first.rank() + new_axis as usize)?;
            let parts: Vec<Tensor> = if new_axis {
                s.iter()
                    .map(|t| t.unsqueeze(k as i64))
                    .collect::<Result<_>>()?
            } else {
                s
            };
            let refs: Vec<&Tensor> = parts.iter().collect();
            Value::T(Tensor::cat(&refs, k as i64)?)
        }
        "SplitToSequence" => split_to_sequence(n, ins)?,
        op => unreachable!("{op} is not a sequence op"),
    };
    Ok(vec![out])
}

fn split_to_sequence(n: &Node, ins: &[Value]) -> Result<Value> {
    let x = input(n, ins, 0)?;
    let k = axis(n, n.int_or("axis", 0)?, x.rank())?;
    let len = x.dims()[k];
    let split = ins.get(1).filter(|v| !v.is_none());
    let sizes: Vec<usize> = match split {
        None => vec![1; len],
        Some(v) if v.dims().is_empty() => {
            let c = v.ints()?[0];
            if c < 1 {
                return Err(n.err(format!("split {c} must be positive")));
            }
            let c = c as usize;
            let mut s = vec![c; len / c];
            if len % c != 0 {
                s.push(len % c);
            }
            s
        }
        Some(v) => v.ints()?.iter().map(|s| *s as usize).collect(),
    };
    if sizes.iter().sum::<usize>() != len {
        return Err(n.err(format!("split {sizes:?} does not add up to {len}")));
    }
    let keep = split.is_some() || n.int_or("keepdims", 1)? != 0;
    let mut out = vec![];
    let mut start = 0;
    for s in sizes {
        let piece = x.narrow(k as i64, start as i64, s)?;
        start += s;
        out.push(if keep {
            piece
        } else {
            piece.squeeze(Some(&[k as i64]))?
        });
    }
    Ok(Value::Seq(out))
}
