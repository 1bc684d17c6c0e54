//! Recording a node step: a node the warm path runs through the
//! executable's own evaluation every call (an extern), with the slots of
//! the values it reads and of the results it returns.

use super::*;

impl Recorder {
    /// `id` becomes a node step: run through the executable every call.
    pub(super) fn node_step(&mut self, exec: &Executable, id: NodeId, v: &Val) {
        let reads = exec.reads_of(id);
        self.push_node_step(exec, id, v, reads, false)
    }

    pub(super) fn push_node_step(
        &mut self,
        exec: &Executable,
        id: NodeId,
        v: &Val,
        reads: Vec<NodeId>,
        extern_only: bool,
    ) {
        let mut uses = vec![];
        for r in &reads {
            match &self.values[r.index()] {
                Some(Value::One(s, _)) => uses.push(*s),
                Some(Value::Many(parts)) => uses.extend(parts.iter().map(|p| p.0)),
                None => {
                    let what = exec.graph.node(*r).op_name();
                    return self.fail(&format!(
                        "{} reads a value with no buffer ({what})",
                        exec.graph.node(id).op_name()
                    ));
                }
            }
        }
        let ts: Vec<Tensor> = match v {
            Val::One(l) => tensor_of(l).into_iter().cloned().collect(),
            Val::Many(ts) => ts.clone(),
            Val::Parts(_) => return self.fail("a pending reduction as a node step"),
        };
        let mut outs = vec![];
        let mut parts = vec![];
        for t in &ts {
            if t.device().is_cuda() {
                return self.fail("a node ran on a CUDA device");
            }
            let p = Arc::as_ptr(&t.storage);
            if let Some(s) = outs.iter().find(|s| {
                self.slot_of
                    .get(&p)
                    .is_some_and(|(i, w)| *i == **s && w.as_ptr() == p)
            }) {
                parts.push((*s, t.layout().clone()));
                continue;
            }
            if self.live_slot(p).is_some() {
                return self.fail("an extern returned a value it did not allocate");
            }
            let s = self.new_slot(SlotKind::Owned, &t.storage);
            outs.push(s);
            parts.push((s, t.layout().clone()));
        }
        uses.extend(&outs);
        self.values[id.index()] = Some(match v {
            Val::One(_) => Value::One(parts[0].0, parts[0].1.clone()),
            Val::Many(_) | Val::Parts(_) => Value::Many(parts),
        });
        self.steps.push(Step::Node {
            id,
            reads,
            outs,
            extern_only,
        });
        self.uses.push(uses);
    }
}
