//! Maps the `views_more` suite's cases (triangles, flips and rolls,
//! repeats, strided views, padding, scatters and index writes, masked ops,
//! data-dependent ops, factories, splits, broadcasts) onto kiln's API.

use super::ops_more::{req, role};
use super::Case;
use kiln::functional as F;
use kiln::nn::PaddingMode;
use kiln::{DType, Result, Scalar, ScatterReduce, Tensor};
use serde_json::Value;

fn int(a: &Value, k: &str) -> i64 {
    a[k].as_i64().unwrap_or(0)
}

fn ints(v: &Value) -> Vec<i64> {
    match v {
        Value::Array(a) => a.iter().map(|x| x.as_i64().unwrap()).collect(),
        Value::Number(n) => vec![n.as_i64().unwrap()],
        _ => vec![],
    }
}

fn usizes(v: &Value) -> Vec<usize> {
    ints(v).into_iter().map(|x| x as usize).collect()
}

fn num(a: &Value, k: &str) -> f64 {
    a[k].as_f64().unwrap_or(0.0)
}

/// The dtype named in `attrs.dtype` (`"torch.float64"` or `"float64"`), if any.
fn dtype(a: &Value) -> Result<Option<DType>> {
    a["dtype"]
        .as_str()
        .map(|s| DType::parse(s.trim_start_matches("torch.")))
        .transpose()
}

/// A Python number's dtype: int64 for ints, float32 for floats, bool for bools.
fn number_dtype(v: &Value) -> DType {
    match v {
        Value::Bool(_) => DType::Bool,
        Value::Number(n) if n.is_i64() => DType::I64,
        _ => DType::F32,
    }
}

fn as_f64(v: &Value) -> f64 {
    match v {
        Value::Bool(b) => f64::from(u8::from(*b)),
        v => v.as_f64().unwrap_or(0.0),
    }
}

/// The case's result, or `None` when `op` is not one of this suite's ops.
pub fn run(c: &Case, op: &str, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>>> {
    let r = match factory(c, op) {
        Some(r) => r,
        None => with_input(c, op, inputs)?,
    };
    Some(r)
}

/// Ops without tensor inputs.
fn factory(c: &Case, op: &str) -> Option<Result<Vec<Tensor>>> {
    let a = &c.attrs;
    let go = || -> Result<Tensor> {
        let all_int = ["start", "end", "step"]
            .iter()
            .all(|k| a[*k].is_i64() || a[*k].is_null());
        let default = if all_int && op == "arange" {
            DType::I64
        } else {
            DType::F32
        };
        let dt = dtype(a)?.unwrap_or(default);
        match op {
            "arange" => Tensor::arange_step(
                num(a, "start"),
                num(a, "end"),
                a["step"].as_f64().unwrap_or(1.0),
                dt,
            ),
            "linspace" => {
                Tensor::linspace(num(a, "start"), num(a, "end"), int(a, "steps") as usize, dt)
            }
            "logspace" => Tensor::logspace(
                num(a, "start"),
                num(a, "end"),
                int(a, "steps") as usize,
                a["base"].as_f64().unwrap_or(10.0),
                dt,
            ),
            "eye" => {
                let n = int(a, "n") as usize;
                Tensor::eye(n, a["m"].as_u64().map_or(n, |m| m as usize), dt)
            }
            _ => {
                let v = &a["fill_value"];
                let dt = dtype(a)?.unwrap_or(number_dtype(v));
                Ok(Tensor::full(&usizes(&a["size"]), as_f64(v), dt))
            }
        }
    };
    matches!(op, "arange" | "linspace" | "logspace" | "eye" | "full").then(|| go().map(|t| vec![t]))
}

fn with_input(c: &Case, op: &str, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>>> {
    let a = &c.attrs;
    let go = || -> Result<Option<Vec<Tensor>>> {
        let x = || req(c, inputs, "input").or_else(|_| req(c, inputs, "self"));
        let one = |t: Tensor| Ok(Some(vec![t]));
        match op {
            "tril" => one(x()?.tril(int(a, "diagonal"))?),
            "triu" => one(x()?.triu(int(a, "diagonal"))?),
            "flip" => one(x()?.flip(&ints(&a["dims"]))?),
            "roll" => one(x()?.roll(&ints(&a["shifts"]), &ints(&a["dims"]))?),
            "repeat" => one(x()?.repeat(&usizes(&a["repeats"]))?),
            "tile" => one(x()?.tile(&usizes(&a["dims"]))?),
            "repeat_interleave" => one(match role(c, inputs, "repeats") {
                Some(r) => x()?.repeat_interleave_tensor(
                    r,
                    int(a, "dim"),
                    a["output_size"].as_u64().map(|s| s as usize),
                )?,
                None => x()?.repeat_interleave(int(a, "repeats") as usize, a["dim"].as_i64())?,
            }),
            "unflatten" => one(x()?.unflatten(int(a, "dim"), &ints(&a["sizes"]))?),
            "movedim" => one(x()?.movedim(&ints(&a["source"]), &ints(&a["destination"]))?),
            "diagonal" => one(x()?.diagonal(int(a, "offset"), int(a, "dim1"), int(a, "dim2"))?),
            "diag_embed" => {
                one(x()?.diag_embed(int(a, "offset"), int(a, "dim1"), int(a, "dim2"))?)
            }
            "unbind" => Ok(Some(x()?.unbind(int(a, "dim"))?)),
            "one_hot" => one(x()?.one_hot(
                a["num_classes"]
                    .as_i64()
                    .filter(|&n| n >= 0)
                    .map(|n| n as usize),
            )?),
            "pad" => {
                let mode = match a["mode"].as_str().unwrap_or("constant") {
                    "constant" => PaddingMode::Zeros,
                    m => PaddingMode::from_name(m)?,
                };
                one(F::pad(
                    x()?,
                    &ints(&a["pad"]),
                    mode,
                    a["value"].as_f64().unwrap_or(0.0),
                )?)
            }
            "unfold" if c.op == "torch.Tensor.unfold" => one(x()?.unfold(
                int(a, "dimension"),
                int(a, "size") as usize,
                int(a, "step") as usize,
            )?),
            "tensor_split" => Ok(Some(match a["sections"].as_u64() {
                Some(s) => x()?.tensor_split(s as usize, int(a, "dim"))?,
                None => x()?.tensor_split_at(&ints(&a["indices"]), int(a, "dim"))?,
            })),
            "narrow_copy" => {
                one(x()?.narrow_copy(int(a, "dim"), int(a, "start"), int(a, "length") as usize)?)
            }
            "expand_as" => one(x()?.expand_as(req(c, inputs, "other")?)?),
            "broadcast_to" => one(x()?.broadcast_to(&usizes(&a["size"]))?),
            "meshgrid" => {
                let ts: Vec<&Tensor> = inputs.iter().collect();
                Ok(Some(Tensor::meshgrid(&ts, a["indexing"] == "xy")?))
            }
            "full_like" => one(x()?.full_like(as_f64(&a["fill_value"]), dtype(a)?)?),
            "zeros_like" => one(x()?.zeros_like(dtype(a)?)?),
            "ones_like" => one(x()?.ones_like(dtype(a)?)?),
            "nonzero" | "argwhere" => one(x()?.nonzero()?),
            "where" => where_(c, inputs).map(Some),
            _ => indexed(c, op, inputs).map(|r| r.map(|t| vec![t])),
        }
    };
    go().transpose()
}

/// `torch.where` with Python scalars, or with only a condition.
fn where_(c: &Case, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    let a = &c.attrs;
    let cond = req(c, inputs, "condition")?;
    let (t_in, t_other) = (role(c, inputs, "input"), role(c, inputs, "other"));
    let scalar = |k: &str| match &a[k] {
        Value::Bool(b) => Scalar::Bool(*b),
        Value::Number(n) if n.is_i64() => Scalar::Int(n.as_i64().unwrap()),
        v => Scalar::Float(as_f64(v)),
    };
    Ok(vec![match (t_in, t_other) {
        (None, Some(o)) => Tensor::where_scalar(&cond.logical_not()?, o, scalar("input"))?,
        (Some(i), None) => Tensor::where_scalar(cond, i, scalar("other"))?,
        (None, None) if a["input"].is_null() => return cond.nonzero_tuple(),
        (None, None) => {
            let dt = kiln::ir::promote_types(number_dtype(&a["input"]), number_dtype(&a["other"]));
            let full =
                Tensor::full(cond.dims(), as_f64(&a["input"]), dt).to_device(cond.device())?;
            Tensor::where_scalar(cond, &full, scalar("other"))?
        }
        (Some(i), Some(o)) => Tensor::where_(cond, i, o)?,
    }])
}

/// Scatters, index writes, masked ops, gathers.
fn indexed(c: &Case, op: &str, inputs: &[Tensor]) -> Result<Option<Tensor>> {
    let a = &c.attrs;
    // an op without an `input` is another suite's (losses name theirs)
    let Some(x) = role(c, inputs, "input") else {
        return Ok(None);
    };
    let dim = int(a, "dim");
    let index = || req(c, inputs, "index");
    Ok(Some(match op {
        "scatter" => match (role(c, inputs, "src"), a["reduce"].as_str()) {
            (Some(s), Some(r)) => {
                x.scatter_reduce(dim, index()?, s, ScatterReduce::parse(r)?, true)?
            }
            (Some(s), None) => x.scatter(dim, index()?, s)?,
            (None, _) => x.scatter_value(dim, index()?, num(a, "value"))?,
        },
        "scatter_reduce" => x.scatter_reduce(
            dim,
            index()?,
            req(c, inputs, "src")?,
            ScatterReduce::parse(a["reduce"].as_str().unwrap_or("sum"))?,
            a["include_self"] != false,
        )?,
        "scatter_add" => x.scatter_add(dim, index()?, req(c, inputs, "src")?)?,
        "index_add" => x.index_add(
            dim,
            index()?,
            req(c, inputs, "source")?,
            a["alpha"].as_f64().unwrap_or(1.0),
        )?,
        "index_copy" => x.index_copy(dim, index()?, req(c, inputs, "source")?)?,
        "index_fill" => x.index_fill(dim, index()?, num(a, "value"))?,
        "index_put" => {
            let idx: Vec<&Tensor> = (0..)
                .map_while(|k| role(c, inputs, &format!("indices[{k}]")))
                .collect();
            x.index_put(&idx, req(c, inputs, "values")?, a["accumulate"] == true)?
        }
        "masked_scatter" => x.masked_scatter(req(c, inputs, "mask")?, req(c, inputs, "source")?)?,
        "masked_select" => x.masked_select(req(c, inputs, "mask")?)?,
        "take" => x.take(index()?)?,
        "take_along_dim" => x.take_along_dim(req(c, inputs, "indices")?, a["dim"].as_i64())?,
        _ => return Ok(None),
    }))
}
