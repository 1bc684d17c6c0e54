//! Export scopes: a module call that an exporter may write as one node of
//! its own format, the way a `torch.onnx` `symbolic` lets a module stand
//! for itself in the ONNX graph (an `nn.LSTM` as one ONNX `LSTM` node
//! instead of its unrolled steps).
//!
//! Only an exporter asks for scopes ([`recording_scopes`]); in every other
//! trace (`compile`, `.kiln` export) [`export_scope`] just runs its body. In
//! a scope-recording trace the body still records its ordinary ops; the
//! scope adds a note of which nodes it recorded, which traced values it
//! read under which role, and which values it returned, for the exporter
//! to replace.

use super::{is_tracing, with};
use crate::Tensor;
use kiln_ir::graph::NodeId;
use kiln_ir::Result;
use std::cell::Cell;
use std::ops::Range;

/// One recorded module call (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct ExportScope {
    /// Which exporter rule writes it (`"rnn"`).
    pub kind: &'static str,
    /// The module's configuration, as the rule reads it.
    pub attrs: Vec<(&'static str, i64)>,
    /// The graph nodes recorded by the call (arena indices).
    pub nodes: Range<usize>,
    /// The values the call read, by role (`input`, `h0`, `weight_ih_l0`);
    /// `None` for an optional one not given.
    pub inputs: Vec<(String, Option<NodeId>)>,
    /// The values the call returned, in order.
    pub outputs: Vec<NodeId>,
}

thread_local! {
    static RECORDING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (a trace) with export scopes recorded.
///
/// ```
/// use kiln_frontend::compile::trace::{recording_scopes, scopes_wanted};
/// assert!(!scopes_wanted()); // not tracing
/// assert_eq!(recording_scopes(|| 1), 1);
/// ```
pub fn recording_scopes<R>(f: impl FnOnce() -> R) -> R {
    let before = RECORDING.with(|r| r.replace(true));
    let out = f();
    RECORDING.with(|r| r.set(before));
    out
}

/// True in a scope-recording trace outside any op or scope: a module that
/// has an export rule should call [`export_scope`] now.
pub fn scopes_wanted() -> bool {
    RECORDING.with(|r| r.get())
        && is_tracing()
        && with(|t| t.depth == 0 && t.scope_open == 0).unwrap_or(false)
}

/// Runs `f`, a module call reading `inputs`; when [`scopes_wanted`], notes
/// it as an [`ExportScope`] of `kind` with `attrs`.
///
/// ```
/// use kiln_frontend::compile::trace::export_scope;
/// // outside a scope-recording trace it only runs f
/// let y = export_scope("rnn", vec![], &[], || Ok(vec![])).unwrap();
/// assert!(y.is_empty());
/// ```
pub fn export_scope(
    kind: &'static str,
    attrs: Vec<(&'static str, i64)>,
    inputs: &[(String, Option<&Tensor>)],
    f: impl FnOnce() -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    if !scopes_wanted() {
        return f();
    }
    // the inputs get their nodes (weights: graph inputs) before the scope's range
    let ids: Vec<(String, Option<NodeId>)> = inputs
        .iter()
        .map(|(role, t)| {
            let id = t.and_then(|t| with(|tr| tr.value_of(t)));
            (role.clone(), id)
        })
        .collect();
    let start = with(|t| {
        t.scope_open += 1;
        t.graph.len()
    })
    .unwrap_or(0);
    let outs = f();
    with(|t| t.scope_open -= 1);
    let outs = outs?;
    with(|t| {
        let end = t.graph.len();
        let outputs: Option<Vec<NodeId>> = outs
            .iter()
            .map(|o| t.values.get(&super::key(o)).copied())
            .collect();
        // a result the body did not record is not the scope's to replace
        let inside = |id: &NodeId| (start..end).contains(&id.index());
        if let Some(outputs) = outputs.filter(|o| !o.is_empty() && o.iter().all(inside)) {
            t.scopes.push(ExportScope {
                kind,
                attrs,
                nodes: start..end,
                inputs: ids,
                outputs,
            });
        }
    });
    Ok(outs)
}
