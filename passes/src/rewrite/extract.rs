//! Extraction: the cheapest e-node of every class under the cost model
//! below, chosen greedily bottom-up (as egg's `Extractor` does), then the
//! chosen nodes reachable from the outputs rebuilt into an [`ir::Graph`].
//!
//! Cost model (units: bytes moved; a value of type `T[d..]` is `numel * size` bytes):
//!
//! - an op that runs a kernel costs [`LAUNCH_BYTES`] (the fixed cost of one
//!   launch) plus the bytes it reads (every operand) and writes (every result);
//! - layout ops (view, permute, expand, slice, select), inputs, constants and
//!   `getitem` are free: a kernel reads through strides and offsets, so they
//!   move nothing;
//! - an op whose operands are all parameter-only (see the analysis) costs
//!   [`HOISTED`] times that: it runs once per parameter version, not per call;
//! - every e-node costs [`NODE_EPS`] more, so of two equal alternatives the
//!   one with fewer nodes wins, and a class's cost is always above its
//!   operands' (the greedy choice is then acyclic; checked anyway).
//!
//! A class's cost is its chosen node's cost plus its operand classes' costs
//! (a tree cost: a shared operand counts once per use). Ties go to the first
//! e-node in class order (e-nodes are ordered by their printed form), so the
//! result is the same from run to run.
//!
//! [`ir::Graph`]: kiln_ir::graph::Graph

use super::analysis::{ClassData, KilnEGraph};
use super::lang::{emit, KilnLang, Signature};
use egg::{Id, Language};
use kiln_ir::graph::{Graph, NodeId, NodeOp};
use kiln_ir::op::{Meta, Op};
use kiln_ir::shape::numel;
use kiln_ir::{bail, Result};
use std::collections::{BTreeSet, HashMap};

/// The fixed cost of one kernel launch, in bytes (a few microseconds of
/// memory traffic on a CPU).
pub const LAUNCH_BYTES: f64 = 16384.0;
/// What parameter-only work costs relative to per-call work.
pub const HOISTED: f64 = 1e-3;
/// The cost every e-node adds.
pub const NODE_EPS: f64 = 1.0;

fn bytes(m: &Meta) -> f64 {
    (numel(&m.dims) * m.dtype.size()) as f64
}

/// Layout ops: a kernel reads through them, they move no data.
pub fn is_view(op: &Op) -> bool {
    matches!(
        op,
        Op::View(_) | Op::Permute(_) | Op::Expand(_) | Op::Slice { .. } | Op::Select { .. }
    )
}

/// The cost of running `op` on operands of types `ins` giving `outs`, without
/// [`NODE_EPS`]; `hoisted`: every operand is parameter-only.
pub fn op_cost(op: &Op, ins: &[&Meta], outs: &[Meta], hoisted: bool) -> f64 {
    if is_view(op) {
        return 0.0;
    }
    let moved: f64 =
        ins.iter().map(|m| bytes(m)).sum::<f64>() + outs.iter().map(bytes).sum::<f64>();
    let c = LAUNCH_BYTES + moved;
    if hoisted {
        c * HOISTED
    } else {
        c
    }
}

/// The cost of one e-node of a class with data `own`, operands' data from `child`.
fn node_cost<'a>(n: &KilnLang, own: &ClassData, child: impl Fn(Id) -> &'a ClassData) -> f64 {
    NODE_EPS
        + match n {
            KilnLang::Op(k, ch) => {
                let Some(op) = k.op() else {
                    return f64::INFINITY;
                };
                let ins: Option<Vec<&Meta>> = ch.iter().map(|&c| child(c).meta()).collect();
                let Some(ins) = ins else { return f64::INFINITY };
                let hoisted = ch.iter().all(|&c| child(c).konst);
                op_cost(op, &ins, &own.metas, hoisted)
            }
            _ => 0.0,
        }
}

/// The same cost model over a graph, each node counted once (what the report shows).
pub fn graph_cost(g: &Graph, params: &BTreeSet<NodeId>) -> f64 {
    let mut konst = vec![false; g.len()];
    let mut total = 0.0;
    for (id, n) in g.iter() {
        let k = match &n.op {
            NodeOp::Input { .. } => params.contains(&id),
            NodeOp::Const(_) => true,
            _ => n.operands.iter().all(|o| konst[o.index()]),
        };
        konst[id.index()] = k;
        total += NODE_EPS;
        if let NodeOp::Op(op) = &n.op {
            let ins: Vec<&Meta> = n
                .operands
                .iter()
                .filter_map(|&o| g.node(o).meta())
                .collect();
            total += op_cost(op, &ins, &n.metas, k);
        }
    }
    total
}

/// The chosen e-node of every class, and the cost of each.
pub struct Choice {
    best: HashMap<Id, (f64, KilnLang)>,
}

impl Choice {
    /// Greedy bottom-up: repeat until nothing improves, visiting classes by id
    /// and e-nodes in class order; a node is priced once all its operands are.
    pub fn new(eg: &KilnEGraph) -> Choice {
        let mut classes: Vec<Id> = eg.classes().map(|c| c.id).collect();
        classes.sort();
        let mut best: HashMap<Id, (f64, KilnLang)> = HashMap::new();
        loop {
            let mut changed = false;
            for &c in &classes {
                for n in &eg[c].nodes {
                    let operands: Option<f64> = n
                        .children()
                        .iter()
                        .map(|&ch| best.get(&eg.find(ch)).map(|b| b.0))
                        .sum();
                    let Some(operands) = operands else { continue };
                    let cost = node_cost(n, &eg[c].data, |ch| &eg[ch].data) + operands;
                    if best.get(&c).is_none_or(|b| cost < b.0) {
                        best.insert(c, (cost, n.clone()));
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        Choice { best }
    }

    /// The cost of class `c` (infinite if it has no finite choice).
    pub fn cost(&self, eg: &KilnEGraph, c: Id) -> f64 {
        self.best.get(&eg.find(c)).map_or(f64::INFINITY, |b| b.0)
    }

    /// Rebuilds the graph of the chosen nodes reachable from `outputs`: every
    /// input of `sig` first (in order, even if unused), then the nodes in
    /// post-order from the outputs, in order. Errors on a cycle.
    pub fn build(&self, eg: &KilnEGraph, outputs: &[Id], sig: &Signature) -> Result<Graph> {
        Ok(self.build_with_classes(eg, outputs, sig)?.0)
    }

    /// [`Choice::build`], also returning the e-class each new node was extracted from.
    pub fn build_with_classes(
        &self,
        eg: &KilnEGraph,
        outputs: &[Id],
        sig: &Signature,
    ) -> Result<(Graph, HashMap<NodeId, Id>)> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            Open,
            Done(NodeId),
        }
        let mut g = Graph::new(sig.name.clone());
        let inputs: Vec<NodeId> = sig
            .inputs
            .iter()
            .map(|(name, meta)| g.input(name.clone(), meta.clone()))
            .collect();
        let mut mark: HashMap<Id, Mark> = HashMap::new();
        let chosen = |c: Id| -> Result<&KilnLang> {
            match self.best.get(&c) {
                Some((_, n)) => Ok(n),
                None => bail!("rewrite", "e-class {c} has no extractable e-node"),
            }
        };
        for &root in outputs {
            let mut stack = vec![(eg.find(root), false)];
            while let Some((c, post)) = stack.pop() {
                let n = chosen(c)?;
                if post {
                    let ops: Vec<NodeId> = n
                        .children()
                        .iter()
                        .map(|&ch| match mark.get(&eg.find(ch)) {
                            Some(Mark::Done(id)) => *id,
                            _ => unreachable!("operands are emitted first"),
                        })
                        .collect();
                    let id = match n {
                        KilnLang::Input(i) => match inputs.get(*i as usize) {
                            Some(&id) => id,
                            None => bail!("rewrite", "input<{i}> beyond the signature"),
                        },
                        _ => emit(&mut g, n, &ops)?,
                    };
                    mark.insert(c, Mark::Done(id));
                    continue;
                }
                match mark.get(&c) {
                    Some(Mark::Done(_)) => continue,
                    Some(Mark::Open) => {
                        bail!("rewrite", "extraction chose a cycle through e-class {c}")
                    }
                    None => {}
                }
                mark.insert(c, Mark::Open);
                stack.push((c, true));
                for &ch in n.children().iter().rev() {
                    let ch = eg.find(ch);
                    match mark.get(&ch) {
                        Some(Mark::Open) => {
                            bail!("rewrite", "extraction chose a cycle through e-class {ch}")
                        }
                        Some(Mark::Done(_)) => {}
                        None => stack.push((ch, false)),
                    }
                }
            }
        }
        for &root in outputs {
            match mark.get(&eg.find(root)) {
                Some(Mark::Done(id)) => g.output(*id)?,
                _ => bail!("rewrite", "output e-class {root} was not extracted"),
            }
        }
        let classes = mark
            .into_iter()
            .filter_map(|(c, m)| match m {
                Mark::Done(id) => Some((id, c)),
                Mark::Open => None,
            })
            .collect();
        Ok((g, classes))
    }
}
