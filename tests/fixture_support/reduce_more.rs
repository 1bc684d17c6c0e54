//! Maps the `reduce_more` suite's cases (scans, sorts, order statistics,
//! any/all, norms, var_mean/std_mean, aminmax, nansum/nanmean) onto kiln's API.

use super::Case;
use kiln::{DType, NormOrd, Result, Tensor};
use serde_json::Value;

/// `dim` as a list (None for null or absent).
fn dims(a: &Value) -> Option<Vec<i64>> {
    match &a["dim"] {
        Value::Array(v) => Some(v.iter().map(|x| x.as_i64().unwrap()).collect()),
        Value::Number(n) => Some(vec![n.as_i64().unwrap()]),
        _ => None,
    }
}

fn dim(a: &Value) -> i64 {
    a["dim"].as_i64().unwrap_or(-1)
}

fn keep(a: &Value) -> bool {
    a["keepdim"] == true
}

fn dtype(a: &Value) -> Result<Option<DType>> {
    a["dtype"].as_str().map(DType::parse).transpose()
}

/// A norm order: a number, `"inf"`, `"-inf"` or `"fro"` (2).
fn ord(v: &Value) -> NormOrd {
    match v {
        Value::String(s) if s == "inf" => NormOrd::Inf,
        Value::String(s) if s == "-inf" => NormOrd::NegInf,
        Value::String(_) => NormOrd::P(2.0),
        v => NormOrd::from_f64(v.as_f64().unwrap_or(2.0)),
    }
}

fn pair(r: Result<(Tensor, Tensor)>) -> Result<Vec<Tensor>> {
    r.map(|(a, b)| vec![a, b])
}

/// The case's result, or `None` when `op` is not one of this suite's ops.
pub fn run(c: &Case, op: &str, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>>> {
    let a = &c.attrs;
    let x = inputs.first()?;
    let one = |t: Result<Tensor>| t.map(|t| vec![t]);
    let k = a["k"].as_u64().unwrap_or(1) as usize;
    let correction = a["correction"].as_f64().unwrap_or(1.0);
    Some(match op {
        "cumsum" => dtype(a)
            .and_then(|dt| x.cumsum(dim(a), dt))
            .map(|t| vec![t]),
        "cumprod" => dtype(a)
            .and_then(|dt| x.cumprod(dim(a), dt))
            .map(|t| vec![t]),
        "logcumsumexp" => one(x.logcumsumexp(dim(a))),
        "cummax" => pair(x.cummax(dim(a))),
        "cummin" => pair(x.cummin(dim(a))),
        "sort" => pair(x.sort(dim(a), a["descending"] == true)),
        "argsort" => one(x.argsort(dim(a), a["descending"] == true)),
        "topk" => pair(x.topk(k, dim(a), a["largest"] != false)),
        "kthvalue" => pair(x.kthvalue(k, dim(a), keep(a))),
        "median" if a["dim"].is_null() => one(x.median()),
        "median" => pair(x.median_dim(dim(a), keep(a))),
        "nanmedian" => pair(x.nanmedian_dim(dim(a), keep(a))),
        "mode" => pair(x.mode(dim(a), keep(a))),
        "any" => one(x.any(dims(a).as_deref(), keep(a))),
        "all" => one(x.all(dims(a).as_deref(), keep(a))),
        "count_nonzero" => one(x.count_nonzero(dims(a).as_deref())),
        "vector_norm" => one(x.vector_norm(ord(&a["ord"]), dims(a).as_deref(), keep(a))),
        "norm" => one(x.vector_norm(ord(&a["p"]), dims(a).as_deref(), keep(a))),
        "var_mean" => pair(x.var_mean(&dims(a).unwrap_or_default(), correction, keep(a))),
        "std_mean" => pair(x.std_mean(&dims(a).unwrap_or_default(), correction, keep(a))),
        "aminmax" => pair(x.aminmax(dims(a).as_deref(), keep(a))),
        "nansum" => one(x.nansum(dims(a).as_deref(), keep(a))),
        "nanmean" => one(x.nanmean(dims(a).as_deref(), keep(a))),
        _ => return None,
    })
}
