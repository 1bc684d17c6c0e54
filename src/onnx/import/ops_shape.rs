//! Imported shape and data-movement ops. Each keeps a host value on the
//! host when its inputs are (shape arithmetic), and otherwise runs kiln's
//! view and copy ops.

use super::attrs::Node;
use super::host::{Host, Value};
use super::ops::input;
use crate::{DType, Result, Tensor};

fn t(v: Tensor) -> Result<Vec<Value>> {
    Ok(vec![Value::T(v)])
}

fn host(h: Host) -> Result<Vec<Value>> {
    Ok(vec![Value::Host(h)])
}

/// `axis` normalised against `rank` (negative counts from the end).
fn norm(n: &Node, axis: i64, rank: usize) -> Result<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a as usize >= rank.max(1) {
        return Err(n.err(format!("axis {axis} out of range for rank {rank}")));
    }
    Ok(a as usize)
}

/// The ints of optional input `i`, or of attribute `attr` before `since`.
fn ints_arg(n: &Node, ins: &[Value], i: usize, attr: &str, since: i64) -> Result<Option<Vec<i64>>> {
    if n.opset < since {
        return n.ints(attr);
    }
    match ins.get(i) {
        Some(v) if !v.is_none() => Ok(Some(v.ints()?)),
        _ => Ok(None),
    }
}

pub(crate) fn run(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    match n.op() {
        "Shape" => {
            let d: Vec<i64> = ins[0].dims().iter().map(|&d| d as i64).collect();
            let r = d.len() as i64;
            let clip = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let s = clip(n.int_or("start", 0)?);
            let e = clip(n.int_or("end", r)?);
            host(Host::vec(d[s..e.max(s)].to_vec()))
        }
        "Size" => host(Host::scalar(
            ins[0].dims().iter().product::<usize>() as i64,
            DType::I64,
        )),
        "Constant" => constant(n),
        "ConstantOfShape" => {
            let dims: Vec<usize> = ins[0].ints()?.iter().map(|d| *d as usize).collect();
            let (value, dtype) = match n.tensor("value")? {
                Some(p) => {
                    let v = crate::onnx::tensor::from_proto(p)?;
                    (v.to_f64_vec().first().copied().unwrap_or(0.0), v.dtype())
                }
                None => (0.0, DType::F32),
            };
            if !dtype.is_float() && dims.iter().product::<usize>() <= 64 {
                let len = dims.iter().product();
                return host(Host {
                    dims,
                    data: vec![value as i64; len],
                    dtype,
                });
            }
            t(Tensor::full(&dims, value, dtype))
        }
        "Reshape" => reshape(n, ins),
        "Flatten" => {
            let d = ins[0].dims();
            let axis = n.int_or("axis", 1)?;
            let axis = if axis < 0 {
                axis + d.len() as i64
            } else {
                axis
            } as usize;
            let outer: usize = d[..axis.min(d.len())].iter().product();
            let inner: usize = d[axis.min(d.len())..].iter().product();
            relayout(&ins[0], vec![outer, inner])
        }
        "Squeeze" => {
            let d = ins[0].dims();
            let axes = ints_arg(n, ins, 1, "axes", 13)?;
            let drop: Vec<usize> = match axes {
                Some(a) => a
                    .iter()
                    .map(|x| norm(n, *x, d.len()))
                    .collect::<Result<_>>()?,
                None => (0..d.len()).filter(|i| d[*i] == 1).collect(),
            };
            if let Some(i) = drop.iter().find(|i| d[**i] != 1) {
                return Err(n.err(format!(
                    "cannot squeeze dim {i} of size {} (shape {d:?})",
                    d[*i]
                )));
            }
            let dims = (0..d.len())
                .filter(|i| !drop.contains(i))
                .map(|i| d[i])
                .collect();
            relayout(&ins[0], dims)
        }
        "Unsqueeze" => {
            let d = ins[0].dims();
            let axes =
                ints_arg(n, ins, 1, "axes", 13)?.ok_or_else(|| n.err("`axes` is required"))?;
            let r = d.len() + axes.len();
            let mut axes: Vec<usize> =
                axes.iter().map(|a| norm(n, *a, r)).collect::<Result<_>>()?;
            axes.sort();
            let mut dims = d.clone();
            for a in axes {
                dims.insert(a, 1);
            }
            relayout(&ins[0], dims)
        }
        "Transpose" => {
            let x = input(n, ins, 0)?;
            let perm = n
                .ints("perm")?
                .unwrap_or_else(|| (0..x.rank() as i64).rev().collect());
            t(x.permute(&perm)?)
        }
        "Concat" => concat(n, ins),
        "Slice" => slice(n, ins),
        "Gather" => gather(n, ins),
        "Split" => split(n, ins),
        "Expand" => {
            let x = input(n, ins, 0)?;
            let shape = ins
                .get(1)
                .ok_or_else(|| n.err("input `shape` is required"))?
                .ints()?;
            // numpy-style: broadcast the two shapes (a 1 in `shape` keeps x's size)
            let r = x.rank().max(shape.len());
            let xd: Vec<i64> = std::iter::repeat_n(1, r - x.rank())
                .chain(x.dims().iter().map(|&d| d as i64))
                .collect();
            let sd: Vec<i64> = std::iter::repeat_n(1, r - shape.len())
                .chain(shape.iter().copied())
                .collect();
            let out: Vec<usize> = xd
                .iter()
                .zip(&sd)
                .map(|(a, b)| (*a).max(*b) as usize)
                .collect();
            t(x.expand_to(&out)?.contiguous()?)
        }
        "Tile" => {
            let x = input(n, ins, 0)?;
            let reps = ins
                .get(1)
                .ok_or_else(|| n.err("input `repeats` is required"))?
                .ints()?;
            if reps.len() != x.rank() {
                return Err(n.err(format!(
                    "{} repeats for a rank-{} input",
                    reps.len(),
                    x.rank()
                )));
            }
            let mut y = x;
            for (d, &k) in reps.iter().enumerate() {
                if k != 1 {
                    let len = y.dims()[d];
                    let idx: Vec<i64> = (0..len * k as usize)
                        .map(|i| (i % len.max(1)) as i64)
                        .collect();
                    let m = idx.len();
                    y = y.index_select(d as i64, &Tensor::from_vec(idx, &[m])?)?;
                }
            }
            t(y)
        }
        "Range" => {
            let (s, l, d) = (
                ins[0].floats()?[0],
                ins[1].floats()?[0],
                ins[2].floats()?[0],
            );
            let count = ((l - s) / d).ceil().max(0.0) as usize;
            let dtype = ins[0].dtype();
            if !dtype.is_float() && count <= 64 {
                let data = (0..count).map(|i| (s + i as f64 * d) as i64).collect();
                return host(Host {
                    dims: vec![count],
                    data,
                    dtype,
                });
            }
            let v: Vec<f64> = (0..count).map(|i| s + i as f64 * d).collect();
            t(Tensor::from_vec(v, &[count])?.to_dtype(dtype)?)
        }
        op => Err(n.err(format!("op `{op}` has no implementation"))),
    }
}

fn constant(n: &Node) -> Result<Vec<Value>> {
    if let Some(p) = n.tensor("value")? {
        return Ok(vec![Value::constant(crate::onnx::tensor::from_proto(p)?)]);
    }
    if let Some(f) = n.floats("value_floats")? {
        let len = f.len();
        return t(Tensor::from_vec(f, &[len])?);
    }
    if let Some(v) = n.ints("value_ints")? {
        return host(Host::vec(v));
    }
    if let Some(i) = n.int("value_int")? {
        return host(Host::scalar(i, DType::I64));
    }
    let f = n.float_or("value_float", f64::NAN)?;
    if n.has("value_float") {
        return t(Tensor::from_vec(vec![f as f32], &[])?);
    }
    n.ignore(&["sparse_value", "value_string", "value_strings"]);
    Err(n.unsupported("a Constant without a dense numeric value"))
}

/// The same elements under new dims (host values stay on the host).
fn relayout(v: &Value, dims: Vec<usize>) -> Result<Vec<Value>> {
    match v {
        Value::Host(h) => host(Host { dims, ..h.clone() }),
        other => {
            let d: Vec<i64> = dims.iter().map(|&x| x as i64).collect();
            t(other.tensor()?.reshape(&d)?)
        }
    }
}

fn reshape(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let shape = if n.opset < 5 {
        n.ints("shape")?
            .ok_or_else(|| n.err("attribute `shape` is required"))?
    } else {
        ins.get(1)
            .ok_or_else(|| n.err("input `shape` is required"))?
            .ints()?
    };
    let allow_zero = n.int_or("allowzero", 0)? != 0;
    let d = ins[0].dims();
    let total: usize = d.iter().product();
    let mut out: Vec<i64> = shape
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            if s == 0 && !allow_zero {
                d.get(i).map_or(0, |&x| x as i64)
            } else {
                s
            }
        })
        .collect();
    if let Some(k) = out.iter().position(|&s| s == -1) {
        let known: i64 = out.iter().filter(|&&s| s != -1).product();
        if known == 0 || total as i64 % known != 0 {
            return Err(n.err(format!("cannot reshape {d:?} to {shape:?}")));
        }
        out[k] = total as i64 / known;
    }
    if out.iter().any(|&s| s < 0) || out.iter().product::<i64>() != total as i64 {
        return Err(n.err(format!("cannot reshape {d:?} to {shape:?}")));
    }
    relayout(&ins[0], out.iter().map(|&s| s as usize).collect())
}

fn concat(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let axis = n.int_or("axis", if n.opset < 4 { 1 } else { i64::MIN })?;
    if axis == i64::MIN {
        return Err(n.err("attribute `axis` is required"));
    }
    let parts: Vec<&Value> = ins.iter().filter(|v| !v.is_none()).collect();
    if parts
        .iter()
        .all(|v| v.host().is_some_and(|h| h.dims.len() == 1))
    {
        let dtype = parts.first().map_or(DType::I64, |v| v.dtype());
        let data: Vec<i64> = parts
            .iter()
            .flat_map(|v| v.host().unwrap().data.clone())
            .collect();
        return host(Host {
            dims: vec![data.len()],
            data,
            dtype,
        });
    }
    let ts = parts
        .iter()
        .map(|v| v.tensor())
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&Tensor> = ts.iter().collect();
    t(Tensor::cat(&refs, axis)?)
}

fn slice(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let d = ins[0].dims();
    let (starts, ends, axes, steps) = if n.opset < 10 {
        (
            n.ints("starts")?
                .ok_or_else(|| n.err("attribute `starts` is required"))?,
            n.ints("ends")?
                .ok_or_else(|| n.err("attribute `ends` is required"))?,
            n.ints("axes")?,
            None,
        )
    } else {
        (
            ins[1].ints()?,
            ins[2].ints()?,
            ints_arg(n, ins, 3, "", 0)?,
            ints_arg(n, ins, 4, "", 0)?,
        )
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(n.err("starts, ends, axes and steps differ in length"));
    }
    // host 1-d values slice on the host
    if let (Some(h), [axis]) = (ins[0].host(), axes.as_slice()) {
        if h.dims.len() == 1 && (*axis == 0 || *axis == -1) && steps[0] > 0 {
            let len = h.data.len() as i64;
            let c = |v: i64| (if v < 0 { v + len } else { v }).clamp(0, len);
            let (s, e) = (c(starts[0]), c(ends[0]));
            let data: Vec<i64> = (s..e.max(s))
                .step_by(steps[0] as usize)
                .map(|i| h.data[i as usize])
                .collect();
            return host(Host {
                dims: vec![data.len()],
                data,
                dtype: h.dtype,
            });
        }
    }
    let mut y = input(n, ins, 0)?;
    for k in 0..starts.len() {
        let a = norm(n, axes[k], d.len())?;
        let len = d[a] as i64;
        let step = steps[k];
        if step == 0 {
            return Err(n.err("Slice step 0"));
        }
        if step < 0 {
            // numpy semantics: from start down to (not including) end, clamped to [-1, len-1]
            let c = |v: i64| (if v < 0 { v + len } else { v }).clamp(-1, len - 1);
            let (s, e) = (c(starts[k]), c(ends[k]));
            let idx: Vec<i64> = (e + 1..=s).rev().step_by((-step) as usize).collect();
            let m = idx.len();
            y = y.index_select(a as i64, &Tensor::from_vec(idx, &[m])?)?;
            continue;
        }
        let c = |v: i64| (if v < 0 { v + len } else { v }).clamp(0, len);
        let (s, e) = (c(starts[k]), c(ends[k]));
        y = y.slice(a as i64, Some(s), Some(e.max(s)), step)?;
    }
    t(y)
}

fn gather(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let axis = n.int_or("axis", 0)?;
    let d = ins[0].dims();
    let a = norm(n, axis, d.len())?;
    let idx = &ins[1];
    let len = d[a] as i64;
    let fix = |i: i64| if i < 0 { i + len } else { i };
    if let (Some(h), Some(ih)) = (ins[0].host(), idx.host()) {
        if h.dims.len() == 1 {
            let data = ih
                .data
                .iter()
                .map(|&i| {
                    h.data
                        .get(fix(i) as usize)
                        .copied()
                        .ok_or_else(|| n.err(format!("index {i} out of range for {len}")))
                })
                .collect::<Result<Vec<_>>>()?;
            return host(Host {
                dims: ih.dims.clone(),
                data,
                dtype: h.dtype,
            });
        }
    }
    let x = input(n, ins, 0)?;
    let id = idx.dims();
    let flat = match idx {
        Value::Host(h) => {
            let v: Vec<i64> = h.data.iter().map(|&i| fix(i)).collect();
            if let Some(bad) = v.iter().find(|&&i| i < 0 || i >= len) {
                return Err(n.err(format!(
                    "index {bad} out of range for dim {a} of size {len}"
                )));
            }
            let count = v.len();
            Tensor::from_vec(v, &[count])?
        }
        // indices computed by the graph stay tensors (traceable): negative ones wrap
        other => {
            let i = other.tensor()?.to_dtype(DType::I64)?.reshape(&[-1])?;
            let neg = i.lt(&Tensor::zeros(&[], DType::I64))?;
            Tensor::where_(
                &neg,
                &i.binary_scalar(crate::ir::BinaryOp::Add, len, false)?,
                &i,
            )?
        }
    };
    let picked = x.index_select(a as i64, &flat)?;
    let mut dims: Vec<i64> = d[..a].iter().map(|&v| v as i64).collect();
    dims.extend(id.iter().map(|&v| v as i64));
    dims.extend(d[a + 1..].iter().map(|&v| v as i64));
    t(picked.reshape(&dims)?)
}

fn split(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let x = input(n, ins, 0)?;
    let axis = norm(n, n.int_or("axis", 0)?, x.rank())?;
    let len = x.dims()[axis];
    let outs = n.proto.output.len();
    let sizes = match ints_arg(n, ins, 1, "split", 13)? {
        Some(s) => s.iter().map(|v| *v as usize).collect(),
        None => {
            let parts = n.int_or("num_outputs", outs as i64)? as usize;
            let chunk = len.div_ceil(parts.max(1));
            (0..parts)
                .map(|i| chunk.min(len.saturating_sub(i * chunk)))
                .collect::<Vec<_>>()
        }
    };
    if sizes.iter().sum::<usize>() != len {
        return Err(n.err(format!("split sizes {sizes:?} do not add up to {len}")));
    }
    Ok(x.split_sizes(&sizes, axis as i64)?
        .into_iter()
        .map(Value::T)
        .collect())
}
