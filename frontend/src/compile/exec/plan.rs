//! [`Executable::new`]: a graph's fusion and memory plans, which values are
//! hoisted (computed from parameters and constants only) and cached, the
//! last use of each value, and where each tiled extern's epilogue runs.

use super::*;

impl Executable {
    /// Plans `graph`; `captured[i]` says graph input `i` is a parameter or
    /// buffer (fixed between calls unless its version moves).
    pub fn new(graph: Graph, captured: &[bool]) -> Executable {
        let n = graph.len();
        let mut input_index = vec![None; n];
        for (k, id) in graph.inputs().iter().enumerate() {
            input_index[id.index()] = Some(k);
        }
        let mut hoisted = vec![false; n];
        let mut last_use = vec![0; n];
        for (id, node) in graph.iter() {
            let i = id.index();
            hoisted[i] = match &node.op {
                NodeOp::Input { .. } => {
                    captured.get(input_index[i].unwrap_or(usize::MAX)) == Some(&true)
                }
                NodeOp::Const(_) => true,
                _ => node.operands.iter().all(|o| hoisted[o.index()]),
            };
            for o in &node.operands {
                last_use[o.index()] = i;
            }
        }
        for o in graph.outputs() {
            last_use[o.index()] = usize::MAX;
        }
        let mut indices_read = vec![false; n];
        for node in graph.nodes() {
            if let (NodeOp::Project(1), Some(o)) = (&node.op, node.operands.first()) {
                indices_read[o.index()] = true;
            }
        }
        // a hoisted value is computed once per parameter version: it keeps
        // a kernel of its own rather than join one that runs every call
        let multi_on = multi_out_enabled();
        let plan = fusion::plan_fusion_with(&graph, &|id| multi_on && !hoisted[id.index()]);
        let memory = memory_plan::plan_memory(&graph, &plan);
        // a multi-output kernel runs at its last root: the others' values
        // appear there, and what their pending expressions read lives until then
        for kernel in &plan.kernels {
            let at = kernel.root.index();
            for r in kernel.also.iter().chain(&kernel.reads) {
                if !kernel.also.is_empty() {
                    last_use[r.index()] = last_use[r.index()].max(at);
                }
            }
        }
        // an extern's output lives until its epilogue writes over it
        for (r, e) in plan.epilogue_of.iter().enumerate() {
            if let Some(e) = e {
                last_use[e.index()] = last_use[e.index()].max(r);
            }
        }
        // a float conv's or matmul's epilogue runs at the epilogue's root (a
        // conv's per output tile on the CPU; on a CUDA device inside the
        // extern's one launch): the extern and the epilogue's nodes wait for
        // it, and what they read lives until then
        let mut tiled_root = vec![None; n];
        let mut deferred = vec![false; n];
        for (k, kernel) in plan.kernels.iter().enumerate() {
            let (
                KernelKind::Extern { epilogue: Some(r) },
                NodeOp::Op(Op::Conv { .. } | Op::Matmul | Op::Linear | Op::QuantizedLinear { .. }),
            ) = (&kernel.kind, &graph.node(kernel.root).op)
            else {
                continue;
            };
            let float = graph
                .meta(kernel.root)
                .is_ok_and(|m| matches!(m.dtype, DType::F32 | DType::F64));
            if !float {
                continue;
            }
            tiled_root[r.index()] = Some(k);
            deferred[kernel.root.index()] = true;
            for f in kernel.fused.iter().filter(|f| **f != *r) {
                deferred[f.index()] = true;
            }
            for read in &kernel.reads {
                last_use[read.index()] = last_use[read.index()].max(r.index());
            }
        }
        let mut multi = vec![None; n];
        for (k, kernel) in plan.kernels.iter().enumerate() {
            if !kernel.also.is_empty() {
                for r in kernel.roots() {
                    multi[r.index()] = Some(k);
                }
            }
        }
        let mut frontier = vec![false; n];
        for node in graph.nodes() {
            for o in &node.operands {
                let reader_hoisted = node.operands.iter().all(|x| hoisted[x.index()]);
                if hoisted[o.index()] && !reader_hoisted {
                    frontier[o.index()] = true;
                }
            }
        }
        // a tiled kernel runs at its epilogue's root: when that root is not
        // hoisted, every hoisted value the kernel reads (a transposed weight
        // an RNN multiplies a zero initial state by) is read from outside
        // the hoisted part, so it is cached too
        for kernel in &plan.kernels {
            let Some(r) = (match kernel.kind {
                KernelKind::Extern { epilogue: Some(r) } => Some(r),
                _ => None,
            }) else {
                continue;
            };
            if tiled_root[r.index()].is_some() && !hoisted[r.index()] {
                for read in &kernel.reads {
                    if hoisted[read.index()] {
                        frontier[read.index()] = true;
                    }
                }
            }
        }
        // a hoisted graph output (a value of constants only, which a joint
        // graph's backward may save) has no reader to keep it: cache it, or
        // a warm call would have no value for it
        for o in graph.outputs() {
            if hoisted[o.index()] {
                frontier[o.index()] = true;
            }
        }
        // an input is cheap to rebind; only computed values are worth caching
        for (i, f) in frontier.iter_mut().enumerate() {
            if input_index[i].is_some() || matches!(graph.nodes()[i].op, NodeOp::Const(_)) {
                *f = false;
            }
        }
        Executable {
            graph,
            plan,
            memory,
            hoisted,
            has_frontier: frontier.iter().any(|f| *f),
            frontier,
            last_use,
            input_index,
            tiled_root,
            deferred,
            multi,
            indices_read,
            min_tiled_sample: super::super::epilogue::MIN_TILED_SAMPLE,
            program: OnceLock::new(),
        }
    }
}

/// Whether kernels may store several values: on unless `KILN_MULTI_OUT=0`
/// (the off switch plans one stored value per kernel, for comparison).
fn multi_out_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_MULTI_OUT").map_or(true, |v| v != "0"))
}
