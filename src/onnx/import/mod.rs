//! ONNX import: [`load`] reads a `.onnx` file into an [`OnnxModel`], an
//! eager module that runs each node as kiln ops (so `compile()` traces it
//! like any other model).
//!
//! Shape arithmetic (`Shape`, then `Gather`/`Concat`/`Unsqueeze` of its
//! result feeding a `Reshape`) runs on the host as plain integers rather than
//! as tensors, so it is never traced and a compiled import has no graph
//! break at every `Reshape`. An op kiln does not support, or an attribute an
//! op implementation does not read, is an error naming the node, the op and
//! the opset — at load time for ops, at the first call for attributes —
//! never a silently different result.
//!
//! ```no_run
//! let m = kiln::onnx::load("model.onnx")?;
//! println!("{}", m.signature());
//! let y = m.forward(&[kiln::Tensor::zeros(&[1, 3, 224, 224], kiln::DType::F32)])?;
//! # Ok::<(), kiln::Error>(())
//! ```

mod attrs;
mod host;
mod ops;
mod ops_binary;
mod ops_more;
mod ops_nn;
mod ops_nn3d;
mod ops_pool;
mod ops_resize;
mod ops_rnn;
mod ops_seq;
mod ops_shape;

use super::proto::{self, ModelProto, NodeProto};
use crate::export::{Dim, TensorSpec};
use crate::nn::{Entry, Module};
use crate::{Result, Tensor};
use attrs::Node;
pub(crate) use host::Value;
use kiln_ir::{bail, Error};
use prost::Message;
use std::collections::HashMap;
use std::path::Path;

/// An imported ONNX model (see the module docs).
pub struct OnnxModel {
    name: String,
    opset: i64,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    nodes: Vec<NodeProto>,
    /// Initializers, by name (shown to `compile()` as buffers).
    weights: Vec<(String, Tensor)>,
}

/// Reads an ONNX model from a file.
pub fn load(path: impl AsRef<Path>) -> Result<OnnxModel> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| {
        Error::op(
            "onnx::load",
            format!("{}: cannot read: {e}", path.display()),
        )
    })?;
    from_bytes(&bytes).map_err(|e| Error::op("onnx::load", format!("{}: {e}", path.display())))
}

/// Reads an ONNX model from its protobuf bytes.
pub fn from_bytes(bytes: &[u8]) -> Result<OnnxModel> {
    let m = ModelProto::decode(bytes).map_err(|e| {
        Error::op(
            "onnx",
            format!("not an ONNX model (protobuf decode failed: {e})"),
        )
    })?;
    OnnxModel::from_proto(m)
}

fn spec_of(v: &proto::ValueInfoProto) -> Result<TensorSpec> {
    use proto::tensor_shape_proto::dimension::Value as D;
    use proto::type_proto::Value as T;
    let Some(T::TensorType(t)) = v.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        bail!(
            "onnx",
            "graph value `{}` is not a tensor (sequences and maps are not supported)",
            v.name
        );
    };
    let dtype = super::tensor::kiln_dtype(t.elem_type, &format!("graph value `{}`", v.name))?;
    let dims = t
        .shape
        .as_ref()
        .map(|s| {
            s.dim
                .iter()
                .map(|d| match &d.value {
                    Some(D::DimValue(n)) if *n >= 0 => Dim::Fixed(*n as usize),
                    Some(D::DimParam(p)) if !p.is_empty() => Dim::Dynamic(p.clone()),
                    _ => Dim::Dynamic("?".into()),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(TensorSpec {
        name: v.name.clone(),
        dtype,
        dims,
    })
}

impl OnnxModel {
    fn from_proto(m: ModelProto) -> Result<OnnxModel> {
        let opset = m
            .opset_import
            .iter()
            .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
            .map(|o| o.version)
            .unwrap_or(1);
        // opsets 22-25 changed only which types the ops kiln imports accept
        if !(1..=25).contains(&opset) {
            bail!(
                "onnx",
                "opset {opset} is not supported (kiln reads opsets 1-25)"
            );
        }
        let g = m
            .graph
            .ok_or_else(|| Error::op("onnx", "the model has no graph"))?;
        let mut weights = vec![];
        for t in &g.initializer {
            weights.push((t.name.clone(), super::tensor::from_proto(t)?));
        }
        let inputs = g
            .input
            .iter()
            .filter(|i| !weights.iter().any(|(n, _)| *n == i.name))
            .map(spec_of)
            .collect::<Result<_>>()?;
        let outputs = g.output.iter().map(spec_of).collect::<Result<_>>()?;
        for (k, n) in g.node.iter().enumerate() {
            let node = Node::new(n, k, opset);
            if !n.domain.is_empty() && n.domain != "ai.onnx" {
                return Err(node.err(format!("domain `{}` is not supported", n.domain)));
            }
            if !ops::supported(&n.op_type) {
                return Err(node.err("op is not supported by kiln's ONNX importer".to_string()));
            }
        }
        Ok(OnnxModel {
            name: g.name,
            opset,
            inputs,
            outputs,
            nodes: g.node,
            weights,
        })
    }

    /// The default-domain opset the model imports.
    pub fn opset(&self) -> i64 {
        self.opset
    }

    /// The graph inputs (initializers excluded), with their declared shapes
    /// (`Dim::Dynamic` for a named or unknown dim).
    pub fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }

    /// The initializers, by name.
    pub fn weights(&self) -> &[(String, Tensor)] {
        &self.weights
    }

    /// `(input: f32[N,3,224,224]) -> (output: f32[N,1000])`
    pub fn signature(&self) -> String {
        let list = |s: &[TensorSpec]| {
            s.iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!("({}) -> ({})", list(&self.inputs), list(&self.outputs))
    }

    fn check_inputs(&self, xs: &[Tensor]) -> Result<()> {
        if xs.len() != self.inputs.len() {
            bail!(
                "onnx",
                "`{}` takes {} inputs {}, got {}",
                self.name,
                self.inputs.len(),
                self.signature(),
                xs.len()
            );
        }
        for (x, s) in xs.iter().zip(&self.inputs) {
            if x.dtype() != s.dtype {
                bail!(
                    "onnx",
                    "input `{}`: expected dtype {}, got {}",
                    s.name,
                    s.dtype,
                    x.dtype()
                );
            }
            if !s.dims.is_empty() && x.rank() != s.dims.len() {
                bail!(
                    "onnx",
                    "input `{}`: expected rank {} ({s}), got shape {:?}",
                    s.name,
                    s.dims.len(),
                    x.dims()
                );
            }
            for (i, (d, w)) in x.dims().iter().zip(&s.dims).enumerate() {
                if let Dim::Fixed(n) = w {
                    if n != d {
                        bail!(
                            "onnx",
                            "input `{}`: dim {i} must be {n} ({s}), got {:?}",
                            s.name,
                            x.dims()
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs the graph on `xs` (in [`Self::inputs`] order); returns the graph outputs.
    pub fn forward(&self, xs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.check_inputs(xs)?;
        let mut env: HashMap<&str, Value> = HashMap::new();
        for (n, t) in &self.weights {
            env.insert(n.as_str(), Value::constant(t.clone()));
        }
        for (s, x) in self.inputs.iter().zip(xs) {
            env.insert(s.name.as_str(), Value::T(x.clone()));
        }
        for (k, n) in self.nodes.iter().enumerate() {
            let node = Node::new(n, k, self.opset);
            let ins = n
                .input
                .iter()
                .map(|i| {
                    if i.is_empty() {
                        Ok(Value::None)
                    } else {
                        env.get(i.as_str()).cloned().ok_or_else(|| {
                            node.err(format!("input `{i}` is not computed before it"))
                        })
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            let outs = ops::run(&node, &ins).map_err(|e| node.wrap(e))?;
            node.check_attrs_used()?;
            if outs.len() < n.output.iter().filter(|o| !o.is_empty()).count() {
                return Err(node.err(format!(
                    "{} outputs requested, kiln computes {} (training-mode outputs are not supported)",
                    n.output.len(),
                    outs.len()
                )));
            }
            for (name, v) in n.output.iter().zip(outs) {
                if !name.is_empty() {
                    env.insert(name.as_str(), v);
                }
            }
        }
        self.outputs
            .iter()
            .map(|o| {
                env.get(o.name.as_str())
                    .ok_or_else(|| {
                        Error::op(
                            "onnx",
                            format!("graph output `{}` is never computed", o.name),
                        )
                    })?
                    .tensor()
            })
            .collect()
    }
}

/// An imported model is a module: `compile(&model)` compiles a one-input,
/// one-output model ([`OnnxModel::forward`] takes any number); its
/// initializers are buffers and it is always in eval mode.
impl Module for OnnxModel {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut out = OnnxModel::forward(self, std::slice::from_ref(x))?;
        if out.len() != 1 {
            bail!(
                "onnx",
                "`{}` returns {} outputs; call OnnxModel::forward for all",
                self.name,
                out.len()
            );
        }
        Ok(out.swap_remove(0))
    }

    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        for (k, t) in &self.weights {
            f(Entry::Buffer(k, t));
        }
    }

    fn is_training(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        format!("OnnxModel{}", self.signature())
    }
}
