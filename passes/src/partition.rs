//! The partitioner of compiled training (what AOTAutograd's min-cut
//! partitioner does): splits a joint forward+backward graph into a forward
//! graph, which also returns what the backward needs, and a backward graph.
//!
//! A node belongs to the backward when it depends on a tangent (the
//! gradient flowing into an output). A forward value the backward reads is
//! either *saved* (a forward output kept alive until backward) or, when it
//! is a cheap pointwise or view op whose operands the backward has anyway,
//! *recomputed* inside the backward's fused kernels: ReLU's output after a
//! BatchNorm is rebuilt from the batch statistics and the conv output the
//! BatchNorm backward saves regardless, so neither activation is stored.
//!
//! ```text
//! joint:    x, w, tangent0 -> out, grad_w
//! forward:  x, w           -> out, saved0, saved1
//! backward: saved0, saved1, w, tangent0 -> grad_w
//! ```

use kiln_ir::graph::{Graph, NodeId, NodeOp};
use kiln_ir::op::Op;
use kiln_ir::{bail, Result};

mod policy;
pub use policy::SavePolicy;

/// What a backward-graph input is bound to.
#[derive(Debug, Clone, PartialEq)]
pub enum BackwardInput {
    /// The `k`-th saved value (forward output `n_forward_outputs + k`).
    Saved(usize),
    /// Joint-graph input `i` (a primal input, read as it was during forward).
    Primal(usize),
    /// Joint-graph input `i`, a tangent.
    Tangent(usize),
}

/// The two halves of a joint graph.
#[derive(Debug, Clone)]
pub struct Partition {
    /// Inputs: the joint graph's non-tangent inputs, in order. Outputs: the
    /// joint's first `n_forward_outputs` outputs, then the saved values.
    pub forward: Graph,
    /// Inputs as `backward_inputs` lists them; outputs: the joint's outputs
    /// after the forward ones (the gradients), in order.
    pub backward: Graph,
    pub backward_inputs: Vec<BackwardInput>,
    /// Per forward-graph input: its joint-graph input index.
    pub forward_inputs: Vec<usize>,
    pub n_saved: usize,
    /// Bytes of the saved values at the traced shapes (forward outputs, alive
    /// anyway, count nothing).
    pub saved_bytes: usize,
    /// Forward values the backward recomputes instead of saving, and their bytes.
    pub recomputed: usize,
    pub recomputed_bytes: usize,
}

fn bytes(g: &Graph, id: NodeId) -> usize {
    g.node(id)
        .metas
        .iter()
        .map(|m| m.dims.iter().product::<usize>() * m.dtype.size())
        .sum()
}

/// Ops the backward may recompute from their operands: one pass, no
/// reduction, fused into whatever backward kernel reads them.
fn is_cheap(op: &NodeOp) -> bool {
    matches!(
        op,
        NodeOp::Op(
            Op::Unary(_)
                | Op::Binary(_)
                | Op::BinaryScalar { .. }
                | Op::Where
                | Op::Cast(_)
                | Op::View(_)
                | Op::Permute(_)
                | Op::Expand(_)
                | Op::Slice { .. }
                | Op::Select { .. }
        )
    )
}

/// A reduction's result (a batch mean, a row's log-sum-exp): smaller than
/// what it reads, so saving it to recompute the values over it is a bargain.
fn is_summary(g: &Graph, id: NodeId) -> bool {
    let node = g.node(id);
    let numel = |id: NodeId| -> usize { g.node(id).metas[0].dims.iter().product() };
    let reads = |id: NodeId| {
        g.node(id)
            .operands
            .iter()
            .map(|o| numel(*o))
            .max()
            .unwrap_or(0)
    };
    match &node.op {
        NodeOp::Op(Op::Reduce { .. } | Op::Mean { .. } | Op::Var { .. } | Op::Std { .. }) => {
            numel(id) < reads(id)
        }
        NodeOp::Project(_) => {
            let t = node.operands[0];
            matches!(
                g.node(t).op,
                NodeOp::Op(Op::LseParts { .. } | Op::Moments { .. })
            ) && numel(id) < reads(t)
        }
        _ => false,
    }
}

/// Splits `joint`, whose first `n_forward_outputs` outputs are the forward's
/// results and the rest gradients; `tangents` are the inputs carrying output
/// gradients.
pub fn partition(
    joint: &Graph,
    tangents: &[NodeId],
    n_forward_outputs: usize,
) -> Result<Partition> {
    partition_with(joint, tangents, n_forward_outputs, &[])
}

/// [`partition`] with a [`SavePolicy`] per joint node (activation
/// checkpointing: a region's values recomputed, its inputs saved); nodes
/// past the end of `policy` are [`SavePolicy::Auto`].
///
/// ```
/// use kiln_ir::graph::Graph;
/// use kiln_passes::partition::{partition_with, SavePolicy};
/// // out = exp(x @ w); the backward reads z = x @ w
/// let g = Graph::parse("graph f(%0 x: f32[2,3], %1 w: f32[3,3], %2 tangent0: f32[2,3]) {
///   %3 = matmul(%0, %1) : f32[2,3]
///   %4 = exp(%3) : f32[2,3]
///   %5 = mul(%2, %3) : f32[2,3]
///   %6 = permute(%0) {dims=[1,0]} : f32[3,2]
///   %7 = matmul(%6, %5) : f32[3,3]
///   return %4, %7
/// }
/// ").unwrap();
/// let t = [g.inputs()[2]];
/// // by default z is saved; marked Recompute, the backward runs the matmul again
/// assert_eq!(partition_with(&g, &t, 1, &[]).unwrap().n_saved, 1);
/// let mut policy = vec![SavePolicy::Auto; g.len()];
/// policy[3] = SavePolicy::Recompute;
/// let p = partition_with(&g, &t, 1, &policy).unwrap();
/// assert_eq!(p.backward.to_text().matches("matmul(").count(), 2);
/// assert_eq!((p.n_saved, p.recomputed), (0, 2)); // the matmul and the permute
/// ```
pub fn partition_with(
    joint: &Graph,
    tangents: &[NodeId],
    n_forward_outputs: usize,
    policy: &[SavePolicy],
) -> Result<Partition> {
    let pol = |i: usize| policy.get(i).copied().unwrap_or_default();
    let n = joint.len();
    if n_forward_outputs > joint.outputs().len() {
        bail!(
            "partition",
            "{n_forward_outputs} forward outputs but the graph has {}",
            joint.outputs().len()
        );
    }
    let input_pos: std::collections::HashMap<NodeId, usize> = joint
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, id)| (*id, k))
        .collect();
    // tangent-dependent nodes are the backward's
    let mut bwd = vec![false; n];
    for (id, node) in joint.iter() {
        bwd[id.index()] = tangents.contains(&id) || node.operands.iter().any(|o| bwd[o.index()]);
    }
    let (fwd_outs, grad_outs) = joint.outputs().split_at(n_forward_outputs);
    if let Some(o) = fwd_outs.iter().find(|o| bwd[o.index()]) {
        bail!(
            "partition",
            "forward output {o:?} ({}) depends on a tangent",
            joint.node(*o).op_name()
        );
    }

    // backward nodes the gradients need, and the forward values they read
    let mut need_bwd = vec![false; n];
    let mut used_by_bwd = vec![false; n];
    for g in grad_outs {
        if bwd[g.index()] {
            need_bwd[g.index()] = true;
        } else {
            used_by_bwd[g.index()] = true;
        }
    }
    for (id, node) in joint.iter().collect::<Vec<_>>().into_iter().rev() {
        if !need_bwd[id.index()] {
            continue;
        }
        for o in &node.operands {
            if bwd[o.index()] {
                need_bwd[o.index()] = true;
            } else {
                used_by_bwd[o.index()] = true;
            }
        }
    }

    // forward outputs are kept alive anyway: handing one over costs no memory
    let mut is_output = vec![false; n];
    for o in fwd_outs {
        is_output[o.index()] = true;
    }
    // a forward value is available to the backward when it is an input,
    // constant or output, must be saved anyway (not cheap), is a small
    // summary (a reduction), or is cheap over available values
    let mut avail = vec![false; n];
    // values saved because that is smaller than saving the cheap values over
    // them: relu(x) saved once beats saving both its transpose and its mask
    let mut forced: Vec<bool> = (0..n).map(|i| pol(i) == SavePolicy::Save).collect();
    loop {
        let mut changed = false;
        for (id, node) in joint.iter() {
            let i = id.index();
            if bwd[i] {
                continue;
            }
            let all = node.operands.iter().all(|o| avail[o.index()]);
            let recomputable = pol(i) == SavePolicy::Recompute;
            if (is_cheap(&node.op) || recomputable) && used_by_bwd[i] && !all {
                let missing: Vec<NodeId> = node
                    .operands
                    .iter()
                    .copied()
                    .filter(|o| !avail[o.index()] && joint.node(*o).meta().is_some())
                    .collect();
                let cost: usize = missing.iter().map(|o| bytes(joint, *o)).sum();
                // a checkpointed value is rebuilt whatever its operands cost; on
                // a tie a view is rebuilt (it costs nothing), while a computed
                // value is kept, so its producer's fused epilogue stays whole
                let is_view = matches!(
                    node.op,
                    NodeOp::Op(
                        Op::View(_)
                            | Op::Permute(_)
                            | Op::Expand(_)
                            | Op::Slice { .. }
                            | Op::Select { .. }
                    )
                );
                let own = bytes(joint, id);
                if recomputable || cost < own || (cost == own && is_view) {
                    for o in missing {
                        forced[o.index()] = true;
                        avail[o.index()] = true;
                    }
                    changed = true;
                }
            }
            let all = node.operands.iter().all(|o| avail[o.index()]);
            let a = forced[i]
                || is_output[i]
                || match &node.op {
                    NodeOp::Input { .. } | NodeOp::Const(_) => true,
                    op if is_cheap(op) || recomputable => used_by_bwd[i] || all,
                    _ => used_by_bwd[i] || is_summary(joint, id),
                };
            changed |= a != avail[i];
            avail[i] = a;
        }
        if !changed {
            break;
        }
    }
    // what the backward rebuilds (recompute) and what the forward hands over (save)
    let mut recompute = vec![false; n];
    let mut save = vec![false; n];
    let mut primal_used = vec![false; n];
    for (id, node) in joint.iter().collect::<Vec<_>>().into_iter().rev() {
        let i = id.index();
        if bwd[i] || !(used_by_bwd[i] || recompute[i]) {
            continue;
        }
        match &node.op {
            NodeOp::Input { .. } => primal_used[i] = true,
            NodeOp::Const(_) => recompute[i] = true,
            _ if is_output[i] || forced[i] => {
                recompute[i] = false;
                save[i] = true;
            }
            op if (is_cheap(op) || pol(i) == SavePolicy::Recompute)
                && node.operands.iter().all(|o| avail[o.index()]) =>
            {
                recompute[i] = true;
                for o in &node.operands {
                    if !matches!(joint.node(*o).op, NodeOp::Input { .. }) && !used_by_bwd[o.index()]
                    {
                        recompute[o.index()] = true;
                    }
                    if matches!(joint.node(*o).op, NodeOp::Input { .. }) {
                        primal_used[o.index()] = true;
                    }
                }
            }
            _ => {
                recompute[i] = false;
                save[i] = true;
            }
        }
    }
    // a recomputed value's operands that are saved anyway stay saved; the
    // loop above visits operands after their users, so fix up in order
    for (id, node) in joint.iter() {
        if recompute[id.index()] {
            for o in &node.operands {
                let oi = o.index();
                if !recompute[oi] && !save[oi] {
                    match joint.node(*o).op {
                        NodeOp::Input { .. } => primal_used[oi] = true,
                        _ => save[oi] = true,
                    }
                }
            }
        }
    }

    // the forward: every non-tangent input, then what its outputs and the saved values need
    let mut need_fwd = vec![false; n];
    for o in fwd_outs {
        need_fwd[o.index()] = true;
    }
    for i in 0..n {
        if save[i] {
            need_fwd[i] = true;
        }
    }
    for (id, node) in joint.iter().collect::<Vec<_>>().into_iter().rev() {
        if need_fwd[id.index()] {
            for o in &node.operands {
                need_fwd[o.index()] = true;
            }
        }
    }
    let mut forward = Graph::new(format!("{}.forward", joint.name()));
    let mut fmap: Vec<Option<NodeId>> = vec![None; n];
    let mut forward_inputs = vec![];
    for (id, node) in joint.iter() {
        let i = id.index();
        let is_input = matches!(node.op, NodeOp::Input { .. });
        if bwd[i] || !(need_fwd[i] || is_input) {
            continue;
        }
        if is_input {
            forward_inputs.push(input_pos[&id]);
        }
        fmap[i] = Some(copy_node(&mut forward, joint, id, &fmap)?);
    }
    let saved: Vec<NodeId> = joint
        .iter()
        .map(|(id, _)| id)
        .filter(|id| save[id.index()])
        .collect();
    for o in fwd_outs.iter().chain(&saved) {
        forward.output(fmap[o.index()].expect("copied"))?;
    }

    // the backward: saved values, primal inputs and tangents as inputs
    let mut backward = Graph::new(format!("{}.backward", joint.name()));
    let mut bmap: Vec<Option<NodeId>> = vec![None; n];
    let mut backward_inputs = vec![];
    for (k, s) in saved.iter().enumerate() {
        let meta = joint.meta(*s)?.clone();
        bmap[s.index()] = Some(backward.input(format!("saved{k}"), meta));
        backward_inputs.push(BackwardInput::Saved(k));
    }
    for (id, node) in joint.iter() {
        let i = id.index();
        let NodeOp::Input { name } = &node.op else {
            continue;
        };
        let kind = if bwd[i] {
            BackwardInput::Tangent(input_pos[&id])
        } else if primal_used[i] {
            BackwardInput::Primal(input_pos[&id])
        } else {
            continue;
        };
        bmap[i] = Some(backward.input(name.clone(), joint.meta(id)?.clone()));
        backward_inputs.push(kind);
    }
    let mut recomputed = 0;
    let mut recomputed_bytes = 0;
    // checkpointed values are rebuilt where the backward first reads them
    // (not all at its start, which would hold every region's activations
    // at once again)
    let deferred: Vec<bool> = (0..n)
        .map(|i| recompute[i] && pol(i) == SavePolicy::Recompute)
        .collect();
    for (id, node) in joint.iter() {
        let i = id.index();
        if bmap[i].is_some() || !(need_bwd[i] || recompute[i]) {
            continue;
        }
        if recompute[i] && !matches!(node.op, NodeOp::Const(_)) {
            recomputed += 1;
            recomputed_bytes += bytes(joint, id);
        }
        if deferred[i] {
            continue;
        }
        policy::emit_deferred(&mut backward, joint, &node.operands, &deferred, &mut bmap)?;
        bmap[i] = Some(copy_node(&mut backward, joint, id, &bmap)?);
    }
    policy::emit_deferred(&mut backward, joint, grad_outs, &deferred, &mut bmap)?;
    for g in grad_outs {
        backward.output(bmap[g.index()].expect("copied"))?;
    }
    Ok(Partition {
        forward,
        backward,
        backward_inputs,
        forward_inputs,
        n_saved: saved.len(),
        saved_bytes: saved
            .iter()
            .filter(|s| !is_output[s.index()])
            .map(|s| bytes(joint, *s))
            .sum(),
        recomputed,
        recomputed_bytes,
    })
}

/// Copies joint node `id` into `g`, its operands mapped through `map`.
pub(crate) fn copy_node(
    g: &mut Graph,
    joint: &Graph,
    id: NodeId,
    map: &[Option<NodeId>],
) -> Result<NodeId> {
    let node = joint.node(id);
    let ops: Vec<NodeId> = node
        .operands
        .iter()
        .map(|o| {
            map[o.index()].ok_or_else(|| {
                kiln_ir::Error::op(
                    "partition",
                    format!(
                        "{} reads {o:?}, which its half does not have",
                        node.op_name()
                    ),
                )
            })
        })
        .collect::<Result<_>>()?;
    g.add(node.op.clone(), &ops, &node.metas)
}

#[cfg(test)]
mod tests;
