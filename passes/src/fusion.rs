//! Fusion groups: which values a compiled graph stores, and which kernels
//! compute them. Deterministic, one walk over a graph of primitives.
//!
//! The rules, in the order they are checked (each has a test below):
//!
//! | producer  | consumer              | decision                                   | why |
//! |-----------|-----------------------|--------------------------------------------|-----|
//! | pointwise | pointwise             | inline into the consumer's kernel          | a chain is one pass over memory |
//! | pointwise | reduction             | inline as the reduction's prologue         | the row is read once |
//! | reduction | pointwise             | stored; the consumer reads it (epilogue)   | a reduced value is small |
//! | pointwise | view / extern / output| stored                                     | views and extern kernels index memory |
//! | pointwise | > `MAX_RECOMPUTE` uses| stored                                     | recomputing for many readers costs more than one store |
//! | pointwise | > 1 use, chain > `MAX_INLINED_CHAIN` | stored                      | a long chain recomputed per reader grows without bound |
//! | pointwise | `u` > 1 uses, reads `R` elements, `(u-1)·R > (u+1)·V` | stored | each reader re-reading the chain's inputs costs more than one store (`V`: its elements) and keeps them all alive (a residual stream `x + a1 + a2 + ...`) |
//! | extern    | one pointwise chain   | the chain is the extern's epilogue         | applied per output tile while it is in cache |
//! | lse_parts / moments | the one pointwise kernel reading its parts | the reader may run it as its row pass | the row is re-read from cache, not memory |
//! | pointwise, stored or inlined into > 1 kernel | the first pointwise kernel of its shape needing it, schedulable | stored by that kernel too (one loop, several stores; see `group.rs`) | computed once and stored where it is computed anyway: an LSTM step's `c_t` and `h_t` are one kernel |
//!
//! A stored pointwise value is the root of one kernel, or one of the roots
//! of a multi-output kernel; its inlined producers are the kernel's body.
//! Views cost nothing: they re-describe stored memory.

use kiln_ir::graph::{Graph, NodeId, NodeOp};
use kiln_ir::op::Op;
use std::fmt::Write;

mod group;

/// A pointwise value read by more kernels than this is stored, not recomputed.
pub const MAX_RECOMPUTE: usize = 3;

/// A pointwise value read more than once whose inlined chain is longer than
/// this is stored: an LSTM's cell state `c_t = f * c_{t-1} + i * g` is
/// pointwise across all steps, and each step's `h_t` kernel would otherwise
/// recompute the whole chain back to `c_0` (quadratic in the sequence length).
pub const MAX_INLINED_CHAIN: usize = 48;

/// How a node executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// Graph input or constant.
    Leaf,
    /// Elementwise with broadcasting (fusable).
    Pointwise,
    /// A reduction over some dims (takes a pointwise prologue).
    Reduction,
    /// Re-describes its operand's memory (view, permute, expand, slice, select).
    View,
    /// Runs as its own kernel on stored operands (matmul, conv, pools, ...).
    Extern,
    /// Picks one result of a multi-output node.
    Project,
}

/// Classifies a node of a decomposed graph.
pub fn node_kind(op: &NodeOp) -> NodeKind {
    match op {
        NodeOp::Input { .. } | NodeOp::Const(_) => NodeKind::Leaf,
        NodeOp::Project(_) => NodeKind::Project,
        NodeOp::Op(op) => match op {
            Op::Unary(_) | Op::Binary(_) | Op::BinaryScalar { .. } | Op::Where | Op::Cast(_) => {
                NodeKind::Pointwise
            }
            Op::Reduce { .. } | Op::Mean { .. } | Op::LseParts { .. } | Op::Moments { .. } => {
                NodeKind::Reduction
            }
            Op::View(_) | Op::Permute(_) | Op::Expand(_) | Op::Slice { .. } | Op::Select { .. } => {
                NodeKind::View
            }
            _ => NodeKind::Extern,
        },
    }
}

/// What a kernel of the plan computes.
#[derive(Debug, Clone, PartialEq)]
pub enum KernelKind {
    /// Its body stores one pointwise value (or several: [`Kernel::also`]).
    Pointwise,
    /// One reduction with its inlined prologue.
    Reduction,
    /// An extern kernel, optionally with a pointwise epilogue whose result it stores.
    Extern { epilogue: Option<NodeId> },
}

/// One kernel launch of the compiled graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    pub kind: KernelKind,
    /// The node whose value the kernel stores (for an extern with an epilogue:
    /// the extern node; the epilogue's root shares its buffer). A kernel
    /// storing several values runs at this one, the last in schedule order.
    pub root: NodeId,
    /// The other values a multi-output pointwise kernel stores (each in its
    /// own buffer), in schedule order, all before `root`; empty otherwise.
    pub also: Vec<NodeId>,
    /// The pointwise nodes computed inside it (prologue/body/epilogue), in order.
    pub fused: Vec<NodeId>,
    /// Stored values it reads.
    pub reads: Vec<NodeId>,
}

/// The fusion decisions for one graph.
#[derive(Debug, Clone, PartialEq)]
pub struct FusionPlan {
    /// Per node: its value lives in memory (else it is recomputed inline).
    pub stored: Vec<bool>,
    /// Per node: the extern whose epilogue computes it (its value shares that buffer).
    pub epilogue_of: Vec<Option<NodeId>>,
    /// Per one-pass reduction (lse_parts, moments): the root of the only
    /// pointwise kernel that reads its parts, which may run the reduction
    /// as its row pass (the executor decides by device and dtype).
    pub row_pass_of: Vec<Option<NodeId>>,
    pub kernels: Vec<Kernel>,
}

impl FusionPlan {
    /// Kernel launches per call.
    pub fn launches(&self) -> usize {
        self.kernels.len()
    }
}

impl Kernel {
    /// Every value the kernel stores: [`Kernel::also`], then `root`.
    pub fn roots(&self) -> Vec<NodeId> {
        let mut r = self.also.clone();
        r.push(self.root);
        r
    }
}

/// The pointwise nodes a kernel rooted at `root` inlines, and the stored values they read.
fn closure(g: &Graph, stored: &[bool], root: NodeId) -> (Vec<NodeId>, Vec<NodeId>) {
    closure_of(g, stored, &[root])
}

/// [`closure`] of a kernel storing every one of `roots` (each computed, not read).
fn closure_of(g: &Graph, stored: &[bool], roots: &[NodeId]) -> (Vec<NodeId>, Vec<NodeId>) {
    let mut seen = vec![false; g.len()];
    let mut fused = vec![];
    let mut reads = vec![];
    let mut stack = roots.to_vec();
    while let Some(id) = stack.pop() {
        if std::mem::replace(&mut seen[id.index()], true) {
            continue;
        }
        let root = roots.contains(&id);
        if !root && stored[id.index()] {
            reads.push(id);
            continue;
        }
        match node_kind(&g.node(id).op) {
            NodeKind::Pointwise => fused.push(id),
            NodeKind::Leaf => {
                reads.push(id);
                continue;
            }
            _ if root => {}
            _ => {
                reads.push(id);
                continue;
            }
        }
        stack.extend(g.node(id).operands.iter().copied());
    }
    fused.sort();
    reads.sort();
    (fused, reads)
}

/// Which values live in memory: the first rows of the module table, by
/// node in topological order (so operands are decided first).
fn decide_stored(
    g: &Graph,
    kinds: &[NodeKind],
    uses: &[usize],
    needs_memory: &[bool],
) -> Vec<bool> {
    let n = g.len();
    let splat_const = |i: usize| matches!(&g.nodes()[i].op, NodeOp::Const(c) if c.is_splat());
    // nodes come in topological order, so operands are decided first
    let mut stored = vec![false; n];
    let mut inlined = vec![0usize; n];
    // per pointwise node: the stored values its inlined chain reads
    let mut chain_reads: Vec<Vec<usize>> = vec![vec![]; n];
    let elems = |i: usize| -> usize {
        let m = &g.nodes()[i].metas;
        m.iter().map(|m| kiln_ir::shape::numel(&m.dims)).sum()
    };
    // what reading a stored value costs: a broadcast reads its source
    let read_cost = |i: usize| -> usize {
        match &g.nodes()[i].op {
            NodeOp::Op(Op::Expand(_)) => elems(g.nodes()[i].operands[0].index()),
            _ => elems(i),
        }
    };
    for (i, node) in g.nodes().iter().enumerate() {
        stored[i] = match kinds[i] {
            NodeKind::Pointwise => needs_memory[i] || uses[i] > MAX_RECOMPUTE,
            NodeKind::Leaf => !splat_const(i) || needs_memory[i],
            _ => true,
        };
        if kinds[i] == NodeKind::Pointwise {
            let body = node
                .operands
                .iter()
                .filter(|o| kinds[o.index()] == NodeKind::Pointwise && !stored[o.index()])
                .fold(1usize, |a, o| a.saturating_add(inlined[o.index()]));
            let mut reads: Vec<usize> = vec![];
            for o in node.operands.iter().map(|o| o.index()) {
                match kinds[o] == NodeKind::Pointwise && !stored[o] {
                    true => reads.extend_from_slice(&chain_reads[o]),
                    false if !splat_const(o) => reads.push(o),
                    false => {}
                }
            }
            reads.sort_unstable();
            reads.dedup();
            let read_elems: usize = reads.iter().map(|&r| read_cost(r)).sum();
            let u = uses[i];
            let rereads = (u.saturating_sub(1)).saturating_mul(read_elems);
            if u > 1 && (body > MAX_INLINED_CHAIN || rereads > (u + 1).saturating_mul(elems(i))) {
                stored[i] = true;
            }
            inlined[i] = body;
            chain_reads[i] = reads;
        }
    }

    stored
}

/// Decides what to store and groups the graph into kernels (see the module table).
pub fn plan_fusion(g: &Graph) -> FusionPlan {
    plan_fusion_with(g, &|_| true)
}

/// [`plan_fusion`], where `may_group(id)` says whether node `id` may be a
/// root of a multi-output kernel (the executor keeps hoisted values, computed
/// once per parameter version, out of kernels that run every call).
pub fn plan_fusion_with(g: &Graph, may_group: &dyn Fn(NodeId) -> bool) -> FusionPlan {
    let n = g.len();
    let kinds: Vec<NodeKind> = g.nodes().iter().map(|x| node_kind(&x.op)).collect();
    let mut uses = vec![0usize; n];
    let mut needs_memory = vec![false; n];
    for node in g.nodes() {
        let consumer = node_kind(&node.op);
        for o in &node.operands {
            uses[o.index()] += 1;
            if !matches!(consumer, NodeKind::Pointwise | NodeKind::Reduction) {
                needs_memory[o.index()] = true;
            }
        }
    }
    for o in g.outputs() {
        needs_memory[o.index()] = true;
    }
    let mut stored = decide_stored(g, &kinds, &uses, &needs_memory);

    // extern + pointwise epilogue: the extern's only reader is inside one stored
    // pointwise root of the same type that no view or other kernel reads first
    let mut epilogue_of = vec![None; n];
    let mut epilogue = vec![None; n];
    let outputs = g.outputs();
    for (id, node) in g.iter() {
        if kinds[id.index()] != NodeKind::Pointwise || !stored[id.index()] {
            continue;
        }
        let (fused, reads) = closure(g, &stored, id);
        let fusable = reads.iter().copied().filter(|r| {
            kinds[r.index()] == NodeKind::Extern
                && matches!(
                    &g.node(*r).op,
                    NodeOp::Op(
                        Op::Conv { .. } | Op::Matmul | Op::Linear | Op::QuantizedLinear { .. }
                    )
                )
                && uses[r.index()] == 1
                && !outputs.contains(r)
                && epilogue[r.index()].is_none()
                && g.node(*r).metas == node.metas
                && fused.iter().all(|f| uses[f.index()] == 1 || *f == id)
        });
        if let Some(e) = fusable.min() {
            epilogue[e.index()] = Some(id);
            epilogue_of[id.index()] = Some(e);
        }
    }

    let launch_of = group::group_roots(g, &kinds, &mut stored, &epilogue_of, may_group);
    let mut also: Vec<Vec<NodeId>> = vec![vec![]; n];
    for (id, _) in g.iter() {
        if let Some(l) = launch_of[id.index()] {
            also[l.index()].push(id);
        }
    }

    let mut kernels = vec![];
    for (id, _) in g.iter() {
        let i = id.index();
        if !stored[i] || epilogue_of[i].is_some() || launch_of[i].is_some() {
            continue;
        }
        let kind = match kinds[i] {
            NodeKind::Pointwise => KernelKind::Pointwise,
            NodeKind::Reduction => KernelKind::Reduction,
            NodeKind::Extern => KernelKind::Extern {
                epilogue: epilogue[i],
            },
            _ => continue,
        };
        let mut roots = also[i].clone();
        roots.push(id);
        let (mut fused, mut reads) = closure_of(g, &stored, &roots);
        if let KernelKind::Extern { epilogue: Some(e) } = kind {
            let (f2, r2) = closure(g, &stored, e);
            fused = f2;
            reads.extend(r2.into_iter().filter(|r| *r != id));
            reads.sort();
            reads.dedup();
        }
        kernels.push(Kernel {
            kind,
            root: id,
            also: std::mem::take(&mut also[i]),
            fused,
            reads,
        });
    }
    let row_pass_of = row_passes(g, &kernels, &epilogue_of);
    FusionPlan {
        stored,
        epilogue_of,
        row_pass_of,
        kernels,
    }
}

/// [`FusionPlan::row_pass_of`]: a one-pass reduction over one dim whose
/// parts are read only through `getitem`s, by pointwise nodes, all inside
/// one pointwise kernel (not an extern's epilogue), none a graph output.
fn row_passes(
    g: &Graph,
    kernels: &[Kernel],
    epilogue_of: &[Option<NodeId>],
) -> Vec<Option<NodeId>> {
    let mut users: Vec<Vec<NodeId>> = vec![vec![]; g.len()];
    for (id, node) in g.iter() {
        for o in &node.operands {
            users[o.index()].push(id);
        }
    }
    let outputs = g.outputs();
    let mut out = vec![None; g.len()];
    for (id, node) in g.iter() {
        let one_dim = match &node.op {
            NodeOp::Op(Op::LseParts { dims } | Op::Moments { dims, .. }) => dims.len() == 1,
            _ => false,
        };
        let parts = &users[id.index()];
        let only_parts = parts
            .iter()
            .all(|p| matches!(g.node(*p).op, NodeOp::Project(_)) && !outputs.contains(p));
        let pointwise_readers = parts
            .iter()
            .flat_map(|p| &users[p.index()])
            .all(|u| node_kind(&g.node(*u).op) == NodeKind::Pointwise);
        if !one_dim || !only_parts || !pointwise_readers {
            continue;
        }
        let readers: Vec<&Kernel> = kernels
            .iter()
            .filter(|k| k.reads.iter().any(|r| parts.contains(r)))
            .collect();
        if let [k] = readers.as_slice() {
            if k.kind == KernelKind::Pointwise && epilogue_of[k.root.index()].is_none() {
                out[id.index()] = Some(k.root);
            }
        }
    }
    out
}

/// `fused[mul+add+gelu]`-style name of a kernel, as profiles and dumps show it.
pub fn kernel_name(g: &Graph, k: &Kernel) -> String {
    let op = |id: NodeId| g.node(id).op_name();
    let body: Vec<String> = k.fused.iter().map(|&f| op(f)).collect();
    match &k.kind {
        KernelKind::Pointwise if !k.also.is_empty() => {
            format!("fused[{}] stores {}", body.join("+"), 1 + k.also.len())
        }
        KernelKind::Pointwise if body.len() == 1 => body[0].clone(),
        KernelKind::Pointwise => format!("fused[{}]", body.join("+")),
        KernelKind::Reduction if body.is_empty() => op(k.root),
        KernelKind::Reduction => format!("{}[{}]", op(k.root), body.join("+")),
        KernelKind::Extern { epilogue: None } => op(k.root),
        KernelKind::Extern { epilogue: Some(_) } => {
            format!("{}+epilogue[{}]", op(k.root), body.join("+"))
        }
    }
}

/// The `fused` stage dump: one line per kernel, with the graph's numbering.
pub fn dump(g: &Graph, plan: &FusionPlan) -> String {
    let num = g.numbering();
    let id = |n: NodeId| format!("%{}", num[n.index()]);
    let mut s = String::new();
    for (i, k) in plan.kernels.iter().enumerate() {
        let ty = |r: NodeId| {
            let m = g.node(r).meta();
            m.map(|m| m.to_string()).unwrap_or_else(|| "tuple".into())
        };
        let ty: Vec<String> = k.roots().into_iter().map(ty).collect();
        let ty = ty.join(", ");
        let reads: Vec<String> = k.reads.iter().map(|&r| id(r)).collect();
        let fused: Vec<String> = k.fused.iter().map(|&r| id(r)).collect();
        let roots: Vec<String> = k.roots().into_iter().map(id).collect();
        let _ = write!(
            s,
            "kernel {i} {}: {} = {} ({})",
            kind_name(&k.kind),
            roots.join(", "),
            kernel_name(g, k),
            reads.join(", ")
        );
        if !fused.is_empty() {
            let _ = write!(s, " fuses [{}]", fused.join(", "));
        }
        if let Some(r) = plan.row_pass_of[k.root.index()] {
            let _ = write!(s, " row pass of {}", id(r));
        }
        let _ = writeln!(s, " : {ty}");
    }
    s
}

fn kind_name(k: &KernelKind) -> &'static str {
    match k {
        KernelKind::Pointwise => "pointwise",
        KernelKind::Reduction => "reduction",
        KernelKind::Extern { .. } => "extern",
    }
}

#[cfg(test)]
mod tests;
