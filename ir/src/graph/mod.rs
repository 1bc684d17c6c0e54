//! [`Graph`]: the IR that `compile()` traces into and every pass reads and
//! writes. A `Vec` arena of nodes in topological order (an operand is always
//! an earlier node), each with the [`Meta`]s (dtype and shape) its values have.
//!
//! Nodes are only appended: a pass builds a new graph (see [`Graph::rewrite`])
//! rather than edit one in place. The builder runs [`Op::infer`] on every
//! [`Graph::op`], so every value has a dtype and a shape, checked by the same
//! code the eager path uses.
//!
//! ```
//! use kiln_ir::graph::Graph;
//! use kiln_ir::op::{Meta, Op};
//! use kiln_ir::{DType, UnaryOp};
//! let mut g = Graph::new("act");
//! let x = g.input("x", Meta::new(DType::F32, &[2, 3]));
//! let y = g.op(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
//! g.output(y).unwrap();
//! assert_eq!(g.to_text(), "graph act(%0 x: f32[2,3]) {\n  %1 = relu(%0) : f32[2,3]\n  return %1\n}\n");
//! assert_eq!(kiln_ir::graph::Graph::parse(&g.to_text()).unwrap(), g);
//! ```
//!
//! Multi-output ops (`max_pool2d` gives values and indices) make one node whose
//! value is a tuple; a [`NodeOp::Project`] node (printed `getitem`) picks one
//! element. Only single values may be operands or graph outputs.

mod attrs;
mod constant;
mod dot;
pub mod eval;
mod from_text;
mod lex;
mod parse;
mod print;
mod verify;

use crate::op::{Meta, Op};
use crate::{bail, Result};
use smallvec::SmallVec;

pub use crate::op::{Reduction, ScalarValue};
pub use attrs::{arity, attrs, op_name, AttrValue};
pub use constant::Constant;
pub use parse::parse_op;

/// Index of a node in its [`Graph`]'s arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What a node computes.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeOp {
    /// A graph input (an activation or a parameter), by name; may be empty.
    Input { name: String },
    /// A literal tensor (a scalar broadcast to its shape, or every element).
    Const(Constant),
    /// One op of the vocabulary, applied to the node's operands in order.
    Op(Op),
    /// Element `i` of a multi-output node (its one operand).
    Project(usize),
}

/// One node: what it computes, from which earlier nodes, and the type of each
/// value it produces (one, except for multi-output ops).
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub op: NodeOp,
    pub operands: SmallVec<[NodeId; 4]>,
    pub metas: SmallVec<[Meta; 1]>,
}

impl Node {
    /// The node's value type, or `None` for a multi-output node.
    pub fn meta(&self) -> Option<&Meta> {
        match self.metas.as_slice() {
            [m] => Some(m),
            _ => None,
        }
    }

    /// The name the text form gives the node's op (`conv2d`, `input`, `getitem`).
    pub fn op_name(&self) -> String {
        match &self.op {
            NodeOp::Input { .. } => "input".into(),
            NodeOp::Const(_) => "constant".into(),
            NodeOp::Op(op) => op_name(op),
            NodeOp::Project(_) => "getitem".into(),
        }
    }
}

/// A dataflow graph: nodes in topological order, named inputs, outputs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Graph {
    name: String,
    nodes: Vec<Node>,
    inputs: Vec<NodeId>,
    outputs: Vec<NodeId>,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            ..Graph::default()
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn set_name(&mut self, name: impl Into<String>) {
        self.name = name.into();
    }
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
    pub fn inputs(&self) -> &[NodeId] {
        &self.inputs
    }
    pub fn outputs(&self) -> &[NodeId] {
        &self.outputs
    }
    /// Nodes with their ids, in topological order.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (NodeId(i as u32), n))
    }

    /// The node `id`. Panics if `id` is not a node of this graph.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// The value type of single-output node `id`.
    pub fn meta(&self, id: NodeId) -> Result<&Meta> {
        self.get(id)?
            .meta()
            .ok_or_else(|| crate::Error::op("graph", format!("{id:?} has several outputs")))
    }

    /// How many nodes use each node as an operand (graph outputs count too).
    pub fn use_counts(&self) -> Vec<usize> {
        let mut n = vec![0; self.nodes.len()];
        for id in self
            .nodes
            .iter()
            .flat_map(|n| &n.operands)
            .chain(&self.outputs)
        {
            if let Some(c) = n.get_mut(id.index()) {
                *c += 1;
            }
        }
        n
    }

    fn get(&self, id: NodeId) -> Result<&Node> {
        match self.nodes.get(id.index()) {
            Some(n) => Ok(n),
            None => bail!(
                "graph",
                "{id:?} is not a node of graph {} ({} nodes)",
                self.name,
                self.nodes.len()
            ),
        }
    }

    fn push(&mut self, node: Node) -> NodeId {
        let id = NodeId(u32::try_from(self.nodes.len()).expect("graph has under 2^32 nodes"));
        if matches!(node.op, NodeOp::Input { .. }) {
            self.inputs.push(id);
        }
        self.nodes.push(node);
        id
    }

    /// Appends a node as given, without checks: for passes that already know the
    /// metas. Run [`Graph::verify`] afterwards. An `Input` node becomes an input.
    pub fn push_unchecked(&mut self, node: Node) -> NodeId {
        self.push(node)
    }

    /// Replaces the graph's outputs without checks (see [`Graph::verify`]).
    pub fn set_outputs_unchecked(&mut self, outputs: Vec<NodeId>) {
        self.outputs = outputs;
    }

    /// Adds a graph input of type `meta`.
    pub fn input(&mut self, name: impl Into<String>, meta: Meta) -> NodeId {
        self.push(Node {
            op: NodeOp::Input { name: name.into() },
            operands: SmallVec::new(),
            metas: smallvec::smallvec![meta],
        })
    }

    /// Adds a constant (checked: its values fit its dtype and shape).
    pub fn constant(&mut self, c: Constant) -> Result<NodeId> {
        c.check()?;
        let meta = c.meta.clone();
        Ok(self.push(Node {
            op: NodeOp::Const(c),
            operands: SmallVec::new(),
            metas: smallvec::smallvec![meta],
        }))
    }

    /// Adds `op` applied to `operands`, with its output types from [`Op::infer`].
    /// Returns a tuple node for a multi-output op (see [`Graph::project`]).
    pub fn op(&mut self, op: Op, operands: &[NodeId]) -> Result<NodeId> {
        let metas = self.infer_op(&op, operands)?;
        Ok(self.push(Node {
            op: NodeOp::Op(op),
            operands: operands.into(),
            metas: metas.into(),
        }))
    }

    /// Adds element `index` of the multi-output node `tuple`.
    pub fn project(&mut self, tuple: NodeId, index: usize) -> Result<NodeId> {
        let meta = self.infer_project(tuple, index)?;
        Ok(self.push(Node {
            op: NodeOp::Project(index),
            operands: smallvec::smallvec![tuple],
            metas: smallvec::smallvec![meta],
        }))
    }

    /// Adds a node of any kind (what [`Graph::rewrite`] uses to copy a node);
    /// `metas` are used only for an input, everything else is re-inferred.
    pub fn add(&mut self, op: NodeOp, operands: &[NodeId], metas: &[Meta]) -> Result<NodeId> {
        match op {
            NodeOp::Input { name } => match (operands, metas) {
                ([], [m]) => Ok(self.input(name, m.clone())),
                _ => bail!("input", "takes no operands and has exactly one type"),
            },
            NodeOp::Const(c) => self.constant(c),
            NodeOp::Op(op) => self.op(op, operands),
            NodeOp::Project(i) => match operands {
                [t] => self.project(*t, i),
                _ => bail!("getitem", "takes 1 operand, got {}", operands.len()),
            },
        }
    }

    /// Marks single-valued node `id` as the next graph output.
    pub fn output(&mut self, id: NodeId) -> Result<()> {
        let n = self.get(id)?;
        if n.meta().is_none() {
            bail!(
                "graph",
                "output {id:?} ({}) has several values: pick one with getitem",
                n.op_name()
            );
        }
        self.outputs.push(id);
        Ok(())
    }

    /// The metas of single-valued operands, checking ids and the op's arity.
    fn operand_metas(&self, name: &str, operands: &[NodeId]) -> Result<Vec<Meta>> {
        operands
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let n = self.get(id)?;
                match n.meta() {
                    Some(m) => Ok(m.clone()),
                    None => bail!(
                        name,
                        "operand {i} ({id:?}, {}) has several values: pick one with getitem",
                        n.op_name()
                    ),
                }
            })
            .collect()
    }

    pub(crate) fn infer_op(&self, op: &Op, operands: &[NodeId]) -> Result<Vec<Meta>> {
        let name = op_name(op);
        let (lo, hi) = arity(op);
        if operands.len() < lo || operands.len() > hi {
            let want = match (lo, hi) {
                (a, b) if a == b => format!("{a}"),
                (a, usize::MAX) => format!("at least {a}"),
                (a, b) => format!("{a} to {b}"),
            };
            let s = if (lo, hi) == (1, 1) { "" } else { "s" };
            bail!(name, "expected {want} operand{s}, got {}", operands.len());
        }
        let ins = self.operand_metas(&name, operands)?;
        op.infer(&ins)
    }

    pub(crate) fn infer_project(&self, tuple: NodeId, index: usize) -> Result<Meta> {
        let t = self.get(tuple)?;
        if t.metas.len() < 2 {
            bail!(
                "getitem",
                "operand {tuple:?} ({}) is a single value, not a tuple",
                t.op_name()
            );
        }
        match t.metas.get(index) {
            Some(m) => Ok(m.clone()),
            None => bail!(
                "getitem",
                "index {index} out of range for {} with {} values",
                t.op_name(),
                t.metas.len()
            ),
        }
    }

    /// Copies the graph into a new one, node by node. `f` sees the new graph, the
    /// old node and its operands already mapped to new ids; it returns `Some(id)`
    /// to stand for the old node (after adding whatever it likes), or `None` to
    /// copy the node unchanged. Graph outputs follow the mapping.
    pub fn rewrite(
        &self,
        f: impl FnMut(&mut Graph, &Node, &[NodeId]) -> Result<Option<NodeId>>,
    ) -> Result<Graph> {
        Ok(self.rewrite_with_map(f)?.0)
    }

    /// [`Graph::rewrite`], also returning where each old node went (indexed by old id).
    pub fn rewrite_with_map(
        &self,
        mut f: impl FnMut(&mut Graph, &Node, &[NodeId]) -> Result<Option<NodeId>>,
    ) -> Result<(Graph, Vec<NodeId>)> {
        let mut out = Graph::new(self.name.clone());
        let mut map: Vec<NodeId> = Vec::with_capacity(self.nodes.len());
        for n in &self.nodes {
            let ops: SmallVec<[NodeId; 4]> = n
                .operands
                .iter()
                .map(|o| map.get(o.index()).copied())
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    crate::Error::op(
                        n.op_name(),
                        "operand defined after its use (verify the graph)",
                    )
                })?;
            let id = match f(&mut out, n, &ops)? {
                Some(id) => id,
                None => out.add(n.op.clone(), &ops, &n.metas)?,
            };
            map.push(id);
        }
        for o in &self.outputs {
            let id = map
                .get(o.index())
                .copied()
                .ok_or_else(|| crate::Error::op("graph", format!("output {o:?} does not exist")))?;
            out.output(id)?;
        }
        Ok((out, map))
    }

    /// The stable text form (see the module docs and `DESIGN.md`, "Text dumps").
    pub fn to_text(&self) -> String {
        self.to_string()
    }

    /// Parses the text form back into a graph, re-inferring every type and
    /// checking it against the declared one.
    pub fn parse(text: &str) -> Result<Graph> {
        parse::parse(text)
    }

    /// Graphviz `dot` source: one box per node labelled with op, attributes and type.
    pub fn to_dot(&self) -> String {
        dot::to_dot(self)
    }

    /// The print-time number of each node: inputs first (in input order), then
    /// every other node in arena order. Errors and dumps both use it.
    pub fn numbering(&self) -> Vec<u32> {
        let mut num = vec![u32::MAX; self.nodes.len()];
        let mut next = 0u32;
        for id in &self.inputs {
            let i = id.index();
            if i < num.len()
                && num[i] == u32::MAX
                && matches!(self.nodes[i].op, NodeOp::Input { .. })
            {
                num[i] = next;
                next += 1;
            }
        }
        for slot in num.iter_mut() {
            if *slot == u32::MAX {
                *slot = next;
                next += 1;
            }
        }
        num
    }
}

#[cfg(test)]
mod tests;
