//! Multi-output kernels in the executor: the roots of one kernel stay
//! pending until the last, where one launch stores them all and each root
//! is handed its tensor.

use super::*;

impl Executable {
    /// A multi-output kernel's root `id`: pending until the last root, where
    /// ONE kernel stores them all (`Val::Many`, in [`fusion::Kernel::roots`]
    /// order, which [`Executable::hand_over`] gives each root).
    pub(super) fn store_many(
        &self,
        kernel: &fusion::Kernel,
        id: NodeId,
        l: Lazy,
        vals: &[Option<Val>],
    ) -> Result<Val> {
        if id != kernel.root {
            return Ok(Val::One(l));
        }
        let mut exprs = vec![];
        for r in &kernel.also {
            match &vals[r.index()] {
                Some(Val::One(x)) => exprs.push(x.clone()),
                _ => bail!(
                    "compile",
                    "{} of a multi-output kernel has no pending value",
                    self.graph.node(*r).op_name()
                ),
            }
        }
        exprs.push(l);
        let refs: Vec<&Lazy> = exprs.iter().collect();
        Ok(Val::Many(Lazy::materialize_many(&refs)?))
    }

    /// The roots of the multi-output kernel launched at `id` (None: none is).
    pub(super) fn launched_roots(&self, id: NodeId) -> Option<Vec<NodeId>> {
        let k = &self.plan.kernels[self.multi[id.index()]?];
        (k.root == id).then(|| k.roots())
    }

    /// Gives each root of a multi-output kernel its tensor; returns the
    /// launching (last) root's value.
    pub(super) fn hand_over(
        &self,
        roots: &[NodeId],
        ts: Vec<Tensor>,
        vals: &mut [Option<Val>],
    ) -> Result<Option<Val>> {
        if ts.len() != roots.len() {
            bail!(
                "compile",
                "{} values for {} stored roots",
                ts.len(),
                roots.len()
            );
        }
        let mut last = None;
        for (r, t) in roots.iter().zip(ts) {
            last = Some(Val::One(Lazy::tensor(&t)));
            if *r != *roots.last().expect("a root") {
                vals[r.index()] = last.take();
            }
        }
        Ok(last)
    }
}
