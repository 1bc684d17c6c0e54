//! The text form of a [`Graph`]: stable and diffable (DESIGN.md, "Text dumps").
//!
//! ```text
//! graph conv_relu(%0 x: f32[8,64,56,56], %1 w: f32[64,64,3,3]) {
//!   %2 = conv2d(%0, %1) {dilation=[1], groups=1, padding=[1], stride=[1]} : f32[8,64,56,56]
//!   %3 = relu(%2) : f32[8,64,56,56]
//!   return %3
//! }
//! ```
//!
//! One node per line; ids renumbered at print time (inputs first, then nodes in
//! topological order); dtype and shape on every value; attributes sorted by
//! name; floats printed so they parse back to the same bits. An input's name
//! follows its id; names that are not plain identifiers are quoted. A header
//! over 100 characters puts each input on its own line.

use super::{attrs, AttrValue, Graph, Node, NodeId, NodeOp};
use crate::op::Meta;
use crate::shape::fmt_dims;
use std::fmt::{self, Write};

/// `f32[8,64]`
pub(crate) fn fmt_meta(m: &Meta) -> String {
    format!("{}{}", m.dtype, fmt_dims(&m.dims))
}

/// `f32[2]` for one value, `(f32[2], i64[2])` for a tuple.
pub(crate) fn fmt_metas(ms: &[Meta]) -> String {
    match ms {
        [m] => fmt_meta(m),
        _ => {
            let v: Vec<String> = ms.iter().map(fmt_meta).collect();
            format!("({})", v.join(", "))
        }
    }
}

pub(crate) fn is_ident(s: &str) -> bool {
    let mut cs = s.chars();
    matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

/// A name as the text form writes it: bare if an identifier, else quoted.
pub(crate) fn fmt_name(s: &str) -> String {
    if is_ident(s) {
        s.to_string()
    } else {
        format!("{s:?}")
    }
}

/// The attributes of a node, sorted, as the text form lists them.
pub(crate) fn node_attrs(n: &Node) -> Vec<(&'static str, AttrValue)> {
    match &n.op {
        NodeOp::Op(op) => attrs(op),
        NodeOp::Const(c) => vec![("value", c.attr())],
        NodeOp::Project(i) => vec![("index", AttrValue::Int(*i as i64))],
        NodeOp::Input { name } => vec![("name", AttrValue::Word(fmt_name(name)))],
    }
}

/// `{a=1, b=[2,3]}`, or nothing when there are no attributes.
pub(crate) fn fmt_attrs(a: &[(&'static str, AttrValue)]) -> String {
    if a.is_empty() {
        return String::new();
    }
    let v: Vec<String> = a.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(" {{{}}}", v.join(", "))
}

/// A header longer than this lists one input per line, so a changed input is a one-line diff.
const HEADER_WIDTH: usize = 100;

pub(crate) struct Ids<'a>(pub &'a [u32]);

impl Ids<'_> {
    pub fn of(&self, id: NodeId) -> String {
        match self.0.get(id.index()) {
            Some(n) => format!("%{n}"),
            None => format!("%?{}", id.0),
        }
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let num = self.numbering();
        let ids = Ids(&num);
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        order.sort_by_key(|&i| num[i]);
        let is_param = |i: usize| {
            matches!(self.nodes[i].op, NodeOp::Input { .. })
                && self.inputs.iter().any(|id| id.index() == i)
        };
        let params: Vec<String> = order
            .iter()
            .filter(|&&i| is_param(i))
            .map(|&i| {
                let n = &self.nodes[i];
                let NodeOp::Input { name } = &n.op else {
                    unreachable!()
                };
                let mut s = ids.of(NodeId(i as u32));
                if !name.is_empty() {
                    write!(s, " {}", fmt_name(name)).unwrap();
                }
                format!("{s}: {}", fmt_metas(&n.metas))
            })
            .collect();
        let head = format!("graph {}({}) {{", fmt_name(&self.name), params.join(", "));
        if head.len() <= HEADER_WIDTH {
            writeln!(f, "{head}")?;
        } else {
            writeln!(
                f,
                "graph {}(\n    {}\n) {{",
                fmt_name(&self.name),
                params.join(",\n    ")
            )?;
        }
        for &i in order.iter().filter(|&&i| !is_param(i)) {
            let n = &self.nodes[i];
            let operands: Vec<String> = n.operands.iter().map(|&o| ids.of(o)).collect();
            writeln!(
                f,
                "  {} = {}({}){} : {}",
                ids.of(NodeId(i as u32)),
                n.op_name(),
                operands.join(", "),
                fmt_attrs(&node_attrs(n)),
                fmt_metas(&n.metas)
            )?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|&o| ids.of(o)).collect();
        if outs.is_empty() {
            writeln!(f, "  return")?;
        } else {
            writeln!(f, "  return {}", outs.join(", "))?;
        }
        writeln!(f, "}}")
    }
}
