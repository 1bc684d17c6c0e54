//! Graph nodes of the tape: a node is made by an op whose result needs a
//! gradient; it holds the backward rule (a closure over [`Saved`] tensors)
//! and one edge per input (to the input's own node, or to a leaf's `.grad`).

use super::{anomaly, is_grad_enabled, AutogradMeta};
use crate::Tensor;
use kiln_ir::shape::{fmt_dims, Dims};
use kiln_ir::{DType, Error, Result};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// A backward rule: gradient of the output -> one optional gradient per input.
pub(crate) type BackwardFn = Box<dyn Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

/// Where an input's gradient goes.
#[derive(Clone)]
pub(crate) enum Edge {
    Node(Arc<Node>),
    Leaf(Arc<AutogradMeta>),
}

pub(crate) struct Input {
    pub edge: Option<Edge>,
    pub dims: Dims,
    pub dtype: DType,
}

/// One recorded op (`MulBackward`, ...).
pub struct Node {
    pub(crate) name: String,
    pub(crate) inputs: Vec<Input>,
    /// None once released by a backward without `retain_graph`.
    pub(crate) f: Mutex<Option<BackwardFn>>,
}

impl Node {
    /// `ExpBackward`-style name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

fn backward_name(op: &str) -> String {
    let mut s = String::new();
    for part in op.split('_') {
        let mut c = part.chars();
        if let Some(f) = c.next() {
            s.extend(f.to_uppercase());
            s.push_str(c.as_str());
        }
    }
    s + "Backward"
}

/// A tensor saved for backward, with the version it had when saved.
#[derive(Clone)]
pub(crate) struct Saved {
    t: Tensor,
    version: u64,
    op: &'static str,
}

impl Saved {
    /// Saves `t` (without its autograd state, so no reference cycle forms).
    pub fn new(op: &'static str, t: &Tensor) -> Saved {
        Saved {
            t: t.detach(),
            version: t.version.get(),
            op,
        }
    }

    /// The saved tensor; an error when an in-place op changed it since.
    pub fn get(&self) -> Result<Tensor> {
        let now = self.t.version.get();
        if now != self.version {
            return Err(Error::op(
                backward_name(self.op),
                format!(
                    "one of the variables needed for gradient computation has been modified by an inplace operation ({}): a tensor of shape {} saved by '{}' is at version {now}; expected version {}",
                    self.t.version.last_op(),
                    fmt_dims(self.t.dims()),
                    self.op,
                    self.version
                ),
            ));
        }
        Ok(self.t.clone())
    }
}

/// Whether an op on `inputs` must be recorded (grad mode on, some input requires grad).
pub(crate) fn needs_grad(inputs: &[&Tensor]) -> bool {
    is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
}

/// Attaches a backward node for `op` to `out`. `f` maps the output's gradient
/// to one gradient per input (None = no gradient); the engine sums each
/// gradient over broadcast dims and casts it to the input's dtype.
pub(crate) fn record(
    op: &'static str,
    out: Tensor,
    inputs: &[&Tensor],
    f: impl Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
) -> Result<Tensor> {
    record_with_leaves(op, out, inputs, &[], f)
}

/// A leaf of a recorded graph (a parameter), reached through a node's edges.
#[derive(Clone)]
pub(crate) struct LeafRef {
    pub meta: Arc<AutogradMeta>,
    pub dims: Dims,
    pub dtype: DType,
}

impl LeafRef {
    /// `t` as a leaf edge, when it is a leaf that requires grad.
    pub fn of(t: &Tensor) -> Option<LeafRef> {
        let m = t.autograd.as_ref()?;
        (t.requires_grad() && m.grad_fn.is_none()).then(|| LeafRef {
            meta: m.clone(),
            dims: t.dims_vec(),
            dtype: t.dtype(),
        })
    }
}

/// The leaves the graph behind `t` reaches, each once, in the order first
/// reached (depth first from `t`'s node), except those in `except`.
pub(crate) fn reachable_leaves(t: &Tensor, except: &[Arc<AutogradMeta>]) -> Vec<LeafRef> {
    let mut out: Vec<LeafRef> = vec![];
    let mut seen: Vec<*const Node> = vec![];
    let mut stack: Vec<Arc<Node>> = t.grad_fn().into_iter().collect();
    while let Some(n) = stack.pop() {
        let key = Arc::as_ptr(&n);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        for i in n.inputs.iter().rev() {
            match &i.edge {
                Some(Edge::Node(c)) => stack.push(c.clone()),
                Some(Edge::Leaf(m)) => {
                    let known = except.iter().chain(out.iter().map(|l| &l.meta));
                    if !known.into_iter().any(|k| Arc::ptr_eq(k, m)) {
                        out.push(LeafRef {
                            meta: m.clone(),
                            dims: i.dims.clone(),
                            dtype: i.dtype,
                        });
                    }
                }
                None => {}
            }
        }
    }
    out
}

/// [`record`] with extra leaf edges after the tensor inputs: `f` returns one
/// gradient per input, then one per leaf.
pub(crate) fn record_with_leaves(
    op: &'static str,
    mut out: Tensor,
    inputs: &[&Tensor],
    leaves: &[LeafRef],
    f: impl Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
) -> Result<Tensor> {
    if anomaly::is_anomaly_enabled() {
        anomaly::check_forward(op, &out, inputs)?;
    }
    let leaf_inputs = leaves.iter().map(|l| Input {
        edge: Some(Edge::Leaf(l.meta.clone())),
        dims: l.dims.clone(),
        dtype: l.dtype,
    });
    let inputs = inputs
        .iter()
        .map(|t| Input {
            edge: t
                .autograd
                .as_ref()
                .filter(|_| t.requires_grad())
                .map(|m| match &m.grad_fn {
                    Some(n) => Edge::Node(n.clone()),
                    None => Edge::Leaf(m.clone()),
                }),
            dims: t.dims_vec(),
            dtype: t.dtype(),
        })
        .chain(leaf_inputs)
        .collect();
    let node = Arc::new(Node {
        name: backward_name(op),
        inputs,
        f: Mutex::new(Some(Box::new(f))),
    });
    out.autograd = Some(Arc::new(AutogradMeta {
        requires_grad: AtomicBool::new(true),
        grad: Mutex::new(None),
        grad_fn: Some(node),
    }));
    Ok(out)
}

impl Tensor {
    /// A tensor sharing the data but cut from the graph (`detach()`); it does not require grad.
    pub fn detach(&self) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            layout: self.layout.clone(),
            autograd: None,
            version: self.version.clone(),
        }
    }

    /// Whether this tensor was made by the user (no recorded op), as `is_leaf`.
    pub fn is_leaf(&self) -> bool {
        self.grad_fn().is_none()
    }

    /// The node that made this tensor, if it was recorded.
    pub fn grad_fn(&self) -> Option<Arc<Node>> {
        self.autograd.as_ref().and_then(|m| m.grad_fn.clone())
    }

    /// The storage's version counter (bumped by every in-place op).
    pub fn version(&self) -> u64 {
        self.version.get()
    }

    /// Checks that an in-place op `op` may write into `self` and bumps its
    /// version. Writing into a leaf that requires grad (outside `no_grad`) is
    /// an error, as is writing into a tensor that is part of a recorded graph.
    /// While tracing, an in-place write outside any recording op is a graph break.
    pub(crate) fn prepare_inplace(&self, op: &str, src: &[&Tensor]) -> Result<()> {
        crate::compile::trace::unsupported(
            op,
            "writes into a tensor in place while tracing (a graph has no in-place ops yet)",
        )?;
        check_write_overlap(op, self, src)?;
        if is_grad_enabled() {
            if self.requires_grad() {
                if self.is_leaf() {
                    kiln_ir::bail!(
                        op,
                        "a leaf tensor that requires grad (shape {}) is being used in an in-place operation; wrap it in no_grad() or use an out-of-place op",
                        fmt_dims(self.dims())
                    );
                }
                kiln_ir::bail!(
                    op,
                    "in-place operation on a tensor of shape {} that is the output of '{}' (requires grad) is not supported; use an out-of-place op",
                    fmt_dims(self.dims()),
                    self.grad_fn().map(|n| n.name().to_string()).unwrap_or_default()
                );
            }
            if src.iter().any(|s| s.requires_grad()) {
                kiln_ir::bail!(
                    op,
                    "the source requires grad but the destination (shape {}) does not track gradients; detach() the source or use an out-of-place op",
                    fmt_dims(self.dims())
                );
            }
        }
        self.version.bump(op);
        Ok(())
    }
}

/// PyTorch's aliasing rules for a write into `dst`: no two of its elements
/// share memory (an expanded view), and no source partly overlaps it (a
/// shifted copy of itself would read what it already overwrote).
fn check_write_overlap(op: &str, dst: &Tensor, src: &[&Tensor]) -> Result<()> {
    use kiln_ir::op::overlap;
    if overlap::has_internal_overlap(dst.layout()) {
        kiln_ir::bail!(
            op,
            "{} (destination shape {}, strides {:?})",
            overlap::INTERNAL_OVERLAP,
            fmt_dims(dst.dims()),
            dst.strides()
        );
    }
    for s in src {
        if s.shares_storage(dst) && overlap::partial_overlap(s.layout(), dst.layout()) {
            kiln_ir::bail!(
                op,
                "{} (source shape {} at offset {}, destination shape {} at offset {})",
                overlap::PARTIAL_OVERLAP,
                fmt_dims(s.dims()),
                s.offset(),
                fmt_dims(dst.dims()),
                dst.offset()
            );
        }
    }
    Ok(())
}
