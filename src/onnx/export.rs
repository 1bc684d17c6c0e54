//! ONNX export: the graph [`crate::export`] traces, node by node, as ONNX
//! ops. Composites stay whole (Conv, BatchNormalization, Gemm, Softmax,
//! LayerNormalization, pools), weights become initializers holding raw
//! data, and dynamic dims become `dim_param`s (as `torch.onnx.export`'s
//! `dynamic_axes`). A kiln op with no ONNX counterpart here is an error
//! naming it.

use super::proto::{
    attribute_type as at, tensor_shape_proto, type_proto, AttributeProto, GraphProto, ModelProto,
    NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use super::tensor::{onnx_dtype, to_proto};
use crate::export::scopes::Scope;
use crate::export::{Dim, DynamicDim, ExportedModel, TensorSpec};
use crate::ir::op::Op;
use crate::nn::Module;
use crate::{Result, Tensor};
use elementwise::binary_name;
use kiln_ir::graph::{Graph, NodeId, NodeOp, ScalarValue};
use kiln_ir::{bail, Error};
use prost::Message;
use std::path::Path;

/// The opset [`export`] writes unless told otherwise (as `torch.onnx.export`).
pub const DEFAULT_OPSET: i64 = 17;

mod attention;
mod data;
mod elementwise;
mod layers;
mod rnn;

/// Exports `model` traced on `example` to an ONNX file at `path` (all dims
/// fixed; see [`export_dynamic`] for a dynamic batch).
pub fn export<M: Module>(
    model: &M,
    example: &[Tensor],
    path: impl AsRef<Path>,
    opset: i64,
) -> Result<()> {
    export_dynamic(model, example, &[], path, opset)
}

/// [`export`] with dims left free, e.g. `[DynamicDim::new(0, 0, "batch")]`.
/// An `nn::LSTM`/`nn::GRU` inside the model is written as ONNX `LSTM`/`GRU`
/// nodes, so its sequence axis may be dynamic too.
pub fn export_dynamic<M: Module>(
    model: &M,
    example: &[Tensor],
    dynamic: &[DynamicDim],
    path: impl AsRef<Path>,
    opset: i64,
) -> Result<()> {
    let names = crate::export::trace::module_names("onnx::export", model, example)?;
    let forward = |xs: &[Tensor]| Ok(vec![model.forward(&xs[0])?]);
    export_fn("forward", forward, &names, example, dynamic, path, opset)
}

/// Exports a function of several tensors with several results as ONNX
/// (the arguments of [`crate::export::export_fn`], then the file and opset),
/// LSTM/GRU layers as their ONNX ops (see [`export_dynamic`]).
///
/// ```no_run
/// use kiln::export::DynamicDim;
/// use kiln::nn::{Module, ModuleExt, RnnOptions, LSTM};
/// let lstm = LSTM::new(16, 32, RnnOptions { batch_first: true, ..Default::default() })?;
/// let f = |xs: &[kiln::Tensor]| lstm.forward_many(&[Some(&xs[0])]); // [output, h_n, c_n]
/// let x = kiln::Tensor::zeros(&[2, 7, 16], kiln::DType::F32);
/// let dynamic = [DynamicDim::new(0, 0, "batch"), DynamicDim::new(0, 1, "seq")];
/// kiln::onnx::export_fn("lstm", f, &lstm.named_parameters(), &[x], &dynamic, "lstm.onnx", 17)?;
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn export_fn(
    name: &str,
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    names: &[(String, Tensor)],
    example: &[Tensor],
    dynamic: &[DynamicDim],
    path: impl AsRef<Path>,
    opset: i64,
) -> Result<()> {
    let e = crate::export::export_traced(name, f, names, example, dynamic, true)?;
    from_exported(&e, path, opset)
}

/// Writes an already exported model (names and dynamic dims as it has them) as ONNX.
pub fn from_exported(e: &ExportedModel, path: impl AsRef<Path>, opset: i64) -> Result<()> {
    let bytes = to_model(e, opset)?.encode_to_vec();
    crate::serialize::write_atomic(path.as_ref(), &bytes)
}

/// The ONNX model of an exported model.
pub fn to_model(e: &ExportedModel, opset: i64) -> Result<ModelProto> {
    if !(13..=21).contains(&opset) {
        bail!("onnx::export", "opset {opset} is not supported (13-21)");
    }
    let base = e.example_dims().to_vec();
    let g = e.graph_at(&base)?;
    // which view/reshape targets depend on a dynamic dim: trace the graph one larger
    let bumped = if base.is_empty() {
        None
    } else {
        Some(e.graph_at(&base.iter().map(|d| d + 1).collect::<Vec<_>>())?)
    };
    let mut w = Writer {
        g: &g,
        bumped: bumped.as_deref(),
        opset,
        names: vec![String::new(); g.len()],
        nodes: vec![],
        inits: vec![],
        fresh: 0,
        batch_source: batch_source(e),
        batch_cache: None,
        example_batch: base.first().copied().unwrap_or(0),
        dynamic_names: e.dynamic_dims().len(),
        uses: g.use_counts(),
        weights: e.weights(),
    };
    w.name_values(e)?;
    for (id, node) in g.iter() {
        if let Some(s) = e.scopes().iter().find(|s| s.outputs.contains(&id)) {
            // a placeholder: the scope's nodes are written at its first one
            if s.outputs[0] == id {
                w.scope(s)?;
            }
            continue;
        }
        if let NodeOp::Op(op) = &node.op {
            w.op(id, op)?;
        } else if let NodeOp::Project(k) = &node.op {
            w.project(id, *k)?;
        } else if let NodeOp::Const(c) = &node.op {
            if w.shape_is_dynamic(id) {
                w.dynamic_const(id, c)?;
                continue;
            }
            let n = c.meta.dims.iter().product::<usize>();
            let v: Vec<f64> = (0..n).map(|k| c.value(k)).collect();
            let t = Tensor::from_vec(v, &c.meta.dims)?.to_dtype(c.meta.dtype)?;
            let name = w.names[id.index()].clone();
            w.inits.push(to_proto(&name, &t)?);
        }
    }
    // outputs that are not their own node's value (an input returned as is)
    for (o, spec) in g.outputs().iter().zip(e.outputs()) {
        if w.names[o.index()] != spec.name {
            let src = w.names[o.index()].clone();
            w.node("Identity", &[&src], &[&spec.name], vec![]);
        }
    }
    let mut inputs = vec![];
    for spec in e.inputs() {
        inputs.push(value_info(spec));
    }
    // a weight only a collapsed scope read is in the scope's own initializers
    let unused: Vec<&str> = g
        .inputs()
        .iter()
        .filter(|i| w.uses[i.index()] == 0 && !e.scopes().is_empty())
        .map(|i| w.names[i.index()].as_str())
        .collect();
    for (k, t) in e.weights() {
        if !unused.contains(&k.as_str()) {
            w.inits.push(to_proto(k, t)?);
        }
    }
    let graph = GraphProto {
        node: w.nodes,
        name: e.name().to_string(),
        initializer: w.inits,
        input: inputs,
        output: e.outputs().iter().map(value_info).collect(),
        ..Default::default()
    };
    Ok(ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        producer_name: "kiln".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        graph: Some(graph),
        ..Default::default()
    })
}

fn value_info(s: &TensorSpec) -> ValueInfoProto {
    use tensor_shape_proto::{dimension::Value as D, Dimension};
    let dim = s
        .dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Fixed(n) => D::DimValue(*n as i64),
                Dim::Dynamic(p) => D::DimParam(p.clone()),
            }),
            denotation: String::new(),
        })
        .collect();
    ValueInfoProto {
        name: s.name.clone(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: onnx_dtype(s.dtype),
                shape: Some(TensorShapeProto { dim }),
            })),
            denotation: String::new(),
        }),
        doc_string: String::new(),
    }
}

fn attr_int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: at::INT,
        i,
        ..Default::default()
    }
}

fn attr_ints(name: &str, ints: Vec<i64>) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: at::INTS,
        ints,
        ..Default::default()
    }
}

fn attr_string(name: &str, s: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: at::STRING,
        s: s.as_bytes().to_vec(),
        ..Default::default()
    }
}

fn attr_float(name: &str, f: f64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: at::FLOAT,
        f: f as f32,
        ..Default::default()
    }
}

struct Writer<'a> {
    g: &'a Graph,
    bumped: Option<&'a Graph>,
    opset: i64,
    names: Vec<String>,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    fresh: usize,
    /// The input and dim the dynamic dim is read from (one dynamic dim name only).
    batch_source: Option<(String, usize)>,
    /// The `Shape`/`Gather` result holding the dynamic dim, once made.
    batch_cache: Option<String>,
    /// The dynamic dim's size in the example inputs.
    example_batch: usize,
    dynamic_names: usize,
    /// How many nodes read each value.
    uses: Vec<usize>,
    weights: &'a [(String, Tensor)],
}

/// The first input dim of the export's one dynamic dim name.
fn batch_source(e: &ExportedModel) -> Option<(String, usize)> {
    if e.dynamic_dims().len() != 1 {
        return None;
    }
    e.inputs().iter().find_map(|s| {
        let d = s.dims.iter().position(|d| matches!(d, Dim::Dynamic(_)))?;
        Some((s.name.clone(), d))
    })
}

impl Writer<'_> {
    fn name_values(&mut self, e: &ExportedModel) -> Result<()> {
        let g = self.g;
        for (k, id) in g.inputs().iter().enumerate() {
            let NodeOp::Input { name } = &g.node(*id).op else {
                unreachable!()
            };
            // the call's arguments under the input names, the weights under their keys
            self.names[id.index()] = match e.arg_of_graph_input(k) {
                Some(i) => e.inputs()[i].name.clone(),
                None => name.clone(),
            };
        }
        for (id, _) in g.iter() {
            if self.names[id.index()].is_empty() {
                self.names[id.index()] = format!("v{}", id.index());
            }
        }
        for (o, spec) in g.outputs().iter().zip(e.outputs()) {
            let is_input = g.inputs().contains(o);
            let taken = self.names.iter().any(|n| *n == spec.name);
            if !is_input && !taken {
                self.names[o.index()] = spec.name.clone();
            }
        }
        Ok(())
    }

    /// A collapsed module call, by the rule its scope names.
    fn scope(&mut self, s: &Scope) -> Result<()> {
        for o in &s.outputs {
            if !matches!(self.g.node(*o).op, NodeOp::Const(_)) {
                bail!(
                    "onnx::export",
                    "a `{}` scope's placeholder moved in the graph text",
                    s.kind
                );
            }
        }
        match s.kind {
            "rnn" => self.rnn_scope(s),
            other => bail!("onnx::export", "no ONNX rule for `{other}` scopes"),
        }
    }

    fn tmp(&mut self, what: &str) -> String {
        self.fresh += 1;
        format!("{what}_{}", self.fresh)
    }

    fn node(&mut self, op: &str, ins: &[&str], outs: &[&str], attribute: Vec<AttributeProto>) {
        let name = format!("{op}_{}", self.nodes.len());
        self.nodes.push(NodeProto {
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: outs.iter().map(|s| s.to_string()).collect(),
            name,
            op_type: op.into(),
            attribute,
            ..Default::default()
        });
    }

    /// An initializer holding `t`; returns its name.
    fn constant(&mut self, what: &str, t: &Tensor) -> Result<String> {
        let name = self.tmp(what);
        self.inits.push(to_proto(&name, t)?);
        Ok(name)
    }

    fn ints_const(&mut self, what: &str, v: &[i64]) -> Result<String> {
        self.constant(what, &Tensor::from_vec(v.to_vec(), &[v.len()])?)
    }

    fn project(&mut self, id: NodeId, k: usize) -> Result<()> {
        let src = self.g.node(id).operands[0];
        // an unread second result (max_pool2d's indices) needs no ONNX value
        let unread = self.uses[id.index()] == 0 && !self.g.outputs().contains(&id);
        if k != 0 && !unread {
            bail!(
                "onnx::export",
                "result {k} of `{}` (pooling indices) has no ONNX export",
                self.g.node(src).op_name()
            );
        }
        // the multi-output op wrote its first result under the projection's name
        Ok(())
    }

    /// The dtype of the graph value written under `name`.
    fn dtype_of(&self, name: &str) -> crate::DType {
        let i = self.names.iter().position(|n| n == name);
        let i = i.expect("a graph value's name");
        self.meta(NodeId(i as u32)).dtype
    }

    fn meta(&self, id: NodeId) -> &kiln_ir::op::Meta {
        self.g.node(id).meta().expect("single-result node")
    }

    fn op(&mut self, id: NodeId, op: &Op) -> Result<()> {
        let node = self.g.node(id);
        let ins: Vec<String> = node
            .operands
            .iter()
            .map(|o| self.names[o.index()].clone())
            .collect();
        let x: Vec<&str> = ins.iter().map(|s| s.as_str()).collect();
        // a multi-output op writes into its projection 0's name
        let out = if node.metas.len() > 1 {
            let p0 = self
                .g
                .iter()
                .find(|(_, n)| matches!(n.op, NodeOp::Project(0)) && n.operands[0] == id);
            p0.map(|(p, _)| self.names[p.index()].clone())
                .unwrap_or_else(|| self.tmp("unused"))
        } else {
            self.names[id.index()].clone()
        };
        let o = [out.as_str()];
        match op {
            Op::Unary(u) => self.unary(u, x[0], &out)?,
            Op::Binary(b) => {
                let name = binary_name(*b).ok_or_else(|| unsupported(&op.name()))?;
                self.node(name, &x, &o, vec![]);
            }
            Op::BinaryScalar {
                op: b,
                value,
                reversed,
            } => {
                let name = binary_name(*b).ok_or_else(|| unsupported(&op.name()))?;
                let dt = self.meta(node.operands[0]).dtype;
                let v = match value {
                    ScalarValue::Bool(b) => *b as i64 as f64,
                    ScalarValue::Int(i) => *i as f64,
                    ScalarValue::Float(f) => f.0,
                };
                let s = self.constant("scalar", &Tensor::from_vec(vec![v], &[])?.to_dtype(dt)?)?;
                let pair = if *reversed {
                    [s.as_str(), x[0]]
                } else {
                    [x[0], s.as_str()]
                };
                self.node(name, &pair, &o, vec![]);
            }
            Op::Cast(d) => self.node("Cast", &x, &o, vec![attr_int("to", onnx_dtype(*d) as i64)]),
            Op::Where => self.node("Where", &x, &o, vec![]),
            Op::Matmul => self.node("MatMul", &x, &o, vec![]),
            Op::Softmax { dim } => self.node("Softmax", &x, &o, vec![attr_int("axis", *dim)]),
            Op::LogSoftmax { dim } => self.node("LogSoftmax", &x, &o, vec![attr_int("axis", *dim)]),
            Op::Reduce {
                kind,
                dims,
                keepdim,
            } => {
                let name = match kind {
                    crate::ir::ReduceKind::Sum => "ReduceSum",
                    crate::ir::ReduceKind::Prod => "ReduceProd",
                    crate::ir::ReduceKind::Max => "ReduceMax",
                    crate::ir::ReduceKind::Min => "ReduceMin",
                    _ => return Err(unsupported(&op.name())),
                };
                self.reduce(name, x[0], &out, dims, *keepdim)?;
            }
            Op::Mean { dims, keepdim } => self.reduce("ReduceMean", x[0], &out, dims, *keepdim)?,
            Op::View(_) => {
                let s = match self.view_shape(id) {
                    Ok(shape) => self.ints_const("shape", &shape)?,
                    // several dims depend on the batch: computed at run time
                    Err(_) => self.shape_value(id)?,
                };
                self.node("Reshape", &[x[0], &s], &o, vec![]);
            }
            Op::Permute(p) => self.node("Transpose", &x, &o, vec![attr_ints("perm", p.clone())]),
            Op::Cat { dim } => self.node("Concat", &x, &o, vec![attr_int("axis", *dim)]),
            Op::Attention(p) => self.attention_op(id, p, &x, &out)?,
            _ => {
                if !self.layer_op(id, op, &x, &out)? && !self.data_op(id, op, &x, &out)? {
                    return Err(unsupported(&op.name()));
                }
            }
        }
        Ok(())
    }

    /// A view's target shape, with the one dim that depends on the dynamic dims as -1.
    fn view_shape(&self, id: NodeId) -> Result<Vec<i64>> {
        let dims: Vec<i64> = self.meta(id).dims.iter().map(|&d| d as i64).collect();
        let Some(b) = self.bumped else {
            return Ok(dims);
        };
        let other: Vec<i64> = b
            .node(id)
            .meta()
            .expect("view")
            .dims
            .iter()
            .map(|&d| d as i64)
            .collect();
        let free: Vec<usize> = (0..dims.len()).filter(|&i| dims[i] != other[i]).collect();
        match free.as_slice() {
            [] => Ok(dims),
            [k] => {
                let mut s = dims.clone();
                s[*k] = -1;
                Ok(s)
            }
            _ => Err(Error::op(
                "onnx::export",
                format!("a view to {dims:?} with {} dims depending on the dynamic dims has no static ONNX Reshape", free.len()),
            )),
        }
    }

    fn reduce(&mut self, name: &str, x: &str, out: &str, dims: &[i64], keep: bool) -> Result<()> {
        let mut attrs = vec![attr_int("keepdims", keep as i64)];
        let axes_as_input = self.opset >= 18 || name == "ReduceSum";
        if dims.is_empty() {
            self.node(name, &[x], &[out], attrs);
        } else if axes_as_input {
            let a = self.ints_const("axes", dims)?;
            self.node(name, &[x, &a], &[out], attrs);
        } else {
            attrs.push(attr_ints("axes", dims.to_vec()));
            self.node(name, &[x], &[out], attrs);
        }
        Ok(())
    }
}

fn unsupported(op: &str) -> Error {
    Error::op(
        "onnx::export",
        format!("kiln op `{op}` has no ONNX export yet"),
    )
}
