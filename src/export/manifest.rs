//! The manifest section of a `.kiln` file: JSON holding everything but the
//! graph text and the weights.
//!
//! ```json
//! {"name": "forward", "kiln_version": "0.1.0",
//!  "dims": [{"name": "batch", "example": 4}],
//!  "inputs": [{"name": "input", "dtype": "f32", "shape": ["batch", 1, 8, 8]}],
//!  "outputs": [{"name": "output", "dtype": "f32", "shape": ["batch", 10]}],
//!  "graph_inputs": [{"arg": 0}, {"weight": "0.weight"}],
//!  "sites": [{"run": 12, "constant": 0, "coefs": [1]}]}
//! ```

use super::symbolic::{Affine, Site, Template};
use super::{Dim, ExportedModel, Source, TensorSpec};
use crate::{DType, Result, Tensor};
use kiln_ir::Error;
use serde_json::{json, Value};
use std::collections::BTreeMap;

fn spec_json(s: &TensorSpec) -> Value {
    let shape: Vec<Value> = s
        .dims
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => json!(n),
            Dim::Dynamic(e) => json!(e),
        })
        .collect();
    json!({"name": s.name, "dtype": s.dtype.to_string(), "shape": shape})
}

/// The manifest of `m`.
pub(super) fn write(m: &ExportedModel) -> String {
    let dims: Vec<Value> = m
        .dim_names
        .iter()
        .zip(&m.example_dims)
        .map(|(n, e)| json!({"name": n, "example": e}))
        .collect();
    let sources: Vec<Value> = m
        .sources
        .iter()
        .map(|s| match s {
            Source::Arg(i) => json!({"arg": i}),
            Source::Weight(k) => json!({"weight": k}),
        })
        .collect();
    let sites: Vec<Value> = m
        .template
        .sites
        .iter()
        .map(|s| json!({"run": s.run, "constant": s.expr.constant, "coefs": s.expr.coefs}))
        .collect();
    let v = json!({
        "name": m.name,
        "kiln_version": env!("CARGO_PKG_VERSION"),
        "dims": dims,
        "inputs": m.inputs.iter().map(spec_json).collect::<Vec<_>>(),
        "outputs": m.outputs.iter().map(spec_json).collect::<Vec<_>>(),
        "graph_inputs": sources,
        "sites": sites,
    });
    serde_json::to_string_pretty(&v).expect("json")
}

/// Reads fields with errors naming the file and the field.
struct Reader<'a> {
    path: &'a str,
}

impl Reader<'_> {
    fn err(&self, what: impl std::fmt::Display) -> Error {
        Error::op(
            "export::load",
            format!("{}: corrupt manifest: {what}", self.path),
        )
    }
    fn field<'v>(&self, v: &'v Value, key: &str) -> Result<&'v Value> {
        v.get(key).ok_or_else(|| self.err(format!("no `{key}`")))
    }
    fn str<'v>(&self, v: &'v Value, key: &str) -> Result<&'v str> {
        self.field(v, key)?
            .as_str()
            .ok_or_else(|| self.err(format!("`{key}` is not a string")))
    }
    fn int(&self, v: &Value, key: &str) -> Result<i64> {
        self.field(v, key)?
            .as_i64()
            .ok_or_else(|| self.err(format!("`{key}` is not an integer")))
    }
    fn list<'v>(&self, v: &'v Value, key: &str) -> Result<&'v Vec<Value>> {
        self.field(v, key)?
            .as_array()
            .ok_or_else(|| self.err(format!("`{key}` is not a list")))
    }
    fn spec(&self, v: &Value) -> Result<TensorSpec> {
        let name = self.str(v, "name")?.to_string();
        let dt = self.str(v, "dtype")?;
        let dtype = DType::parse(dt).map_err(|_| self.err(format!("unknown dtype `{dt}`")))?;
        let dims = self
            .list(v, "shape")?
            .iter()
            .map(|d| match d {
                Value::String(s) => Ok(Dim::Dynamic(s.clone())),
                d => d
                    .as_u64()
                    .map(|n| Dim::Fixed(n as usize))
                    .ok_or_else(|| self.err(format!("shape entry {d} of `{name}`"))),
            })
            .collect::<Result<_>>()?;
        Ok(TensorSpec { name, dtype, dims })
    }
}

/// The model a manifest, a graph text and the weights describe.
pub(super) fn read(
    path: &str,
    bytes: &[u8],
    text: String,
    mut weights: BTreeMap<String, Tensor>,
) -> Result<ExportedModel> {
    let r = Reader { path };
    let v: Value = serde_json::from_slice(bytes).map_err(|e| r.err(e))?;
    let mut dim_names = vec![];
    let mut example_dims = vec![];
    for d in r.list(&v, "dims")? {
        dim_names.push(r.str(d, "name")?.to_string());
        example_dims.push(r.int(d, "example")? as usize);
    }
    let inputs: Vec<TensorSpec> = r
        .list(&v, "inputs")?
        .iter()
        .map(|s| r.spec(s))
        .collect::<Result<_>>()?;
    let outputs = r
        .list(&v, "outputs")?
        .iter()
        .map(|s| r.spec(s))
        .collect::<Result<_>>()?;
    for s in &inputs {
        for d in &s.dims {
            if let Dim::Dynamic(n) = d {
                if !dim_names.contains(n) {
                    return Err(r.err(format!("input `{}` uses unknown dim `{n}`", s.name)));
                }
            }
        }
    }
    let mut sources = vec![];
    let mut kept = vec![];
    for s in r.list(&v, "graph_inputs")? {
        if let Some(i) = s.get("arg").and_then(|i| i.as_u64()) {
            if i as usize >= inputs.len() {
                return Err(r.err(format!("graph input reads argument {i}")));
            }
            sources.push(Source::Arg(i as usize));
        } else {
            let k = r.str(s, "weight")?.to_string();
            let t = weights
                .remove(&k)
                .ok_or_else(|| r.err(format!("weight `{k}` is missing from the weights")))?;
            kept.push((k.clone(), t));
            sources.push(Source::Weight(k));
        }
    }
    let mut sites = vec![];
    for s in r.list(&v, "sites")? {
        let coefs = r
            .list(s, "coefs")?
            .iter()
            .map(|c| c.as_i64().ok_or_else(|| r.err("site coefficient")))
            .collect::<Result<_>>()?;
        sites.push(Site {
            run: r.int(s, "run")? as usize,
            expr: Affine {
                constant: r.int(s, "constant")?,
                coefs,
            },
        });
    }
    let template = Template { text, sites };
    template.check(&example_dims).map_err(|e| r.err(e))?;
    Ok(ExportedModel {
        name: r.str(&v, "name")?.to_string(),
        inputs,
        outputs,
        dim_names,
        example_dims,
        template,
        sources,
        weights: kept,
        graphs: Default::default(),
        scopes: vec![],
    })
}
