//! The backward pass: walks the recorded graph from the roots in topological
//! order (a node runs once every gradient flowing into it has arrived),
//! reduces each input gradient over broadcast dims to the input's shape,
//! and accumulates into the leaves' `.grad`.

use super::node::{Edge, Node};
use super::{anomaly, no_grad, AutogradMeta};
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, DType, Result};
use kiln_runtime::profiler::{self, Category};
use std::collections::HashMap;
use std::sync::Arc;

type Key = *const Node;

/// Sums `g` over the dims that were broadcast to reach it from `dims`.
pub(crate) fn sum_to(g: &Tensor, dims: &[usize]) -> Result<Tensor> {
    if g.dims() == dims {
        return Ok(g.clone());
    }
    let lead = g.rank().saturating_sub(dims.len());
    let mut red: Vec<i64> = (0..lead as i64).collect();
    for (i, &d) in dims.iter().enumerate() {
        if d == 1 && g.dims().get(lead + i).is_some_and(|&x| x != 1) {
            red.push((lead + i) as i64);
        }
    }
    let s = if red.is_empty() {
        g.clone()
    } else {
        g.sum(Some(&red), true)?
    };
    s.reshape_dims(dims)
}

fn accumulate(slot: &mut Option<Tensor>, g: Tensor) -> Result<()> {
    *slot = Some(match slot.take() {
        None => g,
        Some(old) => old.add(&g)?,
    });
    Ok(())
}

fn accumulate_leaf(m: &Arc<AutogradMeta>, g: Tensor) -> Result<()> {
    // `contiguous()` of a contiguous tensor is a second handle on its storage:
    // take it only when it copies, or the share test below copies every grad
    let g = if g.is_contiguous() {
        g
    } else {
        g.contiguous()?
    };
    let mut slot = m.grad.lock().unwrap_or_else(|e| e.into_inner());
    let new = match slot.take() {
        None if g.storage_is_shared() => g.copy()?,
        None => g,
        Some(old) => old.add(&g)?,
    };
    *slot = Some(new);
    Ok(())
}

impl Tensor {
    /// Whether other handles (or views) may alias this tensor's storage, so a
    /// gradient must be copied before it becomes a `.grad`.
    fn storage_is_shared(&self) -> bool {
        Arc::strong_count(&self.storage) > 1
    }
}

/// `torch.autograd.backward(tensors, grad_tensors, retain_graph)`: runs backward
/// from every root at once (their gradients add up in shared inputs).
pub fn backward(roots: &[&Tensor], grads: &[&Tensor], retain_graph: bool) -> Result<()> {
    // Leaf hooks and queued callbacks (`hooks.rs`) wrap the `.grad` sink.
    super::hooks::around_backward(roots, &mut accumulate_leaf, |sink| {
        super::tensor_hooks::with_leaf_hooks(roots, sink, |sink| {
            run(roots, grads, retain_graph, sink)
        })
    })
}

/// The gradient reaching each leaf from `roots` (seeded with `grads`), in the
/// order the leaves are first reached, without touching any `.grad` — what
/// `torch.autograd.grad` computes for every leaf. The compiler traces this to
/// get the backward half of a joint graph.
pub(crate) fn leaf_grads(
    roots: &[&Tensor],
    grads: &[&Tensor],
) -> Result<Vec<(Arc<AutogradMeta>, Tensor)>> {
    let mut out: Vec<(Arc<AutogradMeta>, Tensor)> = vec![];
    run(roots, grads, false, &mut |m, g| {
        match out.iter_mut().find(|(k, _)| Arc::ptr_eq(k, m)) {
            Some((_, old)) => *old = old.add(&g)?,
            None => out.push((m.clone(), g)),
        }
        Ok(())
    })?;
    Ok(out)
}

/// Where a leaf's gradient goes: its `.grad`, or a collector.
type LeafSink<'a> = dyn FnMut(&Arc<AutogradMeta>, Tensor) -> Result<()> + 'a;

fn run(
    roots: &[&Tensor],
    grads: &[&Tensor],
    retain_graph: bool,
    leaf: &mut LeafSink<'_>,
) -> Result<()> {
    if roots.len() != grads.len() {
        bail!(
            "backward",
            "got {} tensors but {} gradients",
            roots.len(),
            grads.len()
        );
    }
    let _ng = no_grad();
    let _p = profiler::scope("backward", Category::Op);
    let mut nodes: HashMap<Key, Arc<Node>> = HashMap::new();
    let mut buffers: HashMap<Key, Option<Tensor>> = HashMap::new();
    let mut starts = vec![];
    for (r, g) in roots.iter().zip(grads) {
        if !r.requires_grad() {
            bail!(
                "backward",
                "element 0 of tensors does not require grad and does not have a grad_fn (shape {})",
                fmt_dims(r.dims())
            );
        }
        if g.dims() != r.dims() {
            bail!(
                "backward",
                "gradient has shape {} but the output has shape {}",
                fmt_dims(g.dims()),
                fmt_dims(r.dims())
            );
        }
        let g = g.detach().to_dtype(r.dtype())?;
        match r.grad_fn() {
            Some(n) => {
                let k = Arc::as_ptr(&n);
                accumulate(buffers.entry(k).or_default(), g)?;
                nodes.insert(k, n.clone());
                starts.push(n);
            }
            None => leaf(r.autograd.as_ref().unwrap(), g)?,
        }
    }
    // dependency counts: how many edges from nodes in the graph point at each node
    let mut deps: HashMap<Key, usize> = HashMap::new();
    let mut stack: Vec<Arc<Node>> = starts.clone();
    let mut seen: std::collections::HashSet<Key> = stack.iter().map(Arc::as_ptr).collect();
    while let Some(n) = stack.pop() {
        for inp in &n.inputs {
            if let Some(Edge::Node(m)) = &inp.edge {
                let k = Arc::as_ptr(m);
                *deps.entry(k).or_default() += 1;
                if seen.insert(k) {
                    nodes.insert(k, m.clone());
                    stack.push(m.clone());
                }
            }
        }
    }
    let mut ready: Vec<Arc<Node>> = vec![];
    for n in starts {
        let k = Arc::as_ptr(&n);
        if deps.get(&k).copied().unwrap_or(0) == 0 && !ready.iter().any(|r| Arc::as_ptr(r) == k) {
            ready.push(n);
        }
    }
    while let Some(n) = ready.pop() {
        let k = Arc::as_ptr(&n);
        let g = buffers.remove(&k).flatten();
        let mut outs = {
            let mut f = n.f.lock().unwrap_or_else(|e| e.into_inner());
            let Some(func) = f.as_ref() else {
                bail!(
                    n.name(),
                    "trying to backward through the graph a second time (or to use saved tensors after they were freed); call backward with retain_graph=true the first time"
                );
            };
            let g = match g {
                Some(g) => Some(super::tensor_hooks::on_node(&n, g)?),
                None => None,
            };
            let outs = match &g {
                Some(g) => {
                    let _p = profiler::scope_with(Category::Backward, || n.name().to_string())
                        .shapes(|| vec![g.dims().to_vec()]);
                    Some(func(g)?)
                }
                None => None,
            };
            if !retain_graph {
                *f = None;
            }
            outs
        };
        if let Some(outs) = &outs {
            if anomaly::is_anomaly_enabled() {
                anomaly::check_backward(n.name(), outs)?;
            }
        }
        for (i, inp) in n.inputs.iter().enumerate() {
            let Some(edge) = &inp.edge else { continue };
            // taken, not cloned: a leaf's gradient whose storage nothing else
            // holds becomes its `.grad` without a copy (W6: 7 MB of copies a step)
            let gi = match outs.as_mut().and_then(|o| o.get_mut(i)?.take()) {
                Some(gi) => {
                    let gi = sum_to(&gi, &inp.dims)?;
                    let dt = if inp.dtype.is_float() {
                        inp.dtype
                    } else {
                        DType::F32
                    };
                    Some(gi.to_dtype(dt)?)
                }
                None => None,
            };
            match edge {
                Edge::Leaf(m) => {
                    if let Some(gi) = gi {
                        leaf(m, gi)?;
                    }
                }
                Edge::Node(m) => {
                    let mk = Arc::as_ptr(m);
                    let slot = buffers.entry(mk).or_default();
                    if let Some(gi) = gi {
                        accumulate(slot, gi)?;
                    }
                    let d = deps.get_mut(&mk).expect("counted");
                    *d -= 1;
                    if *d == 0 {
                        ready.push(m.clone());
                    }
                }
            }
        }
    }
    Ok(())
}

impl Tensor {
    /// `loss.backward()` for a one-element output (gradient 1).
    pub fn backward(&self) -> Result<()> {
        if self.numel() != 1 {
            bail!(
                "backward",
                "grad can be implicitly created only for scalar outputs, got shape {}; use backward_with(grad)",
                fmt_dims(self.dims())
            );
        }
        let one = Tensor::ones(self.dims(), self.dtype()).to_device(self.device())?;
        backward(&[self], &[&one], false)
    }

    /// `y.backward(gradient=grad)`.
    pub fn backward_with(&self, grad: &Tensor) -> Result<()> {
        backward(&[self], &[grad], false)
    }

    /// `y.backward(gradient=grad, retain_graph=...)`; `None` = 1 for a scalar.
    pub fn backward_opts(&self, grad: Option<&Tensor>, retain_graph: bool) -> Result<()> {
        let one;
        let g = match grad {
            Some(g) => g,
            None => {
                if self.numel() != 1 {
                    bail!(
                        "backward",
                        "grad can be implicitly created only for scalar outputs, got shape {}",
                        fmt_dims(self.dims())
                    );
                }
                one = Tensor::ones(self.dims(), self.dtype()).to_device(self.device())?;
                &one
            }
        };
        backward(&[self], &[g], retain_graph)
    }
}
