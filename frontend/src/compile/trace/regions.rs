//! Checkpoint regions in a trace: the nodes that `utils::checkpoint` records
//! (its segment's forward, and the recomputation and gradients its backward
//! node runs) are tagged, and the segment's inputs and output marked as the
//! region's boundary. The joint graph's partitioner then rebuilds the tagged
//! values in the compiled backward and saves only the boundary
//! (`kiln_passes::partition::SavePolicy`), which is what the eager
//! checkpoint does: without the tags it would see values that depend only
//! on forward inputs and save them all.

use super::{is_tracing, key, with};
use crate::Tensor;
use kiln_ir::graph::NodeId;

/// What the checkpoint regions of a trace tagged.
#[derive(Debug, Clone, Default)]
pub struct Regions {
    /// Nodes recorded inside a region (inputs excluded).
    pub inside: Vec<NodeId>,
    /// Regions' inputs and outputs: saved when the backward reads them.
    pub boundary: Vec<NodeId>,
    /// How many regions are open now (only the outermost tags).
    pub(super) open: usize,
}

/// Runs `f`; while tracing, the nodes it records are tagged as a checkpoint
/// region's (rebuilt in the compiled backward instead of saved).
///
/// ```
/// use kiln_frontend::compile::trace::checkpoint_region;
/// // outside a trace it only runs f
/// assert_eq!(checkpoint_region(|| 2 + 2), 4);
/// ```
pub fn checkpoint_region<R>(f: impl FnOnce() -> R) -> R {
    if !is_tracing() {
        return f();
    }
    let start = with(|t| {
        t.regions.open += 1;
        t.graph.len()
    });
    let r = f();
    with(|t| {
        t.regions.open -= 1;
        if t.regions.open == 0 {
            let end = t.graph.len();
            let inside = (start.unwrap_or(end)..end)
                .map(|i| NodeId(i as u32))
                .filter(|id| !t.graph.inputs().contains(id));
            t.regions.inside.extend(inside.collect::<Vec<_>>());
        }
    });
    r
}

/// Marks the traced values of `ts` as a checkpoint region's boundary (its
/// inputs and output): saved, not rebuilt.
pub fn checkpoint_boundary(ts: &[&Tensor]) {
    if !is_tracing() {
        return;
    }
    with(|t| {
        for x in ts {
            if let Some(&id) = t.values.get(&key(x)) {
                t.regions.boundary.push(id);
            }
        }
    });
}

/// True inside a checkpoint region of a trace (random draws there are
/// refused: the compiled recomputation would draw other numbers).
pub(super) fn in_region() -> bool {
    is_tracing() && with(|t| t.regions.open > 0).unwrap_or(false)
}
