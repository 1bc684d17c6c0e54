//! The compiled backward of a function with several results that require
//! grad (logits and attention probabilities, both in the loss): the joint
//! graph has one tangent per result, and its backward must run once, with
//! all of them.
//!
//! Autograd nodes take one gradient each, so the results hang on small
//! forwarding nodes (`CompiledOutputBackward`) that put their gradient in a
//! shared slot and pass a 0-dim placeholder to one hub node
//! (`CompiledBackward`). The engine runs the hub after every forwarding
//! node that the backward reaches; it runs the compiled backward graph with
//! the slots' gradients, zeros for a result the loss did not use.

use crate::autograd;
use crate::{DType, Tensor};
use kiln_ir::shape::Dims;
use kiln_ir::Result;
use std::sync::{Arc, Mutex};

type Slots = Arc<Mutex<Vec<Option<Tensor>>>>;

/// Hangs the compiled backward `run` (tangents in `diff` order -> one
/// gradient per `wrt`) on the results `outs[diff[k]]`.
pub(crate) fn attach(
    outs: &mut [Tensor],
    diff: &[usize],
    wrt: &[&Tensor],
    run: impl Fn(&[Tensor]) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
) -> Result<()> {
    let slots: Slots = Arc::new(Mutex::new(vec![None; diff.len()]));
    let shapes: Vec<(Dims, DType, crate::Device)> = diff
        .iter()
        .map(|&d| (outs[d].dims_vec(), outs[d].dtype(), outs[d].device()))
        .collect();
    let hub_slots = slots.clone();
    let hub = autograd::record("compiled", Tensor::zeros(&[], DType::F32), wrt, move |_| {
        let got: Vec<Option<Tensor>> = {
            let mut s = hub_slots.lock().unwrap_or_else(|e| e.into_inner());
            s.iter_mut().map(Option::take).collect()
        };
        let tangents: Vec<Tensor> = got
            .into_iter()
            .zip(&shapes)
            .map(|(g, (dims, dtype, device))| match g {
                Some(g) => Ok(g),
                None => Tensor::zeros(dims, *dtype).to_device(*device),
            })
            .collect::<Result<_>>()?;
        run(&tangents)
    })?;
    for (k, &d) in diff.iter().enumerate() {
        let s = slots.clone();
        let out = outs[d].clone();
        outs[d] = autograd::record("compiled_output", out, &[&hub], move |g| {
            let mut s = s.lock().unwrap_or_else(|e| e.into_inner());
            s[k] = Some(match s[k].take() {
                Some(old) => old.add(g)?,
                None => g.clone(),
            });
            Ok(vec![Some(Tensor::zeros(&[], DType::F32))])
        })?;
    }
    Ok(())
}
