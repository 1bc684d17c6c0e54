//! Reverse-mode autograd: grad mode and the per-tensor autograd state.
//!
//! This is the data model the optimizers and modules rely on (`requires_grad`,
//! `.grad`, `no_grad`). The tape: every op result that needs a gradient holds
//! its backward [`Node`] (`node.rs`); `engine.rs` walks the graph in
//! topological order; the backward rules (`rules/`) are written with Tensor
//! ops. `version.rs` catches in-place changes to saved tensors, `anomaly.rs`
//! names the op that first produced NaN/Inf.

mod anomaly;
mod engine;
pub mod hooks;
mod node;
pub(crate) mod rules;
#[cfg(test)]
mod tape_tests;
mod tensor_hooks;
mod version;

pub use anomaly::{detect_anomaly, is_anomaly_enabled, AnomalyGuard};
pub use engine::backward;
pub(crate) use engine::leaf_grads;
pub use node::Node;
pub(crate) use node::{needs_grad, reachable_leaves, record, record_with_leaves, LeafRef, Saved};
pub use tensor_hooks::GradHookHandle;
pub use version::Version;

use crate::Tensor;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether ops on this thread record the graph for backward.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Restores the previous grad mode when dropped.
#[must_use = "grad mode is restored when the guard drops"]
pub struct GradModeGuard {
    prev: bool,
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.prev));
    }
}

/// `with torch.no_grad():` — no graph is recorded while the guard lives.
///
/// ```
/// let _g = kiln_frontend::autograd::no_grad();
/// assert!(!kiln_frontend::autograd::is_grad_enabled());
/// ```
pub fn no_grad() -> GradModeGuard {
    set_grad_enabled(false)
}

/// Sets the grad mode until the returned guard drops.
pub fn set_grad_enabled(on: bool) -> GradModeGuard {
    let prev = GRAD_ENABLED.with(|g| g.replace(on));
    GradModeGuard { prev }
}

/// Autograd state shared by every handle (clone) of one tensor.
#[derive(Default)]
pub struct AutogradMeta {
    pub(crate) requires_grad: AtomicBool,
    pub(crate) grad: Mutex<Option<Tensor>>,
    /// The node that made this tensor (None for leaves).
    pub(crate) grad_fn: Option<Arc<Node>>,
}

impl Tensor {
    /// Whether gradients flow to this tensor.
    pub fn requires_grad(&self) -> bool {
        self.autograd
            .as_ref()
            .is_some_and(|m| m.requires_grad.load(Ordering::Relaxed))
    }

    /// `requires_grad_(flag)`: marks a leaf as a parameter; returns the same tensor.
    /// (On a non-leaf only `true` is meaningful; `false` is ignored there, use `detach()`.)
    ///
    /// Panics, with PyTorch's message, when `flag` is true and the dtype is
    /// not floating point; [`Tensor::try_requires_grad_`] returns that error.
    pub fn requires_grad_(self, flag: bool) -> Tensor {
        self.try_requires_grad_(flag)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Tensor::requires_grad_`] that returns an error for a non-float
    /// tensor, as PyTorch raises: only floating-point tensors can require
    /// gradients.
    ///
    /// ```
    /// use kiln_frontend::{DType, Tensor};
    /// let e = Tensor::zeros(&[2], DType::I64).try_requires_grad_(true).unwrap_err();
    /// assert_eq!(e.to_string(), "requires_grad_: only Tensors of floating point dtype can require gradients (got i64 [2])");
    /// ```
    pub fn try_requires_grad_(mut self, flag: bool) -> crate::Result<Tensor> {
        if flag && !self.dtype().is_float() {
            return Err(crate::Error::op(
                "requires_grad_",
                format!(
                    "only Tensors of floating point dtype can require gradients (got {} {})",
                    self.dtype(),
                    kiln_ir::shape::fmt_dims(self.dims())
                ),
            ));
        }
        match &self.autograd {
            Some(m) if m.grad_fn.is_some() => {}
            Some(m) => m.requires_grad.store(flag, Ordering::Relaxed),
            None => {
                let m = AutogradMeta::default();
                m.requires_grad.store(flag, Ordering::Relaxed);
                self.autograd = Some(Arc::new(m));
            }
        }
        Ok(self)
    }

    /// The accumulated gradient (`.grad`), if any.
    pub fn grad(&self) -> Option<Tensor> {
        self.autograd
            .as_ref()
            .and_then(|m| m.grad.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Sets `.grad` (None clears it, as `zero_grad(set_to_none=True)` does).
    pub fn set_grad(&self, g: Option<Tensor>) {
        if let Some(m) = &self.autograd {
            *m.grad.lock().unwrap_or_else(|e| e.into_inner()) = g;
        }
    }

    /// Whether both handles are the same tensor (not just the same storage).
    pub fn is_same(&self, other: &Tensor) -> bool {
        match (&self.autograd, &other.autograd) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => self.shares_storage(other) && self.layout == other.layout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::DType;

    #[test]
    fn grad_slot_is_shared_by_clones() {
        let p = Tensor::zeros(&[2], DType::F32).requires_grad_(true);
        let q = p.clone();
        q.set_grad(Some(Tensor::ones(&[2], DType::F32)));
        assert!(p.requires_grad());
        assert_eq!(p.grad().unwrap().to_f64_vec(), vec![1.0, 1.0]);
        p.set_grad(None);
        assert!(q.grad().is_none());
        {
            let _g = no_grad();
            assert!(!is_grad_enabled());
        }
        assert!(is_grad_enabled());
    }
}
