//! Tracer hooks that joint forward+backward graphs need: composites that
//! inline their primitives while a gradient is needed, in-place buffer
//! updates recorded as values, the tangent input, random inputs (Dropout's
//! mask) and host-side work that records nothing.

use super::{is_recording, is_tracing, key, storage_of, unsupported, with, Binding};
use crate::Tensor;
use kiln_ir::Result;

/// What a [`Binding::Random`] input draws.
#[derive(Clone, Debug, PartialEq)]
pub enum RandomSpec {
    /// `bernoulli_mask(dims, p)` as `dtype`: 1 with probability `p`.
    Bernoulli {
        dims: Vec<usize>,
        p: f64,
        dtype: kiln_ir::DType,
    },
}

impl RandomSpec {
    /// Draws from the default generator (what eager code at this point would).
    pub fn draw(&self) -> Result<Tensor> {
        match self {
            RandomSpec::Bernoulli { dims, p, dtype } => {
                crate::random::bernoulli_mask(dims, *p, *dtype, None)
            }
        }
    }
}

/// Restores the tracer's depth when an inlined decomposition ends.
#[must_use = "the decomposition is inlined while the guard lives"]
pub struct InlineGuard {
    active: bool,
}

impl Drop for InlineGuard {
    fn drop(&mut self) {
        if self.active {
            with(|t| t.depth += 1);
        }
    }
}

/// Called by a composite op (`batch_norm`, `layer_norm`, ...) that runs its
/// decomposition as recorded primitive ops because a gradient is needed:
/// while tracing, the primitives record graph nodes and the composite records
/// none. A joint forward+backward graph needs this: the primitives' backward
/// rules save their own results, which must be graph values, not constants.
pub fn inline_decomposition() -> InlineGuard {
    if !is_tracing() {
        return InlineGuard { active: false };
    }
    let active = with(|t| {
        let outermost = t.depth == 1 && t.inlined.len() == 1;
        if outermost {
            t.depth = 0;
            t.inlined[0] = true;
        }
        outermost
    })
    .unwrap_or(false);
    InlineGuard { active }
}

/// Runs `f`, which writes `src` into `dst` in place (BatchNorm's running
/// stats in an inlined decomposition). While tracing, the write becomes a
/// value: `dst`'s node is now `src`'s, and the trace lists `(dst's input,
/// src's node)` in [`Trace::mutations`] so the compiled run writes it back.
/// Only a tensor the traced code did not compute (a buffer) may be written.
pub fn record_mutation(dst: &Tensor, src: &Tensor, f: impl FnOnce() -> Result<()>) -> Result<()> {
    if !is_recording() {
        return f();
    }
    if with(|t| t.is_traced(dst) && !t.graph.inputs().contains(&t.values[&key(dst)]))
        .unwrap_or(false)
    {
        return unsupported(
            "copy_",
            "writes in place into a value computed by the traced code",
        );
    }
    let old = dst.copy()?;
    with(|t| t.depth += 1);
    let r = f();
    with(|t| t.depth -= 1);
    r?;
    with(|t| {
        let input = t.value_of(dst);
        let value = t.value_of(src);
        t.restore.push((dst.clone(), old));
        t.values.insert(key(dst), value);
        t.mutations.push((input, value));
    });
    Ok(())
}

/// Makes `t` (a gradient seed of the `i`-th differentiable output) the graph
/// input `tangent{i}`, bound to [`Binding::Tangent`].
pub fn tangent_input(t: &Tensor, i: usize) {
    if !is_tracing() {
        return;
    }
    with(|tr| {
        let id = tr.graph.input(format!("tangent{i}"), t.meta());
        tr.bindings.push(Binding::Tangent(i));
        tr.values.insert(key(t), id);
        tr.graph_storages.insert(storage_of(t));
        tr.hold(t);
    });
}

/// Runs `f` (host-side work such as filling a new tensor) without recording
/// the ops it calls.
pub fn untraced<R>(f: impl FnOnce() -> R) -> R {
    if !is_tracing() {
        return f();
    }
    with(|t| t.depth += 1);
    let r = f();
    with(|t| t.depth -= 1);
    r
}

/// Draws `spec`'s random numbers; while tracing, the result becomes a graph
/// input bound to [`Binding::Random`], drawn again on every compiled call
/// (in trace order, from the default generator, as the eager code would),
/// and the generator is put back after the trace so the first compiled call
/// draws what the traced run did.
pub fn random_input(spec: RandomSpec) -> Result<Tensor> {
    if !is_recording() {
        return spec.draw();
    }
    if super::regions::in_region() {
        unsupported(
            "checkpoint",
            "random numbers inside a checkpointed segment (its compiled recomputation would \
             draw other ones); compile runs this function eagerly, where the checkpoint replays them",
        )?;
    }
    with(|t| {
        if t.rng.is_none() {
            t.rng = Some(crate::random::get_rng_state());
        }
        t.depth += 1;
    });
    let r = spec.draw();
    with(|t| t.depth -= 1);
    let r = r?;
    with(|tr| {
        let id = tr
            .graph
            .input(format!("rand{}", tr.bindings.len()), r.meta());
        tr.bindings.push(Binding::Random(spec));
        tr.values.insert(key(&r), id);
        tr.graph_storages.insert(storage_of(&r));
        tr.hold(&r);
    });
    Ok(r)
}
