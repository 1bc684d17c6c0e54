//! Export scopes collapsed for ONNX: the nodes a module call recorded
//! (`kiln_frontend::compile::trace::export_scope`, e.g. an LSTM's unrolled
//! steps) are taken out of the trace and each value the call returned is
//! replaced by a zero constant of its type, a placeholder the ONNX writer
//! replaces with the module's own ONNX nodes. The collapsed graph no longer
//! changes structure with the sequence length, so the sequence axis can be
//! a dynamic dim. Only the ONNX exporter asks for this: a collapsed graph
//! does not compute the model and is never saved as `.kiln` or run.

use crate::compile::trace::{Binding, ExportScope, Trace};
use kiln_ir::graph::{Constant, Graph, NodeId, NodeOp};
use kiln_ir::{bail, Result};

/// One collapsed module call: the recorded [`ExportScope`] with its node ids
/// in the collapsed graph (`outputs` are the placeholders).
#[derive(Debug, Clone, PartialEq)]
pub struct Scope {
    pub kind: &'static str,
    pub attrs: Vec<(&'static str, i64)>,
    pub inputs: Vec<(String, Option<NodeId>)>,
    pub outputs: Vec<NodeId>,
}

impl Scope {
    /// The attribute `name` (recorded by the module), or an error naming it.
    pub fn attr(&self, name: &str) -> Result<i64> {
        match self.attrs.iter().find(|(n, _)| *n == name) {
            Some((_, v)) => Ok(*v),
            None => bail!("onnx::export", "`{}` scope has no `{name}`", self.kind),
        }
    }

    /// The input of role `role` (`None` when optional and not given).
    pub fn input(&self, role: &str) -> Option<NodeId> {
        self.inputs
            .iter()
            .find(|(r, _)| r == role)
            .and_then(|r| r.1)
    }
}

/// Replaces each scope of `tr` by placeholders (see the module docs) and
/// drops the graph inputs only the scopes' bodies read; returns the scopes
/// with their ids in the new graph.
pub(crate) fn collapse(tr: &mut Trace) -> Result<Vec<Scope>> {
    let scopes = std::mem::take(&mut tr.scopes);
    if scopes.is_empty() {
        return Ok(vec![]);
    }
    let g = &tr.graph;
    // which scope each node was recorded inside
    let mut owner: Vec<Option<usize>> = vec![None; g.len()];
    for (k, s) in scopes.iter().enumerate() {
        for o in &mut owner[s.nodes.clone()] {
            *o = Some(k);
        }
    }
    let inputs = g.inputs().to_vec();
    let mut out = Graph::new(g.name());
    let mut map: Vec<Option<NodeId>> = vec![None; g.len()];
    let mut keep = vec![];
    for (id, node) in g.iter() {
        let i = id.index();
        if owner[i].is_none() {
            let ops = node
                .operands
                .iter()
                .map(|o| map[o.index()].ok_or_else(|| escaped(&scopes, owner[o.index()], node)))
                .collect::<Result<Vec<_>>>()?;
            map[i] = Some(out.add(node.op.clone(), &ops, &node.metas)?);
            if let NodeOp::Input { .. } = node.op {
                let pos = inputs.iter().position(|x| *x == id).expect("an input");
                keep.push(tr.bindings[pos].clone());
            }
        }
        // the scope's last node: its results become placeholders
        if let Some(k) = owner[i].filter(|&k| scopes[k].nodes.end == i + 1) {
            for o in &scopes[k].outputs {
                let meta = g.meta(*o)?.clone();
                map[o.index()] = Some(out.constant(Constant::full(0.0, meta))?);
            }
        }
    }
    for o in g.outputs() {
        let id = map[o.index()].ok_or_else(|| {
            kiln_ir::Error::op(
                "onnx::export",
                "a graph output is a value inside an exported module's scope",
            )
        })?;
        out.output(id)?;
    }
    let moved = |id: NodeId| map[id.index()].expect("scope inputs are recorded before it");
    let scopes = scopes
        .into_iter()
        .map(|s: ExportScope| Scope {
            kind: s.kind,
            attrs: s.attrs,
            inputs: s
                .inputs
                .into_iter()
                .map(|(r, id)| (r, id.map(moved)))
                .collect(),
            outputs: s.outputs.iter().map(|o| moved(*o)).collect(),
        })
        .collect();
    debug_assert!(keep.iter().all(|b| !matches!(b, Binding::Tangent(_))));
    tr.graph = out;
    tr.bindings = keep;
    Ok(scopes)
}

fn escaped(
    scopes: &[ExportScope],
    k: Option<usize>,
    user: &kiln_ir::graph::Node,
) -> kiln_ir::Error {
    let kind = k.map(|k| scopes[k].kind).unwrap_or("?");
    kiln_ir::Error::op(
        "onnx::export",
        format!(
            "`{}` reads a value computed inside a `{kind}` module's export scope that the module did not return",
            user.op_name()
        ),
    )
}

/// Maps the scopes' node ids to the ids the graph text gives them
/// (`Graph::numbering`: inputs first), which the ONNX writer sees.
pub(crate) fn renumber(scopes: &mut [Scope], num: &[u32]) {
    let at = |id: NodeId| NodeId(num[id.index()]);
    for s in scopes {
        for (_, id) in &mut s.inputs {
            *id = id.map(at);
        }
        for o in &mut s.outputs {
            *o = at(*o);
        }
    }
}
