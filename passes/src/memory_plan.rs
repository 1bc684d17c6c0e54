//! The memory plan: when each stored value of a fused graph dies, and which
//! buffer it can reuse. Values are allocated in schedule order; a buffer whose
//! last reader has run returns to a pool and the next value that fits takes it
//! (best fit). Views keep their base alive; graph outputs live to the end.

use crate::fusion::{FusionPlan, KernelKind};
use kiln_ir::graph::{Graph, NodeId, NodeOp};

/// Where each stored value lives and when it can be freed.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    /// Buffer sizes in bytes.
    pub buffers: Vec<usize>,
    /// Per node: the buffer holding its value (kernel results only).
    pub buffer_of: Vec<Option<usize>>,
    /// Per node: values whose last reader is this node (free them after it runs).
    pub free_after: Vec<Vec<NodeId>>,
    /// Bytes of all buffers (the most the plan ever holds).
    pub planned_peak: usize,
    /// Bytes if every kernel result got a fresh buffer and none were freed.
    pub unplanned: usize,
}

fn bytes(g: &Graph, id: NodeId) -> usize {
    g.node(id)
        .metas
        .iter()
        .map(|m| m.dims.iter().product::<usize>() * m.dtype.size())
        .sum()
}

/// Plans buffers for the kernels of `plan` (see the module docs).
pub fn plan_memory(g: &Graph, plan: &FusionPlan) -> MemoryPlan {
    let n = g.len();
    // when each kernel runs: at its root, or (extern + epilogue) at the epilogue's root
    let mut runs_at: Vec<Option<usize>> = vec![None; n];
    let mut value_of = vec![None; n]; // the kernel root owning a node's memory
    for k in &plan.kernels {
        let at = match k.kind {
            KernelKind::Extern { epilogue: Some(e) } => {
                value_of[e.index()] = Some(k.root);
                e.index()
            }
            _ => k.root.index(),
        };
        for r in k.roots() {
            runs_at[r.index()] = Some(at);
            value_of[r.index()] = Some(r);
        }
    }
    // views and projections alias their operand's memory
    for (id, node) in g.iter() {
        let aliases = matches!(node.op, NodeOp::Project(_))
            || crate::fusion::node_kind(&node.op) == crate::fusion::NodeKind::View;
        if aliases {
            value_of[id.index()] = value_of[node.operands[0].index()];
        }
    }
    let mut last_use = vec![0usize; n];
    for k in &plan.kernels {
        let at = runs_at[k.root.index()].unwrap_or(0);
        for r in &k.reads {
            if let Some(owner) = value_of[r.index()] {
                last_use[owner.index()] = last_use[owner.index()].max(at);
            }
        }
    }
    for o in g.outputs() {
        if let Some(owner) = value_of[o.index()] {
            last_use[owner.index()] = usize::MAX;
        }
    }
    let mut order: Vec<NodeId> = plan.kernels.iter().flat_map(|k| k.roots()).collect();
    order.sort_by_key(|r| runs_at[r.index()]);

    let values: Vec<Interval> = order
        .iter()
        .map(|root| Interval {
            bytes: bytes(g, *root),
            class: 0,
            def: runs_at[root.index()].unwrap_or(0),
            last: last_use[root.index()],
        })
        .collect();
    let placed = assign_buffers(&values);
    let mut buffer_of = vec![None; n];
    let mut free_after = vec![vec![]; n];
    for ((root, v), b) in order.iter().zip(&values).zip(&placed.buffer_of) {
        buffer_of[root.index()] = Some(*b);
        if v.last != usize::MAX {
            free_after[v.last.max(v.def)].push(*root);
        }
    }
    MemoryPlan {
        planned_peak: placed.buffers.iter().sum(),
        buffers: placed.buffers,
        buffer_of,
        free_after,
        unplanned: values.iter().map(|v| v.bytes).sum(),
    }
}

/// A value to place: its size, a class (only values of one class share a
/// buffer: the executor's buffers are typed), the step that writes it first
/// and the last step that reads it (`usize::MAX`: it outlives the run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub bytes: usize,
    pub class: usize,
    pub def: usize,
    pub last: usize,
}

/// Buffers for a list of [`Interval`]s and which one each value takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Buffer sizes in bytes.
    pub buffers: Vec<usize>,
    /// Per value: its buffer.
    pub buffer_of: Vec<usize>,
}

/// Places `values` (sorted by `def`) in buffers: a value takes the smallest
/// free buffer of its class that fits (a buffer is free once the last reader
/// of its value has run, strictly before the new value's first step), else
/// the largest free one of its class, grown to fit (ViT-B/16's planned peak
/// 71.6 -> 62.2 MB), else a new one. Two values share a buffer only when their lifetimes are disjoint.
///
/// ```
/// use kiln_passes::memory_plan::{assign_buffers, Interval};
/// let v = |def, last| Interval { bytes: 64, class: 0, def, last };
/// // a chain a -> b -> c: c reuses a's buffer
/// let p = assign_buffers(&[v(0, 1), v(1, 2), v(2, 3)]);
/// assert_eq!(p.buffers.len(), 2);
/// assert_eq!(p.buffer_of[0], p.buffer_of[2]);
/// ```
pub fn assign_buffers(values: &[Interval]) -> Placement {
    let mut buffers: Vec<usize> = vec![];
    let mut class_of: Vec<usize> = vec![];
    let mut buffer_of = Vec::with_capacity(values.len());
    let mut live: Vec<usize> = vec![];
    let mut pool: Vec<usize> = vec![];
    for (i, v) in values.iter().enumerate() {
        live.retain(|&u| {
            let dead = values[u].last < v.def;
            if dead {
                pool.push(buffer_of[u]);
            }
            !dead
        });
        let fit = pool
            .iter()
            .enumerate()
            .filter(|(_, &b)| buffers[b] >= v.bytes && class_of[b] == v.class)
            .min_by_key(|(_, &b)| (buffers[b], b))
            .map(|(i, _)| i);
        // none fits: grow the largest free buffer of the class (the values
        // it held still fit) rather than add a whole new one
        let grow = || {
            pool.iter()
                .enumerate()
                .filter(|(_, &b)| class_of[b] == v.class)
                .max_by_key(|(_, &b)| (buffers[b], std::cmp::Reverse(b)))
                .map(|(i, _)| i)
        };
        let b = match fit.or_else(grow) {
            Some(i) => {
                let b = pool.swap_remove(i);
                buffers[b] = buffers[b].max(v.bytes);
                b
            }
            None => {
                buffers.push(v.bytes);
                class_of.push(v.class);
                buffers.len() - 1
            }
        };
        buffer_of.push(b);
        live.push(i);
    }
    Placement { buffers, buffer_of }
}

/// Peak bytes of intermediates when every op runs as its own kernel and each
/// result is freed after its last reader (what eager execution holds).
pub fn eager_peak(g: &Graph) -> usize {
    let all = crate::fusion::FusionPlan {
        stored: vec![true; g.len()],
        epilogue_of: vec![None; g.len()],
        row_pass_of: vec![None; g.len()],
        kernels: g
            .iter()
            .filter(|(_, n)| {
                matches!(
                    crate::fusion::node_kind(&n.op),
                    crate::fusion::NodeKind::Pointwise
                        | crate::fusion::NodeKind::Reduction
                        | crate::fusion::NodeKind::Extern
                )
            })
            .map(|(id, n)| crate::fusion::Kernel {
                kind: KernelKind::Pointwise,
                root: id,
                also: vec![],
                fused: vec![],
                reads: n.operands.to_vec(),
            })
            .collect(),
    };
    let m = plan_memory(g, &all);
    peak_live(g, &all, &m)
}

/// The most bytes live at once under `m` (values allocated at their kernel,
/// freed after their last reader).
pub fn peak_live(g: &Graph, plan: &FusionPlan, m: &MemoryPlan) -> usize {
    let mut events: Vec<(usize, i64)> = vec![];
    for k in &plan.kernels {
        let b: usize = k.roots().into_iter().map(|r| bytes(g, r)).sum();
        events.push((k.root.index() * 2, b as i64));
    }
    for (at, vals) in m.free_after.iter().enumerate() {
        for v in vals {
            events.push((at * 2 + 1, -(bytes(g, *v) as i64)));
        }
    }
    events.sort();
    let (mut cur, mut peak) = (0i64, 0i64);
    for (_, d) in events {
        cur += d;
        peak = peak.max(cur);
    }
    peak as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::plan_fusion;

    #[test]
    fn a_chain_of_stored_values_reuses_two_buffers() {
        // relu -> exp -> neg, each stored because a permute (a view) reads it
        let g = Graph::parse(
            "graph m(%0 x: f32[4,4]) {
  %1 = relu(%0) : f32[4,4]
  %2 = permute(%1) {dims=[1,0]} : f32[4,4]
  %3 = exp(%2) : f32[4,4]
  %4 = permute(%3) {dims=[1,0]} : f32[4,4]
  %5 = neg(%4) : f32[4,4]
  %6 = permute(%5) {dims=[1,0]} : f32[4,4]
  %7 = sin(%6) : f32[4,4]
  return %7
}
",
        )
        .unwrap();
        let p = plan_fusion(&g);
        let m = plan_memory(&g, &p);
        assert_eq!(p.kernels.len(), 4);
        assert_eq!(m.unplanned, 4 * 64);
        // relu's buffer is free once exp has run, so neg takes it
        assert_eq!(m.buffers.len(), 2, "{m:?}");
        assert_eq!(m.planned_peak, 2 * 64);
        assert_eq!(m.buffer_of[1], m.buffer_of[5]);
    }

    fn v(bytes: usize, class: usize, def: usize, last: usize) -> Interval {
        Interval {
            bytes,
            class,
            def,
            last,
        }
    }

    #[test]
    fn buffers_are_shared_only_within_a_class_and_by_disjoint_lifetimes() {
        // a dies before c: c (same class, fits) takes a's buffer; b (other
        // class) and d (overlapping c) get their own
        let p = assign_buffers(&[
            v(64, 0, 0, 1),
            v(64, 1, 1, 3),
            v(32, 0, 2, 4),
            v(64, 0, 3, 5),
        ]);
        assert_eq!(p.buffer_of[2], p.buffer_of[0]);
        assert_ne!(p.buffer_of[1], p.buffer_of[0]);
        assert_ne!(p.buffer_of[3], p.buffer_of[2]);
        // a buffer last read at step 3 is not free for a value written at step 3
        assert_ne!(p.buffer_of[3], p.buffer_of[1]);
        assert_eq!(p.buffers.len(), 3);
    }

    #[test]
    fn a_free_buffer_too_small_grows_instead_of_a_new_one() {
        // a (64) and b (96) die before c (256): c grows the larger, b's,
        // rather than adding 256 bytes; d (other class) gets its own
        let p = assign_buffers(&[
            v(64, 0, 0, 1),
            v(96, 0, 0, 1),
            v(256, 0, 2, 3),
            v(256, 1, 2, 3),
        ]);
        assert_eq!(p.buffer_of[2], p.buffer_of[1]);
        assert_eq!(p.buffers, [64, 256, 256]);
    }

    #[test]
    fn outputs_are_never_reused() {
        let g = Graph::parse(
            "graph m(%0 x: f32[8]) {\n  %1 = relu(%0) : f32[8]\n  %2 = sum(%1) {dims=[0], keepdim=false} : f32[]\n  %3 = exp(%0) : f32[8]\n  return %1, %3\n}\n",
        )
        .unwrap();
        let p = plan_fusion(&g);
        let m = plan_memory(&g, &p);
        assert_ne!(m.buffer_of[1], m.buffer_of[3]);
        assert!(m.free_after.iter().all(|v| !v.contains(&NodeId(1))));
    }
}
