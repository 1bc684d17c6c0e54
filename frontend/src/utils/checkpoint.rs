//! Activation (gradient) checkpointing, `torch.utils.checkpoint`: a segment
//! of the forward keeps only its inputs; backward runs the segment again to
//! get the activations its gradients need, trading one more forward for the
//! memory of everything inside.
//!
//! How it works: the forward runs the segment and records one backward node
//! (`CheckpointBackward`) on a detached copy of its output, with an edge per
//! input and per parameter the segment uses; the segment's own graph (and
//! every activation it saved) is dropped on return. The node's backward
//! restores the random-number state of the forward (so dropout draws the
//! same mask), re-runs the segment on fresh leaves with grad on, and takes
//! the gradients of inputs and parameters from that small graph
//! (`autograd::leaf_grads`), handing them on through its edges — into
//! `.grad`, or into the compiler's trace when this runs inside `compile()`.
//! There both runs of the segment are tagged as a checkpoint region
//! (`compile::trace::checkpoint_region`), so the compiled backward saves
//! only the segment's inputs and output and rebuilds the rest.
//!
//! ```
//! use kiln_frontend::nn::{Activation, Linear, Module, ModuleExt, Sequential};
//! use kiln_frontend::utils::Checkpointed;
//! use kiln_frontend::{DType, Tensor};
//! let inner = Sequential::new().add(Linear::new(4, 4, true).unwrap()).add(Activation::relu());
//! let m = Checkpointed::new(inner);
//! let x = Tensor::ones(&[2, 4], DType::F32);
//! m.forward(&x).unwrap().sum(None, false).unwrap().backward().unwrap();
//! assert!(m.parameters().iter().all(|p| p.grad().is_some()));
//! ```

use crate::autograd::{self, LeafRef, Saved};
use crate::compile::trace;
use crate::nn::{Entry, EntryMut, Module, ModuleExt};
use crate::random;
use crate::Tensor;
use kiln_ir::{bail, Result};
use std::sync::Arc;

type Segment = dyn Fn(&[Tensor]) -> Result<Tensor> + Send + Sync;

/// `torch.utils.checkpoint.checkpoint(f, *inputs)`: `f(inputs)` whose inner
/// activations are recomputed in backward instead of kept.
///
/// The parameters `f` uses are found by following the graph of one forward
/// run (so `f` may close over any tensors); that run's graph is dropped
/// before this returns. `f` must be a pure function of its inputs, its
/// parameters and the default generator (its state is restored for the
/// recomputation).
///
/// ```
/// use kiln_frontend::utils::checkpoint;
/// use kiln_frontend::{DType, Tensor};
/// let w = Tensor::ones(&[3], DType::F32).requires_grad_(true);
/// let x = Tensor::ones(&[3], DType::F32).requires_grad_(true);
/// let wc = w.clone();
/// let y = checkpoint(move |xs| xs[0].mul(&wc)?.exp(), &[x.clone()]).unwrap();
/// y.sum(None, false).unwrap().backward().unwrap();
/// assert!((w.grad().unwrap().to_f64_vec()[0] - std::f64::consts::E).abs() < 1e-5);
/// assert!(x.grad().is_some());
/// ```
pub fn checkpoint(
    f: impl Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
    inputs: &[Tensor],
) -> Result<Tensor> {
    run(Arc::new(f), inputs, None)
}

/// The segment's forward and its backward node. `params`: the leaves the
/// segment uses, when the caller knows them (a module's parameters); then
/// the forward runs under `no_grad`, saving nothing at all.
fn run(f: Arc<Segment>, inputs: &[Tensor], params: Option<Vec<Tensor>>) -> Result<Tensor> {
    let rng = random::get_rng_state();
    let fresh = |xs: &[Tensor]| -> Vec<Tensor> {
        xs.iter()
            .map(|x| x.detach().requires_grad_(x.requires_grad()))
            .collect()
    };
    if !autograd::is_grad_enabled() {
        return f(inputs);
    }
    // under compile(), what the segment records is tagged as a region: the
    // compiled backward rebuilds it from the region's inputs and output
    let (out, leaves) = match params {
        Some(ps) => {
            let out = trace::checkpoint_region(|| {
                let _g = autograd::no_grad();
                f(inputs)
            })?;
            (out, ps.iter().filter_map(LeafRef::of).collect::<Vec<_>>())
        }
        None => {
            let xs = fresh(inputs);
            let out = trace::checkpoint_region(|| f(&xs))?;
            let mine: Vec<_> = xs.iter().filter_map(|x| x.autograd.clone()).collect();
            let leaves = autograd::reachable_leaves(&out, &mine);
            (out.detach(), leaves)
        }
    };
    let mut boundary: Vec<&Tensor> = inputs.iter().collect();
    boundary.push(&out);
    trace::checkpoint_boundary(&boundary);
    let needs = inputs.iter().any(Tensor::requires_grad) || !leaves.is_empty();
    if !needs {
        return Ok(out);
    }
    let saved: Vec<Saved> = inputs.iter().map(|x| Saved::new("checkpoint", x)).collect();
    let wanted: Vec<bool> = inputs.iter().map(Tensor::requires_grad).collect();
    let metas: Vec<_> = leaves.iter().map(|l| l.meta.clone()).collect();
    let refs: Vec<&Tensor> = inputs.iter().collect();
    autograd::record_with_leaves("checkpoint", out, &refs, &leaves, move |g| {
        trace::checkpoint_region(|| recompute(&*f, &rng, &saved, &wanted, &metas, g))
    })
}

/// `CheckpointBackward`: the segment run again on its saved inputs, with
/// the forward's random numbers, and the gradients of its inputs and
/// parameters (`metas`) from that small graph.
fn recompute(
    f: &Segment,
    rng: &random::GeneratorState,
    saved: &[Saved],
    wanted: &[bool],
    metas: &[Arc<autograd::AutogradMeta>],
    g: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    let xs: Vec<Tensor> = saved
        .iter()
        .zip(wanted)
        .map(|(s, &w)| Ok(s.get()?.requires_grad_(w)))
        .collect::<Result<_>>()?;
    // Recompute with the forward's random numbers, then put the
    // generator back where the rest of the backward expects it.
    let now = random::get_rng_state();
    random::set_rng_state(rng);
    let out = {
        let _g = autograd::set_grad_enabled(true);
        f(&xs)
    };
    random::set_rng_state(&now);
    let out = out?;
    if !out.requires_grad() {
        bail!(
            "CheckpointBackward",
            "the recomputed segment does not require grad (shape {:?}); it must use its inputs or parameters",
            out.dims()
        );
    }
    let grads = autograd::leaf_grads(&[&out], &[g])?;
    let find = |m: &Arc<autograd::AutogradMeta>| {
        grads
            .iter()
            .find(|(k, _)| Arc::ptr_eq(k, m))
            .map(|(_, g)| g.clone())
    };
    let mut res: Vec<Option<Tensor>> = xs
        .iter()
        .map(|x| {
            x.autograd
                .as_ref()
                .filter(|_| x.requires_grad())
                .and_then(find)
        })
        .collect();
    res.extend(metas.iter().map(find));
    Ok(res)
}

/// `Checkpointed(module)`: the module's forward through [`checkpoint`], its
/// parameters and buffers its own (the `state_dict` keys are the inner
/// module's, so a checkpointed model loads the plain model's weights).
///
/// The forward runs under `no_grad` (the parameters are known), so nothing
/// inside is kept; backward recomputes it once.
pub struct Checkpointed<M: Module + 'static> {
    inner: Arc<M>,
}

impl<M: Module + 'static> Checkpointed<M> {
    pub fn new(inner: M) -> Self {
        Checkpointed {
            inner: Arc::new(inner),
        }
    }

    /// The wrapped module.
    pub fn inner(&self) -> &M {
        &self.inner
    }
}

impl<M: Module + 'static> Module for Checkpointed<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let m = self.inner.clone();
        let params = self.inner.parameters();
        run(
            Arc::new(move |xs: &[Tensor]| m.forward(&xs[0])),
            std::slice::from_ref(x),
            Some(params),
        )
    }

    fn visit<'a>(&'a self, f: &mut dyn FnMut(Entry<'a>)) {
        self.inner.visit(f)
    }

    fn visit_mut(&mut self, f: &mut dyn FnMut(EntryMut<'_>)) {
        if let Some(m) = Arc::get_mut(&mut self.inner) {
            m.visit_mut(f)
        }
    }

    fn set_own_training(&self, on: bool) {
        self.inner.set_own_training(on)
    }

    fn is_training(&self) -> bool {
        self.inner.is_training()
    }

    fn describe(&self) -> String {
        format!("Checkpointed({})", self.inner.describe())
    }
}
