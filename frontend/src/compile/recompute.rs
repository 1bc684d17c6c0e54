//! Activation checkpointing under `compile()`: the trace's checkpoint
//! regions (`trace::checkpoint_region`) carried through rewrite and
//! decompose to the joint graph the partitioner splits, as one
//! [`SavePolicy`] per lowered node.
//!
//! A lowered node made for a traced node inside a region is
//! [`SavePolicy::Recompute`]; the root of a region boundary (a checkpointed
//! segment's input or output) is [`SavePolicy::Save`]. A node the rewrites
//! made without a traced counterpart follows its users: recomputed when
//! every user is.

use super::trace::Regions;
use kiln_ir::graph::{Graph, NodeId, NodeOp};
use kiln_passes::partition::SavePolicy;
use std::collections::HashSet;

/// The partitioner's policy per node of `lowered`. `origin`: the traced
/// node each lowered node computes the value of (decomposition roots only);
/// `owner`: the traced node each was made for.
pub(crate) fn save_policy(
    lowered: &Graph,
    origin: &[Option<NodeId>],
    owner: &[Option<NodeId>],
    regions: &Regions,
) -> Vec<SavePolicy> {
    let n = lowered.len();
    if regions.inside.is_empty() {
        return vec![SavePolicy::Auto; n];
    }
    let inside: HashSet<NodeId> = regions.inside.iter().copied().collect();
    let boundary: HashSet<NodeId> = regions.boundary.iter().copied().collect();
    let mut policy = vec![SavePolicy::Auto; n];
    let mut unknown = vec![false; n];
    for (id, node) in lowered.iter() {
        let i = id.index();
        if matches!(node.op, NodeOp::Input { .. }) {
            continue;
        }
        policy[i] = match owner.get(i).copied().flatten() {
            Some(t) if boundary.contains(&t) && origin.get(i).copied().flatten() == Some(t) => {
                SavePolicy::Save
            }
            Some(t) if inside.contains(&t) => SavePolicy::Recompute,
            Some(_) => SavePolicy::Auto,
            None => {
                unknown[i] = true;
                SavePolicy::Auto
            }
        };
    }
    // users before operands: a made-up node joins the region its users are in
    let mut users: Vec<Vec<usize>> = vec![vec![]; n];
    for (id, node) in lowered.iter() {
        for o in &node.operands {
            users[o.index()].push(id.index());
        }
    }
    for i in (0..n).rev() {
        if unknown[i]
            && !users[i].is_empty()
            && users[i].iter().all(|&u| policy[u] == SavePolicy::Recompute)
        {
            policy[i] = SavePolicy::Recompute;
        }
    }
    policy
}
