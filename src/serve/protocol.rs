//! The Open Inference Protocol (KServe v2) JSON bodies: an infer request
//! checked against a model's inputs (every problem a 400 naming the input),
//! and the response written out.

use super::model::{ServableModel, TensorSpec};
use crate::DType;
use serde_json::Value;
use std::fmt::Write;

/// KServe's name for a dtype.
pub fn datatype_name(d: DType) -> &'static str {
    match d {
        DType::Bool => "BOOL",
        DType::U8 => "UINT8",
        DType::I8 => "INT8",
        DType::I16 => "INT16",
        DType::I32 => "INT32",
        DType::I64 => "INT64",
        DType::F16 => "FP16",
        DType::BF16 => "BF16",
        DType::F32 => "FP32",
        DType::F64 => "FP64",
    }
}

/// A checked infer request: each model input's rows (in the model's order).
#[derive(Debug)]
pub struct InferRequest {
    pub id: Option<String>,
    pub rows: usize,
    pub inputs: Vec<Vec<f32>>,
    /// The outputs to return (indices into the model's outputs).
    pub outputs: Vec<usize>,
}

/// Parses and checks an infer body. The error is the 400 message.
pub fn parse_infer(
    body: &[u8],
    model: &dyn ServableModel,
    model_name: &str,
    max_rows: usize,
    allow_non_finite: bool,
) -> Result<InferRequest, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("malformed JSON: {e}"))?;
    let Value::Object(top) = v else {
        return Err("the request body must be a JSON object with `inputs`".into());
    };
    for k in top.keys() {
        if !matches!(k.as_str(), "id" | "parameters" | "inputs" | "outputs") {
            return Err(format!(
                "unknown request field `{k}` (expected id, parameters, inputs, outputs)"
            ));
        }
    }
    let id = match top.get("id") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("`id` must be a string".into()),
    };
    let Some(Value::Array(given)) = top.get("inputs") else {
        return Err("`inputs` must be an array of tensors".into());
    };
    let specs = model.inputs();
    let mut inputs: Vec<Option<Vec<f32>>> = vec![None; specs.len()];
    let mut rows: Option<(usize, String)> = None;
    for (i, t) in given.iter().enumerate() {
        let Value::Object(t) = t else {
            return Err(format!("inputs[{i}] must be an object"));
        };
        let name = match t.get("name") {
            Some(Value::String(s)) => s.as_str(),
            _ => return Err(format!("inputs[{i}] has no string `name`")),
        };
        let Some(slot) = specs.iter().position(|s| s.name == name) else {
            let known: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            return Err(format!(
                "unexpected input `{name}`: model `{model_name}` takes {}",
                known.join(", ")
            ));
        };
        if inputs[slot].is_some() {
            return Err(format!("input `{name}` is given twice"));
        }
        for k in t.keys() {
            if !matches!(
                k.as_str(),
                "name" | "shape" | "datatype" | "data" | "parameters"
            ) {
                return Err(format!("input `{name}`: unknown field `{k}`"));
            }
        }
        let spec = &specs[slot];
        let (data, n) = parse_tensor(t, spec, max_rows, allow_non_finite, model_name)?;
        match &rows {
            Some((r, first)) if *r != n => {
                return Err(format!(
                    "input `{name}` has {n} rows (dim 0) but `{first}` has {r}"
                ));
            }
            _ => rows = Some((n, name.to_string())),
        }
        inputs[slot] = Some(data);
    }
    let missing: Vec<&str> = specs
        .iter()
        .zip(&inputs)
        .filter(|(_, d)| d.is_none())
        .map(|(s, _)| s.name.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "missing input `{}` (model `{model_name}` takes {})",
            missing.join("`, `"),
            specs
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let outputs = match top.get("outputs") {
        None => (0..model.outputs().len()).collect(),
        Some(Value::Array(o)) => {
            let mut idx = vec![];
            for (i, r) in o.iter().enumerate() {
                let name = r
                    .get("name")
                    .and_then(|n| n.as_str())
                    .ok_or_else(|| format!("outputs[{i}] has no string `name`"))?;
                let j = model
                    .outputs()
                    .iter()
                    .position(|s| s.name == name)
                    .ok_or_else(|| {
                        format!(
                            "unknown output `{name}` requested: model `{model_name}` returns {}",
                            model
                                .outputs()
                                .iter()
                                .map(|s| s.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })?;
                idx.push(j);
            }
            idx
        }
        Some(_) => return Err("`outputs` must be an array of {\"name\": ..}".into()),
    };
    Ok(InferRequest {
        id,
        rows: rows.map_or(0, |r| r.0),
        inputs: inputs
            .into_iter()
            .map(|d| d.expect("all present"))
            .collect(),
        outputs,
    })
}

/// One input tensor: its datatype, shape and data against `spec`; returns the values and rows.
fn parse_tensor(
    t: &serde_json::Map<String, Value>,
    spec: &TensorSpec,
    max_rows: usize,
    allow_non_finite: bool,
    model_name: &str,
) -> Result<(Vec<f32>, usize), String> {
    let name = &spec.name;
    let want_dt = datatype_name(spec.dtype);
    match t.get("datatype") {
        Some(Value::String(d)) if d == want_dt => {}
        Some(Value::String(d)) => {
            return Err(format!(
                "input `{name}`: datatype {d}, but the model takes {want_dt}"
            ))
        }
        _ => {
            return Err(format!(
                "input `{name}` has no string `datatype` (the model takes {want_dt})"
            ))
        }
    }
    let Some(Value::Array(shape)) = t.get("shape") else {
        return Err(format!("input `{name}` has no `shape` array"));
    };
    let shape: Vec<usize> = shape
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            format!(
                "input `{name}`: shape {} must hold non-negative integers",
                Value::Array(shape.clone())
            )
        })?;
    let want = spec.shape();
    let fits = shape.len() == spec.dims.len()
        && spec
            .dims
            .iter()
            .zip(&shape)
            .all(|(d, s)| d.is_none_or(|d| d == *s));
    if !fits {
        return Err(format!("input `{name}`: shape {shape:?} does not match the model's {want:?} (-1: any batch size)"));
    }
    let rows = shape[0];
    if rows == 0 || rows > max_rows {
        return Err(format!(
            "input `{name}`: batch size {rows} must be between 1 and max_batch_size {max_rows}"
        ));
    }
    let count: usize = shape.iter().product();
    let Some(data) = t.get("data") else {
        return Err(format!("input `{name}` has no `data`"));
    };
    let mut values = Vec::with_capacity(count);
    flatten(data, &mut values, name, count)?;
    if values.len() != count {
        return Err(format!(
            "input `{name}`: shape {shape:?} holds {count} values but `data` has {}",
            values.len()
        ));
    }
    if !allow_non_finite {
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(format!("input `{name}`: element {i} is {} (not finite); model `{model_name}` does not accept NaN or Inf", values[i]));
        }
    }
    Ok((values, rows))
}

/// Flattens nested JSON arrays of numbers (row-major); `"NaN"`, `"Inf"`,
/// `"-Inf"` strings stand for the values JSON cannot write.
fn flatten(v: &Value, out: &mut Vec<f32>, name: &str, limit: usize) -> Result<(), String> {
    match v {
        Value::Array(items) => {
            for it in items {
                flatten(it, out, name, limit)?;
                if out.len() > limit {
                    return Err(format!(
                        "input `{name}`: `data` has more values than its shape's {limit}"
                    ));
                }
            }
            Ok(())
        }
        Value::Number(n) => {
            let f = n
                .as_f64()
                .ok_or_else(|| format!("input `{name}`: {n} is not a number FP32 holds"))?;
            out.push(f as f32);
            Ok(())
        }
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "nan" => Ok(out.push(f32::NAN)),
            "inf" | "+inf" | "infinity" => Ok(out.push(f32::INFINITY)),
            "-inf" | "-infinity" => Ok(out.push(f32::NEG_INFINITY)),
            _ => Err(format!(
                "input `{name}`: element {} is the string {s:?}, not a number",
                out.len()
            )),
        },
        other => Err(format!(
            "input `{name}`: element {} is {other}, not a number",
            out.len()
        )),
    }
}

fn json_str(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// The infer response body.
pub fn infer_response(
    model_name: &str,
    version: u64,
    id: Option<&str>,
    outputs: &[(&TensorSpec, &[usize], &[f32])],
) -> String {
    let mut s = String::with_capacity(64 + outputs.iter().map(|o| o.2.len() * 12).sum::<usize>());
    let _ = write!(
        s,
        "{{\"model_name\":{},\"model_version\":\"{version}\"",
        json_str(model_name)
    );
    if let Some(id) = id {
        let _ = write!(s, ",\"id\":{}", json_str(id));
    }
    s.push_str(",\"outputs\":[");
    for (i, (spec, dims, data)) in outputs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            "{{\"name\":{},\"datatype\":\"{}\",\"shape\":{:?},\"data\":[",
            json_str(&spec.name),
            datatype_name(spec.dtype),
            dims
        );
        for (j, v) in data.iter().enumerate() {
            if j > 0 {
                s.push(',');
            }
            if v.is_finite() {
                let _ = write!(s, "{v}");
            } else {
                let _ = write!(
                    s,
                    "\"{}\"",
                    if v.is_nan() {
                        "NaN"
                    } else if *v > 0.0 {
                        "Inf"
                    } else {
                        "-Inf"
                    }
                );
            }
        }
        s.push_str("]}");
    }
    s.push_str("]}");
    s
}

/// `GET /v2/models/{m}` metadata.
pub fn metadata(model_name: &str, versions: &[u64], model: &dyn ServableModel) -> Value {
    let specs = |ss: &[TensorSpec]| -> Vec<Value> {
        ss.iter()
            .map(|s| serde_json::json!({"name": s.name, "datatype": datatype_name(s.dtype), "shape": s.shape()}))
            .collect()
    };
    serde_json::json!({
        "name": model_name,
        "versions": versions.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
        "platform": "kiln",
        "inputs": specs(model.inputs()),
        "outputs": specs(model.outputs()),
    })
}
