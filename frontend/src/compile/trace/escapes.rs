//! State a traced function writes outside its results: a forward that
//! stashes a value it computed (`self.probs = probs` through a `Mutex` or
//! `RefCell`) would keep the traced run's tensor forever, since a cached
//! compiled call runs no user code. The tracer keeps a weak reference to
//! every value it recorded; once the traced run's tensors are gone (its
//! results were replaced by the compiled run's), one still alive, computed
//! from the arguments, is held by something the function wrote.

use super::Binding;
use crate::Tensor;
use kiln_ir::graph::{Graph, NodeId, NodeOp};
use kiln_ir::shape::fmt_dims;
use kiln_runtime::Storage;
use std::sync::{Arc, Weak};

/// A value the trace recorded: its storage (weakly) and node.
#[derive(Clone)]
pub struct Recorded {
    pub(super) storage: Weak<Storage>,
    pub(super) node: NodeId,
}

impl Recorded {
    pub(super) fn of(t: &Tensor, node: NodeId) -> Recorded {
        Recorded {
            storage: Arc::downgrade(&t.storage),
            node,
        }
    }
}

/// Per node of `g`: its value depends on an argument of the call.
fn from_args(g: &Graph, bindings: &[Binding]) -> Vec<bool> {
    let mut dep = vec![false; g.len()];
    let arg_inputs: Vec<NodeId> = g
        .inputs()
        .iter()
        .zip(bindings)
        .filter(|(_, b)| matches!(b, Binding::Arg(_)))
        .map(|(id, _)| *id)
        .collect();
    for (id, node) in g.iter() {
        dep[id.index()] = arg_inputs.contains(&id)
            || (!matches!(node.op, NodeOp::Input { .. })
                && node.operands.iter().any(|o| dep[o.index()]));
    }
    dep
}

/// The first recorded value, computed from the arguments, that something
/// other than `known` (how many references each storage may have from
/// holders that are not the function's state: the captured-value replay's
/// script) still holds; as an error message for `name`.
pub(crate) fn stale_state(
    name: &str,
    g: &Graph,
    bindings: &[Binding],
    recorded: &[Recorded],
    known: impl Fn(&Arc<Storage>) -> usize,
) -> Option<String> {
    let dep = from_args(g, bindings);
    let mut seen = std::collections::HashSet::new();
    for r in recorded {
        let Some(s) = r.storage.upgrade() else {
            continue;
        };
        if !dep.get(r.node.index()).copied().unwrap_or(false) || !seen.insert(Arc::as_ptr(&s)) {
            continue;
        }
        // one reference is ours (the upgrade)
        if Arc::strong_count(&s) > 1 + known(&s) {
            let node = g.node(r.node);
            let what = match node.meta() {
                Some(m) => format!("{} {}", m.dtype, fmt_dims(&m.dims)),
                None => "a tuple".into(),
            };
            return Some(format!(
                "`{name}` keeps a tensor it computed from its inputs ({what}, made by `{}`) \
                 outside its results, e.g. in a field such as `self.probs`: a cached compiled \
                 call runs none of that code, so the stored value would stay the first call's. \
                 Return it as a result instead (a forward_many or compile_fn returning several \
                 tensors) and read it from the compiled call's outputs",
                node.op_name()
            ));
        }
    }
    None
}
