//! [`Graph::verify`]: the invariants every pass must keep. Errors name the
//! node by its printed id (`%3`) and op, so they match the text dump.

use super::print::{fmt_metas, Ids};
use super::{Graph, NodeOp};
use crate::{Error, Result};

impl Graph {
    /// Checks that operands are defined before use, each op has a valid number
    /// of operands, the stored types equal re-inferred ones, inputs are input
    /// nodes (each listed once) and the outputs exist and are single values.
    pub fn verify(&self) -> Result<()> {
        let num = self.numbering();
        let ids = Ids(&num);
        let fail = |msg: String| Err(Error::op("verify", format!("graph {}: {msg}", self.name)));
        let n = self.nodes.len();
        let mut listed = vec![false; n];
        for &id in &self.inputs {
            match self.nodes.get(id.index()) {
                None => return fail(format!("input {id:?} is not a node ({n} nodes)")),
                Some(node) if !matches!(node.op, NodeOp::Input { .. }) => {
                    return fail(format!(
                        "input {}: {} is not an input node",
                        ids.of(id),
                        node.op_name()
                    ))
                }
                Some(_) if listed[id.index()] => {
                    return fail(format!("input {} is listed twice", ids.of(id)))
                }
                Some(_) => listed[id.index()] = true,
            }
        }
        for (id, node) in self.iter() {
            let here = format!("{}: {}", ids.of(id), node.op_name());
            for (k, &o) in node.operands.iter().enumerate() {
                if o.index() >= id.index() {
                    return fail(format!(
                        "{here}: operand {k} ({}) is not defined before use",
                        ids.of(o)
                    ));
                }
                let is_tuple = self.nodes[o.index()].metas.len() != 1;
                if is_tuple != matches!(node.op, NodeOp::Project(_)) {
                    let what = if is_tuple {
                        "has several values: pick one with getitem"
                    } else {
                        "is not a tuple"
                    };
                    return fail(format!("{here}: operand {k} ({}) {what}", ids.of(o)));
                }
            }
            let inferred = match &node.op {
                NodeOp::Input { .. } if !listed[id.index()] => {
                    return fail(format!(
                        "{here}: input node missing from the graph's inputs"
                    ))
                }
                NodeOp::Input { .. } | NodeOp::Const(_) if !node.operands.is_empty() => {
                    return fail(format!(
                        "{here}: takes no operands, has {}",
                        node.operands.len()
                    ))
                }
                NodeOp::Input { .. } if node.metas.len() != 1 => {
                    return fail(format!(
                        "{here}: an input has one type, not {}",
                        node.metas.len()
                    ))
                }
                NodeOp::Input { .. } => node.metas.to_vec(),
                NodeOp::Const(c) => match c.check() {
                    Ok(()) => vec![c.meta.clone()],
                    Err(e) => return fail(format!("{}: {e}", ids.of(id))),
                },
                NodeOp::Op(op) => match self.infer_op(op, &node.operands) {
                    Ok(m) => m,
                    Err(e) => return fail(format!("{}: {e}", ids.of(id))),
                },
                NodeOp::Project(i) => match node.operands.as_slice() {
                    [t] => match self.infer_project(*t, *i) {
                        Ok(m) => vec![m],
                        Err(e) => return fail(format!("{}: {e}", ids.of(id))),
                    },
                    _ => {
                        return fail(format!(
                            "{here}: takes 1 operand, has {}",
                            node.operands.len()
                        ))
                    }
                },
            };
            if inferred.as_slice() != node.metas.as_slice() {
                return fail(format!(
                    "{here}: stored type {} but inference gives {}",
                    fmt_metas(&node.metas),
                    fmt_metas(&inferred)
                ));
            }
        }
        if self.outputs.is_empty() {
            return fail("no outputs".into());
        }
        for &o in &self.outputs {
            match self.nodes.get(o.index()) {
                None => return fail(format!("output {o:?} is not a node ({n} nodes)")),
                Some(node) if node.metas.len() != 1 => {
                    return fail(format!(
                        "output {} ({}) has several values: pick one with getitem",
                        ids.of(o),
                        node.op_name()
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;
