//! Anomaly mode (`torch.autograd.detect_anomaly()`): while the guard lives,
//! a recorded op whose finite inputs give a NaN/Inf output, or a backward
//! node that returns NaN/Inf gradients, is an error naming that op.

use crate::Tensor;
use kiln_ir::Result;
use std::cell::Cell;

thread_local! {
    static ANOMALY: Cell<bool> = const { Cell::new(false) };
}

pub fn is_anomaly_enabled() -> bool {
    ANOMALY.with(|a| a.get())
}

/// Restores the previous anomaly mode when dropped.
#[must_use = "anomaly mode ends when the guard drops"]
pub struct AnomalyGuard {
    prev: bool,
}

impl Drop for AnomalyGuard {
    fn drop(&mut self) {
        ANOMALY.with(|a| a.set(self.prev));
    }
}

/// Turns anomaly detection on until the guard drops.
pub fn detect_anomaly() -> AnomalyGuard {
    AnomalyGuard {
        prev: ANOMALY.with(|a| a.replace(true)),
    }
}

pub(crate) fn has_nonfinite(t: &Tensor) -> bool {
    t.dtype().is_float() && t.to_f64_vec().iter().any(|v| !v.is_finite())
}

/// Forward check: `out` of `op` is non-finite although every input is finite.
pub(crate) fn check_forward(op: &str, out: &Tensor, inputs: &[&Tensor]) -> Result<()> {
    if has_nonfinite(out) && !inputs.iter().any(|t| has_nonfinite(t)) {
        kiln_ir::bail!(
            op,
            "anomaly detected: '{op}' produced NaN/Inf in its output {} from finite inputs",
            kiln_ir::shape::fmt_dims(out.dims())
        );
    }
    Ok(())
}

/// Backward check: the gradient node `name` returned NaN/Inf.
pub(crate) fn check_backward(name: &str, grads: &[Option<Tensor>]) -> Result<()> {
    for (i, g) in grads.iter().enumerate() {
        if let Some(g) = g {
            if has_nonfinite(g) {
                kiln_ir::bail!(
                    name,
                    "anomaly detected: function '{name}' returned NaN/Inf values in its gradient for input {i}"
                );
            }
        }
    }
    Ok(())
}
