//! Compiled training (AOTAutograd's idea): when autograd would record a
//! call, the trace runs the forward *and* the existing backward rules (they
//! are Tensor ops, so they record too) into one joint graph; the partitioner
//! splits it into a forward graph, which returns what the backward needs, and
//! a backward graph. The compiled forward's output carries a backward node
//! (`CompiledBackward`) that runs the compiled backward graph, so
//! `loss.backward(); opt.step()` work unchanged and gradients land in `.grad`.
//!
//! Inputs that require grad become fresh leaves for the trace, so the traced
//! backward stops at them; the outer graph (an eager part of the model before
//! the compiled one) is reached through the node's edges, as for any op.

use super::exec::{Executable, HoistCache};
use super::trace::{self, Binding, GraphBreak, Trace};
use crate::autograd::{self, AutogradMeta, Saved};
use crate::Tensor;
use kiln_ir::Result;
use kiln_passes::partition::{BackwardInput, Partition};
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

/// A traced joint graph. Its outputs: the function's results, the new values
/// of buffers it updates in place, then one gradient per `grad_of` entry.
pub(crate) struct Joint {
    pub trace: Trace,
    pub n_outs: usize,
    /// The results that require grad, in order: the `k`-th is the one
    /// `tangent{k}` is the gradient of (the backward hangs on them).
    pub diff_outs: Vec<usize>,
    /// Per gradient output: the graph input it is the gradient of.
    pub grad_of: Vec<usize>,
}

impl Joint {
    pub fn n_forward_outputs(&self) -> usize {
        self.n_outs + self.trace.mutations.len()
    }
}

/// Traces `f(args)` and its backward into one graph.
pub(crate) fn trace_joint(
    name: &str,
    args: &[Tensor],
    names: &[(String, Tensor)],
    f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<std::result::Result<(Joint, Vec<Tensor>), GraphBreak>> {
    let leaves: Vec<Tensor> = args
        .iter()
        .map(|a| match a.requires_grad() {
            true => a.detach().requires_grad_(true),
            false => a.clone(),
        })
        .collect();
    type Seen = (usize, Vec<usize>, Vec<Arc<AutogradMeta>>);
    let seen: RefCell<Option<Seen>> = RefCell::new(None);
    let traced = {
        let _g = autograd::set_grad_enabled(true);
        trace::trace(name, &leaves, names, |xs| {
            let mut outs = f(xs)?;
            // one tangent per result that requires grad (logits and
            // attention probabilities both reach the loss)
            let diff: Vec<usize> = (0..outs.len())
                .filter(|&i| outs[i].requires_grad())
                .collect();
            let roots: Vec<&Tensor> = diff.iter().map(|&d| &outs[d]).collect();
            let seeds: Vec<Tensor> = roots
                .iter()
                .map(|o| Tensor::ones(o.dims(), o.dtype()))
                .collect();
            for (k, seed) in seeds.iter().enumerate() {
                trace::tangent_input(seed, k);
            }
            let grads = match roots.is_empty() {
                true => vec![],
                false => autograd::leaf_grads(&roots, &seeds.iter().collect::<Vec<_>>())?,
            };
            trace::release_traced_graph();
            let n = outs.len();
            let metas = grads.iter().map(|(m, _)| m.clone()).collect();
            outs.extend(grads.into_iter().map(|(_, g)| g));
            *seen.borrow_mut() = Some((n, diff, metas));
            Ok(outs)
        })?
    };
    let (mut tr, mut outs) = match traced {
        Ok(x) => x,
        Err(b) => return Ok(Err(b)),
    };
    let (n_outs, diff_outs, metas) = seen.into_inner().expect("traced");
    // which graph input each gradient belongs to
    let meta_of = |b: &Binding| match b {
        Binding::Arg(i) => leaves[*i].autograd.clone(),
        Binding::Captured(t) => t.autograd.clone(),
        Binding::Tangent(_) | Binding::Random(_) => None,
    };
    let mut grad_of = vec![];
    for m in &metas {
        let k = tr
            .bindings
            .iter()
            .position(|b| meta_of(b).is_some_and(|x| Arc::ptr_eq(&x, m)));
        match k {
            Some(k) => grad_of.push(k),
            None => {
                tr.undo_side_effects()?;
                return Ok(Err(GraphBreak {
                    op: "backward".into(),
                    reason:
                        "a gradient reaches a tensor the traced graph does not read as an input \
                             (a parameter used only through an untraced view)"
                            .into(),
                }));
            }
        }
    }
    // outputs: results, buffer updates, gradients (the partitioner's order)
    let o = tr.graph.outputs().to_vec();
    let (res, grads) = o.split_at(n_outs);
    let mut order = res.to_vec();
    order.extend(tr.mutations.iter().map(|(_, v)| *v));
    order.extend_from_slice(grads);
    tr.graph.set_outputs_unchecked(order);
    outs.truncate(n_outs);
    Ok(Ok((
        Joint {
            trace: tr,
            n_outs,
            diff_outs,
            grad_of,
        },
        outs,
    )))
}

/// The compiled halves of a joint graph and how to feed them.
pub(crate) struct TrainPlan {
    pub partition: Partition,
    backward: Arc<Executable>,
    /// The backward's values computed only from constants (the backward has
    /// no captured inputs), kept between calls: with a fresh cache every
    /// call, a backward with such values never replayed its launch list and
    /// recomputed them each time.
    backward_cache: Arc<Mutex<HoistCache>>,
    n_outs: usize,
    diff_outs: Vec<usize>,
    /// Per joint-graph input: the differentiable result it is the tangent of.
    tangent_of: Vec<Option<usize>>,
    grad_of: Vec<usize>,
    /// Positions of the graph inputs the forward writes back (BatchNorm's running stats).
    mutated: Vec<usize>,
}

impl TrainPlan {
    /// The plan and the forward's executable.
    pub fn new(joint: &Joint, partition: Partition) -> (TrainPlan, Executable) {
        let captured: Vec<bool> = partition
            .forward_inputs
            .iter()
            .map(|&k| matches!(joint.trace.bindings[k], Binding::Captured(_)))
            .collect();
        let forward = Executable::new(partition.forward.clone(), &captured);
        let backward = Arc::new(Executable::new(partition.backward.clone(), &[]));
        let plan = TrainPlan {
            backward,
            backward_cache: Arc::default(),
            n_outs: joint.n_outs,
            diff_outs: joint.diff_outs.clone(),
            tangent_of: joint
                .trace
                .bindings
                .iter()
                .map(|b| match b {
                    Binding::Tangent(k) => Some(*k),
                    _ => None,
                })
                .collect(),
            grad_of: joint.grad_of.clone(),
            mutated: joint
                .trace
                .mutations
                .iter()
                .map(|(i, _)| {
                    let inputs = joint.trace.graph.inputs();
                    inputs
                        .iter()
                        .position(|x| x == i)
                        .expect("mutations write inputs")
                })
                .collect(),
            partition,
        };
        (plan, forward)
    }

    pub fn backward_exec(&self) -> &Executable {
        &self.backward
    }

    /// Runs the compiled forward on `inputs` (one per joint-graph input,
    /// `None` for the tangent) and hangs the compiled backward on the result
    /// that requires grad.
    pub fn run(
        &self,
        forward: &Executable,
        inputs: &[Option<Tensor>],
        versions: &[u64],
        hoist: &mut HoistCache,
        contiguous: &[bool],
    ) -> Result<Vec<Tensor>> {
        let fwd_ins: Vec<Tensor> = self
            .partition
            .forward_inputs
            .iter()
            .map(|&k| inputs[k].clone().expect("forward inputs are primal"))
            .collect();
        let mut res = {
            let _ng = autograd::no_grad();
            forward.run(&fwd_ins, versions, hoist)?
        };
        let saved = res.split_off(self.n_outs + self.mutated.len());
        let updates = res.split_off(self.n_outs);
        let mut outs = res;
        {
            let _ng = autograd::no_grad();
            for (&k, value) in self.mutated.iter().zip(&updates) {
                if let Some(t) = &inputs[k] {
                    t.copy_(value)?;
                }
            }
        }
        for (o, want) in outs.iter_mut().zip(contiguous) {
            if *want && !o.is_contiguous() {
                *o = o.contiguous()?;
            }
        }
        let bwd_ins: Vec<BackwardValue> = self
            .partition
            .backward_inputs
            .iter()
            .map(|b| match b {
                BackwardInput::Saved(k) => BackwardValue::Saved(Saved::new("compiled", &saved[*k])),
                BackwardInput::Primal(i) => match &inputs[*i] {
                    Some(t) => BackwardValue::Saved(Saved::new("compiled", t)),
                    None => BackwardValue::Tangent(0),
                },
                BackwardInput::Tangent(i) => {
                    BackwardValue::Tangent(self.tangent_of[*i].expect("a tangent input"))
                }
            })
            .collect();
        let wrt: Vec<&Tensor> = self
            .grad_of
            .iter()
            .map(|&k| inputs[k].as_ref().expect("gradients are of primal inputs"))
            .collect();
        let backward = self.backward.clone();
        let cache = self.backward_cache.clone();
        let run_backward = move |tangents: &[Tensor]| -> Result<Vec<Option<Tensor>>> {
            let ins: Vec<Tensor> = bwd_ins
                .iter()
                .map(|s| match s {
                    BackwardValue::Saved(s) => s.get(),
                    BackwardValue::Tangent(k) => Ok(tangents[*k].clone()),
                })
                .collect::<Result<_>>()?;
            // a backward running on another thread holds the cache: this
            // one computes its constant values afresh rather than wait
            let grads = match cache.try_lock() {
                Ok(mut c) => backward.run(&ins, &[], &mut c)?,
                Err(_) => backward.run(&ins, &[], &mut HoistCache::default())?,
            };
            Ok(grads.into_iter().map(Some).collect())
        };
        match self.diff_outs.as_slice() {
            [] => {}
            [d] => {
                let out = outs[*d].clone();
                outs[*d] = autograd::record("compiled", out, &wrt, move |g| {
                    run_backward(std::slice::from_ref(g))
                })?;
            }
            _ => super::multi_backward::attach(&mut outs, &self.diff_outs, &wrt, run_backward)?,
        }
        Ok(outs)
    }
}

/// What one input of the compiled backward is bound to when it runs.
enum BackwardValue {
    Saved(Saved),
    /// The gradient of the `k`-th differentiable result.
    Tangent(usize),
}
