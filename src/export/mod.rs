//! `kiln::export`: a model as one self-contained `.kiln` file, the analogue
//! of `torch.export` / TorchScript's trace.
//!
//! [`export`] traces the model (the same tracer `compile()` uses) on example
//! inputs and keeps the graph, the weights it read, and the names, dtypes and
//! shapes of its inputs and outputs; dims named in [`DynamicDim`]s (a
//! `batch`) stay free. [`ExportedModel::save`] writes it (header, IR text,
//! safetensors weights, checksum: see [`format`]) and [`load`] reads it back
//! as a model that runs without the code that defined it — eagerly through
//! [`ExportedModel::forward`], or through `compile(&loaded)` like any module.
//!
//! ```no_run
//! use kiln::export::{self, DynamicDim};
//! use kiln::nn::ModuleExt;
//! let model = kiln::train::ModelKind::Cnn.build()?;
//! model.eval(); // export what inference runs: BatchNorm's running stats, no dropout
//! let x = kiln::Tensor::zeros(&[4, 1, 8, 8], kiln::DType::F32);
//! export::export(&model, &[x.clone()], &[DynamicDim::new(0, 0, "batch")])?.save("cnn.kiln")?;
//! let loaded = export::load("cnn.kiln")?;
//! let y = loaded.forward(&[kiln::Tensor::zeros(&[9, 1, 8, 8], kiln::DType::F32)])?;
//! assert_eq!(y[0].dims(), &[9, 10]);
//! println!("{}", loaded.signature()); // (input: f32[batch,1,8,8]) -> (output: f32[batch,10])
//! # Ok::<(), kiln::Error>(())
//! ```

pub mod format;
mod manifest;
mod run;
pub(crate) mod scopes;
pub mod symbolic;
pub(crate) mod trace;

use crate::{DType, Result, Tensor};
use kiln_ir::graph::Graph;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use symbolic::Template;

pub(crate) use trace::export_traced;
pub use trace::{export, export_fn};

/// A dim left free in the export: dim `dim` of input `input`, called `name`.
/// Dims sharing a name must have the same size on every call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicDim {
    pub input: usize,
    pub dim: usize,
    pub name: String,
}

impl DynamicDim {
    /// `DynamicDim::new(0, 0, "batch")`: the first dim of the first input.
    pub fn new(input: usize, dim: usize, name: impl Into<String>) -> DynamicDim {
        DynamicDim {
            input,
            dim,
            name: name.into(),
        }
    }
}

/// One dim of an input or output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Fixed(usize),
    /// A dynamic dim's name, or an expression of them for an output (`32*batch`).
    Dynamic(String),
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Dynamic(s) => f.write_str(s),
        }
    }
}

/// The name, dtype and shape of an input or output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DType,
    pub dims: Vec<Dim>,
}

impl std::fmt::Display for TensorSpec {
    /// `input: f32[batch,1,8,8]`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dims: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        write!(f, "{}: {}[{}]", self.name, self.dtype, dims.join(","))
    }
}

/// Where a graph input's value comes from on each call.
#[derive(Debug, Clone, PartialEq)]
enum Source {
    /// The call's `i`-th tensor.
    Arg(usize),
    /// A weight of the file, by key.
    Weight(String),
}

/// A traced model with its weights: runs, saves, and compiles without the
/// code that defined it (see the module docs).
pub struct ExportedModel {
    name: String,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    /// The dynamic dims' names and their sizes in the example inputs.
    dim_names: Vec<String>,
    example_dims: Vec<usize>,
    template: Template,
    /// One per graph input, in order.
    sources: Vec<Source>,
    weights: Vec<(String, Tensor)>,
    /// Parsed graphs by dynamic-dim sizes.
    graphs: Mutex<HashMap<Vec<usize>, Arc<Graph>>>,
    /// Module calls collapsed for the ONNX writer (empty but in
    /// [`trace::export_traced`]'s scoped exports).
    scopes: Vec<scopes::Scope>,
}

impl ExportedModel {
    /// The model's name (the traced function's).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The inputs a call takes, in order.
    pub fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }

    /// The outputs a call returns, in order.
    pub fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }

    /// The dynamic dims' names, in order of first appearance.
    pub fn dynamic_dims(&self) -> &[String] {
        &self.dim_names
    }

    /// The sizes of the dynamic dims in the example inputs the model was traced with.
    pub fn example_dims(&self) -> &[usize] {
        &self.example_dims
    }

    /// The weights (parameters, buffers, captured tensors) by key.
    pub fn weights(&self) -> &[(String, Tensor)] {
        &self.weights
    }

    /// The module calls the ONNX writer writes as their own nodes.
    pub(crate) fn scopes(&self) -> &[scopes::Scope] {
        &self.scopes
    }

    /// The IR text of the graph at the example sizes.
    pub fn graph_text(&self) -> &str {
        &self.template.text
    }

    /// `(input: f32[batch,1,8,8]) -> (output: f32[batch,10])`
    pub fn signature(&self) -> String {
        let list = |s: &[TensorSpec]| {
            s.iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!("({}) -> ({})", list(&self.inputs), list(&self.outputs))
    }

    /// Renames the inputs and outputs (as `torch.onnx.export`'s
    /// `input_names`/`output_names`); the counts must match.
    pub fn with_names(mut self, inputs: &[&str], outputs: &[&str]) -> Result<ExportedModel> {
        for (what, specs, names) in [
            ("inputs", &mut self.inputs, inputs),
            ("outputs", &mut self.outputs, outputs),
        ] {
            if specs.len() != names.len() {
                kiln_ir::bail!("export", "{} names for {} {what}", names.len(), specs.len());
            }
            for (s, n) in specs.iter_mut().zip(names) {
                s.name = n.to_string();
            }
        }
        Ok(self)
    }

    /// The graph at the given dynamic-dim sizes (in [`Self::dynamic_dims`] order).
    pub fn graph_at(&self, dims: &[usize]) -> Result<Arc<Graph>> {
        let mut cache = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = cache.get(dims) {
            return Ok(g.clone());
        }
        let text = self.template.instantiate(dims)?;
        let g = Arc::new(Graph::parse(&text).map_err(|e| {
            kiln_ir::Error::op(
                "export",
                format!("the graph at sizes {dims:?} does not parse: {e}"),
            )
        })?);
        cache.insert(dims.to_vec(), g.clone());
        Ok(g)
    }

    /// Which argument graph input `k` reads (`None`: a weight, by the input's name).
    pub(crate) fn arg_of_graph_input(&self, k: usize) -> Option<usize> {
        match self.sources.get(k) {
            Some(Source::Arg(i)) => Some(*i),
            _ => None,
        }
    }

    /// Runs the model on `xs`, checked against [`Self::inputs`] first: a wrong
    /// count, rank, dtype or fixed size is an error naming the input.
    pub fn forward(&self, xs: &[Tensor]) -> Result<Vec<Tensor>> {
        let dims = self.check_inputs(xs)?;
        let g = self.graph_at(&dims)?;
        run::eval(&g, &self.sources, xs, &self.weights)
    }

    /// Writes the model to `path` atomically (see [`format`]).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        crate::serialize::write_atomic(path.as_ref(), &self.to_bytes()?)
    }

    /// The bytes of a `.kiln` file.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        Ok(format::encode(&format::Sections {
            manifest: manifest::write(self).into_bytes(),
            graph: self.template.text.clone().into_bytes(),
            weights: crate::serialize::to_bytes(&self.weights, None)?,
        }))
    }

    /// Parses the bytes of a `.kiln` file (`path` names it in errors).
    pub fn from_bytes(path: &str, bytes: &[u8]) -> Result<ExportedModel> {
        let s = format::decode(path, bytes)?;
        let text = String::from_utf8(s.graph).map_err(|_| {
            kiln_ir::Error::op(
                "export::load",
                format!("{path}: corrupt: graph is not UTF-8"),
            )
        })?;
        let weights = crate::serialize::from_bytes(Path::new(path), &s.weights)?;
        let m = manifest::read(path, &s.manifest, text, weights.into_map())?;
        // parse the example graph now: a damaged graph is a load error, not a call error
        m.graph_at(&m.example_dims.clone())
            .map_err(|e| kiln_ir::Error::op("export::load", format!("{path}: {e}")))?;
        Ok(m)
    }
}

/// Reads a `.kiln` file written by [`ExportedModel::save`].
pub fn load(path: impl AsRef<Path>) -> Result<ExportedModel> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| {
        kiln_ir::Error::op(
            "export::load",
            format!("{}: cannot read: {e}", path.display()),
        )
    })?;
    ExportedModel::from_bytes(&path.display().to_string(), &bytes)
}
