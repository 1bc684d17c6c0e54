//! What the partitioner may do with one forward value: its own choice, or
//! what activation checkpointing asks (PyTorch's `CheckpointPolicy`): a
//! checkpointed region's values are rebuilt in the backward from the
//! region's inputs, which are saved.

use super::copy_node;
use kiln_ir::graph::{Graph, NodeId};
use kiln_ir::Result;

/// Per joint-graph node: how the partitioner treats its value when the
/// backward reads it.
///
/// ```
/// use kiln_passes::partition::SavePolicy;
/// assert_eq!(SavePolicy::default(), SavePolicy::Auto);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SavePolicy {
    /// Saved, or recomputed when it is a cheap op over available values.
    #[default]
    Auto,
    /// Recomputed in the backward (any op), from values that are saved or
    /// recomputed themselves: inside a checkpointed region.
    Recompute,
    /// Saved when the backward reads it: a checkpointed region's input or output.
    Save,
}

/// Copies into `backward` every deferred (checkpoint-recomputed) node that
/// `ids` need and that is not there yet, operands first.
pub(super) fn emit_deferred(
    backward: &mut Graph,
    joint: &Graph,
    ids: &[NodeId],
    deferred: &[bool],
    bmap: &mut [Option<NodeId>],
) -> Result<()> {
    let mut stack: Vec<NodeId> = ids
        .iter()
        .copied()
        .filter(|o| deferred[o.index()] && bmap[o.index()].is_none())
        .collect();
    while let Some(&top) = stack.last() {
        if bmap[top.index()].is_some() {
            stack.pop();
            continue;
        }
        let missing: Vec<NodeId> = joint
            .node(top)
            .operands
            .iter()
            .copied()
            .filter(|o| deferred[o.index()] && bmap[o.index()].is_none())
            .collect();
        if missing.is_empty() {
            bmap[top.index()] = Some(copy_node(backward, joint, top, bmap)?);
            stack.pop();
        } else {
            stack.extend(missing);
        }
    }
    Ok(())
}
