//! Graphviz output (`kiln dump --format dot`): one box per node labelled with
//! its printed id, op, attributes and type; edges from operand to user.

use super::print::{fmt_attrs, fmt_metas, fmt_name, node_attrs, Ids};
use super::{Graph, NodeId, NodeOp};
use std::fmt::Write;

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

pub(crate) fn to_dot(g: &Graph) -> String {
    let num = g.numbering();
    let ids = Ids(&num);
    let mut order: Vec<usize> = (0..g.len()).collect();
    order.sort_by_key(|&i| num[i]);
    let mut s = format!("digraph {} {{\n", quote(g.name()));
    s.push_str("  node [shape=box, fontname=monospace];\n");
    for i in order {
        let id = NodeId(i as u32);
        let n = g.node(id);
        let (head, shape) = match &n.op {
            NodeOp::Input { name } => (format!("{} {}", ids.of(id), fmt_name(name)), "ellipse"),
            _ => (
                format!(
                    "{} = {}{}",
                    ids.of(id),
                    n.op_name(),
                    fmt_attrs(&node_attrs(n))
                ),
                "box",
            ),
        };
        let label = format!("{}\\n{}", head.trim_end(), fmt_metas(&n.metas));
        let label = quote(&label).replace("\\\\n", "\\n");
        writeln!(s, "  n{i} [label={label}, shape={shape}];").unwrap();
        for o in &n.operands {
            writeln!(s, "  n{} -> n{i};", o.0).unwrap();
        }
    }
    for (k, o) in g.outputs().iter().enumerate() {
        writeln!(s, "  out{k} [label=\"return {k}\", shape=plaintext];").unwrap();
        writeln!(s, "  n{} -> out{k};", o.0).unwrap();
    }
    s.push_str("}\n");
    s
}
