//! Multi-output pointwise kernels: which stored pointwise values share one
//! loop nest. An LSTM step's cell state `c_t` is read by its own step's
//! `h_t = o * tanh(c_t)` and by the next step's `c_{t+1} = f * c_t + i * g`;
//! stored by `h_t`'s kernel, it is computed once per step, where one kernel
//! storing one value would either recompute it in every later step (a chain
//! growing with t) or launch a kernel of its own.
//!
//! A value joins the kernel of a pointwise reader of its shape (the first,
//! in schedule order, that can take it):
//!
//! - a stored pointwise value: always (one launch and one read of it fewer;
//!   the merged kernel reads the union of what the two read);
//! - an unstored one inlined into several kernels: when storing it costs
//!   fewer bytes than the other kernels save by reading it instead of
//!   recomputing it from its own reads.
//!
//! Values are considered from the last to the first: once `c_t` is stored,
//! the products it is computed from are needed by its kernel alone.
//!
//! A group runs at its last root (its launch): every value it reads is
//! computed before, and it must be schedulable there — no node outside the
//! kernel reads a root of it before the launch (such a reader would have to
//! wait for a value that is stored only later, a cycle).

use super::{closure_of, NodeKind};
use kiln_ir::graph::{Graph, NodeId, NodeOp};

/// Per node: the launch root of the multi-output kernel it is another
/// stored root of (None: it is no such root).
pub(super) type LaunchOf = Vec<Option<NodeId>>;

struct Grouper<'a> {
    g: &'a Graph,
    kinds: &'a [NodeKind],
    stored: &'a mut Vec<bool>,
    epilogue_of: &'a [Option<NodeId>],
    users: Vec<Vec<NodeId>>,
    /// Per group launch: its other roots.
    members: Vec<Vec<NodeId>>,
    launch_of: LaunchOf,
}

/// Groups stored pointwise values into multi-output kernels (see the module
/// docs), storing the unstored values that join one; `may_group(id)` says
/// whether node `id` may be a root of a multi-output kernel.
pub(super) fn group_roots(
    g: &Graph,
    kinds: &[NodeKind],
    stored: &mut Vec<bool>,
    epilogue_of: &[Option<NodeId>],
    may_group: &dyn Fn(NodeId) -> bool,
) -> LaunchOf {
    let mut users: Vec<Vec<NodeId>> = vec![vec![]; g.len()];
    for (id, node) in g.iter() {
        for o in &node.operands {
            users[o.index()].push(id);
        }
    }
    let mut s = Grouper {
        g,
        kinds,
        stored,
        epilogue_of,
        users,
        members: vec![vec![]; g.len()],
        launch_of: vec![None; g.len()],
    };
    // last to first: a value is stored before the values it is computed
    // from are considered, so those are then needed by its kernel alone
    for v in (0..g.len()).rev().map(|i| NodeId(i as u32)) {
        if s.groupable(v) && may_group(v) && s.launch_of[v.index()].is_none() {
            s.try_join(v, may_group);
        }
    }
    s.launch_of
}

impl Grouper<'_> {
    /// A pointwise value that no extern computes as its epilogue, not of a
    /// half dtype (rounded only when stored: another root of its kernel
    /// would read it unrounded).
    fn groupable(&self, v: NodeId) -> bool {
        let half = self.g.node(v).meta().is_some_and(|m| m.dtype.is_half());
        self.kinds[v.index()] == NodeKind::Pointwise
            && self.epilogue_of[v.index()].is_none()
            && !half
    }

    fn launch(&self, v: NodeId) -> NodeId {
        self.launch_of[v.index()].unwrap_or(v)
    }

    /// The roots of the group launched at `l`.
    fn roots(&self, l: NodeId) -> Vec<NodeId> {
        let mut r = self.members[l.index()].clone();
        r.push(l);
        r
    }

    /// The launches of the kernels that read or inline `v` (through unstored
    /// pointwise users), in schedule order.
    fn needers(&self, v: NodeId) -> Vec<NodeId> {
        let mut out = vec![];
        let mut seen = vec![false; self.g.len()];
        let mut stack = self.users[v.index()].clone();
        while let Some(u) = stack.pop() {
            if std::mem::replace(&mut seen[u.index()], true) {
                continue;
            }
            if self.stored[u.index()] || self.kinds[u.index()] != NodeKind::Pointwise {
                out.push(self.launch(u));
            } else {
                stack.extend(self.users[u.index()].iter().copied());
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// `v` joins the first pointwise kernel of its shape that needs it and
    /// can take it.
    fn try_join(&mut self, v: NodeId, may_group: &dyn Fn(NodeId) -> bool) {
        let needers = self.needers(v);
        let stored = self.stored[v.index()];
        if !stored && needers.len() < 2 {
            return;
        }
        let dims = |id: NodeId| self.g.node(id).meta().map(|m| m.dims.clone());
        for &k in &needers {
            let same = self.groupable(k) && self.stored[k.index()] && dims(k) == dims(v);
            if !same || !may_group(k) || reads_parts(self.g, self.kinds, self.stored, k) {
                continue;
            }
            // (an unstored value has no group: its roots are itself)
            let mut roots = self.roots(k);
            roots.extend(self.roots(v));
            roots.sort();
            roots.dedup();
            if !self.schedulable(&roots, v) {
                continue;
            }
            if !stored && !self.worth_storing(v, k, &needers) {
                return;
            }
            self.stored[v.index()] = true;
            let l = *roots.last().expect("a root");
            for r in &roots {
                self.launch_of[r.index()] = (*r != l).then_some(l);
            }
            self.members[l.index()] = roots[..roots.len() - 1].to_vec();
            return;
        }
    }

    /// Whether a kernel storing `roots` (with `v` stored) may run at its
    /// last root: a reader of a root that comes before it is computed
    /// inside this kernel and needed by no other (else it would read the
    /// root before it is stored, or recompute it).
    fn schedulable(&mut self, roots: &[NodeId], v: NodeId) -> bool {
        let was = std::mem::replace(&mut self.stored[v.index()], true);
        let (fused, _) = closure_of(self.g, self.stored, roots);
        let l = *roots.last().expect("a root");
        let ok = roots.iter().all(|r| {
            self.users[r.index()].iter().all(|&u| {
                let inside = || {
                    !self.stored[u.index()]
                        && fused.binary_search(&u).is_ok()
                        && self.needers(u).iter().all(|n| roots.contains(n))
                };
                u > l || roots.contains(&u) || inside()
            })
        });
        self.stored[v.index()] = was;
        ok
    }

    /// Whether storing the unstored `v` (in `k`'s kernel) moves fewer bytes
    /// than the other kernels needing it save by reading it instead of
    /// recomputing it.
    fn worth_storing(&mut self, v: NodeId, k: NodeId, needers: &[NodeId]) -> bool {
        let size = |id: NodeId| bytes(self.g, id);
        let (_, own) = closure_of(self.g, self.stored, &[v]);
        self.stored[v.index()] = true;
        let mut saved = 0i64;
        for &n in needers.iter().filter(|n| **n != self.launch(k)) {
            let (_, reads) = closure_of(self.g, self.stored, &self.roots(n));
            let recomputed: usize = own
                .iter()
                .filter(|r| reads.binary_search(r).is_err())
                .map(|r| size(*r))
                .sum();
            saved += recomputed as i64 - size(v) as i64;
        }
        self.stored[v.index()] = false;
        saved > size(v) as i64
    }
}

/// Whether `k`'s kernel reads a one-pass reduction's parts (it may run
/// that reduction as its row pass, which stores one value).
fn reads_parts(g: &Graph, kinds: &[NodeKind], stored: &[bool], k: NodeId) -> bool {
    let (_, reads) = closure_of(g, stored, &[k]);
    reads.iter().any(|r| kinds[r.index()] == NodeKind::Project)
}

/// Bytes a kernel moves to read or write `id` (a splat constant is a scalar argument).
fn bytes(g: &Graph, id: NodeId) -> usize {
    let node = g.node(id);
    if matches!(&node.op, NodeOp::Const(c) if c.is_splat()) {
        return 0;
    }
    node.metas
        .iter()
        .map(|m| m.dims.iter().product::<usize>() * m.dtype.size())
        .sum()
}
