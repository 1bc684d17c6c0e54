//! What stops a trace: reading a traced value on the host, an op the graph
//! cannot express, a kernel launched on a traced value by code that recorded
//! no op. Each is a [`GraphBreak`](super::GraphBreak) naming the op.

use super::{break_error, is_tracing, probe, with};
use crate::Tensor;
use kiln_ir::Result;

/// Called where code reads a tensor's values on the host (`item`, `to_vec`):
/// while tracing, reading a traced value stops the trace (the graph cannot
/// depend on data).
pub fn read_value(op: &str, t: &Tensor) -> Result<()> {
    if !is_tracing() {
        if probe::replaying() {
            return probe::replay_read(op, t);
        }
        return Ok(());
    }
    let b = with(|tr| {
        if tr.depth == 0 && tr.is_traced(t) {
            tr.stop(
                op,
                "reads a traced tensor's value on the host (data-dependent control flow \
                 cannot be captured in a graph)"
                    .into(),
            );
            tr.broken.clone()
        } else {
            None
        }
    })
    .flatten();
    match b {
        Some(b) => Err(break_error(&b)),
        None => Ok(()),
    }
}

/// Called by ops a graph cannot express yet (random numbers, in-place writes
/// to traced values): stops the trace with `reason`.
pub fn unsupported(op: &str, reason: &str) -> Result<()> {
    if !is_tracing() {
        return Ok(());
    }
    let b = with(|tr| {
        if tr.depth == 0 {
            tr.stop(op, reason.into());
            tr.broken.clone()
        } else {
            None
        }
    })
    .flatten();
    match b {
        Some(b) => Err(break_error(&b)),
        None => Ok(()),
    }
}

/// The safety net, called before every kernel launch: a kernel that reads a
/// traced value outside any recording op means some op forgot to record, and
/// its result would be baked into the graph as a constant — so tracing stops.
pub fn check_launch(kernel: &str, inputs: &[&Tensor]) -> Result<()> {
    if !is_tracing() {
        return Ok(());
    }
    let hit = with(|tr| tr.depth == 0 && inputs.iter().any(|x| tr.is_traced(x))).unwrap_or(false);
    if hit {
        return unsupported(
            kernel,
            "this op ran a kernel on a traced value without recording a graph node \
             (not supported by the tracer yet)",
        );
    }
    Ok(())
}
