//! Composite ops for eager tensors: the decomposition table of
//! `kiln_passes::decompose`, run through the fusing eager builder ([`Fuser`])
//! — or, when a gradient is needed, as recorded primitive Tensor ops
//! (`TensorBuilder`) so their backward comes from the primitives' rules.
//! softmax and log_softmax have dedicated backward rules instead.

use super::fuse::{Fuser, Lazy};
use crate::compile::trace;
use crate::Tensor;
use kiln_ir::op::infer::require_float;
use kiln_ir::op::Op;
use kiln_ir::{Float, Result};
use kiln_passes::decompose;
use kiln_runtime::profiler::{self, Category};

/// `decomposed!(inputs, |b, cv| body)`: runs `body` (a decomposition returning
/// `Result<B::T>`) with the fusing builder when no input needs a gradient,
/// else with the recording `TensorBuilder`; `cv(&Tensor)` makes a builder value.
macro_rules! decomposed {
    ($inputs:expr, |$b:ident, $cv:ident| $body:expr) => {{
        if $crate::autograd::needs_grad($inputs) {
            let _inline = $crate::compile::trace::inline_decomposition();
            let $b = &mut $crate::autograd::rules::builder::TensorBuilder;
            let $cv = |t: &$crate::Tensor| t.clone();
            $body
        } else {
            let $b = &mut $crate::ops::fuse::Fuser;
            let $cv = |t: &$crate::Tensor| $crate::ops::fuse::Lazy::tensor(t);
            ($body).and_then(|l| l.materialize())
        }
    }};
}
pub(crate) use decomposed;

/// `fused_or_recorded!(inputs, |b, cv| body)`: as [`decomposed!`] for a
/// composite without a graph node of its own (scans, sorts): while tracing
/// it also runs as recorded primitive ops, which the trace records one by
/// one and `compile` fuses back together; eagerly without a gradient it
/// runs through the fusing builder.
macro_rules! fused_or_recorded {
    ($inputs:expr, |$b:ident, $cv:ident| $body:expr) => {{
        if $crate::autograd::needs_grad($inputs) || $crate::compile::trace::is_tracing() {
            let $b = &mut $crate::autograd::rules::builder::TensorBuilder;
            let $cv = |t: &$crate::Tensor| t.clone();
            $body
        } else {
            let $b = &mut $crate::ops::fuse::Fuser;
            let $cv = |t: &$crate::Tensor| $crate::ops::fuse::Lazy::tensor(t);
            ($body).and_then(|l| l.materialize())
        }
    }};
}
pub(crate) use fused_or_recorded;

/// Runs a decomposition on `x` and materialises the result (no autograd).
pub(crate) fn run(x: &Tensor, f: impl FnOnce(&mut Fuser, &Lazy) -> Result<Lazy>) -> Result<Tensor> {
    f(&mut Fuser, &Lazy::tensor(x))?.materialize()
}

impl Tensor {
    /// An op-level profiler scope with this tensor's shape (free when not profiling).
    fn op_scope(&self, name: &'static str) -> profiler::Scope {
        profiler::scope(name, Category::Op).shapes(|| vec![self.dims().to_vec()])
    }
    /// `F.softmax(x, dim)`: one online log-sum-exp pass, then exp(x - lse).
    pub fn softmax(&self, dim: i64) -> Result<Tensor> {
        if let Some((x,)) = crate::amp::cast_for(crate::amp::Policy::F32, (self,))? {
            return x.softmax(dim);
        }
        trace::record(
            || Op::Softmax { dim },
            &[self],
            || {
                let _p = self.op_scope("softmax");
                require_float("softmax", &self.meta())?;
                let y = run(&self.detach(), |b, x| decompose::softmax(b, x, dim))?;
                crate::autograd::rules::reduce::softmax(self, dim, false, y)
            },
        )
    }
    /// `F.log_softmax(x, dim)`.
    pub fn log_softmax(&self, dim: i64) -> Result<Tensor> {
        if let Some((x,)) = crate::amp::cast_for(crate::amp::Policy::F32, (self,))? {
            return x.log_softmax(dim);
        }
        trace::record(
            || Op::LogSoftmax { dim },
            &[self],
            || {
                let _p = self.op_scope("log_softmax");
                require_float("log_softmax", &self.meta())?;
                let y = run(&self.detach(), |b, x| decompose::log_softmax(b, x, dim))?;
                crate::autograd::rules::reduce::softmax(self, dim, true, y)
            },
        )
    }
    /// `torch.logsumexp(x, dims, keepdim)`.
    pub fn logsumexp(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        let node = || Op::LogSumExp {
            dims: dims.to_vec(),
            keepdim,
        };
        trace::record(node, &[self], || {
            let _p = self.op_scope("logsumexp");
            require_float("logsumexp", &self.meta())?;
            decomposed!(&[self], |b, cv| decompose::logsumexp(
                b,
                &cv(self),
                dims,
                keepdim
            ))
        })
    }
    /// `torch.var(x, dims, correction=..., keepdim)`; empty `dims` = all.
    pub fn var(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
        let node = || Op::Var {
            dims: dims.to_vec(),
            correction: Float(correction),
            keepdim,
        };
        trace::record(node, &[self], || {
            let _p = self.op_scope("var");
            require_float("var", &self.meta())?;
            decomposed!(&[self], |b, cv| decompose::var(
                b,
                &cv(self),
                dims,
                correction,
                keepdim
            ))
        })
    }
    pub fn std(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
        let node = || Op::Std {
            dims: dims.to_vec(),
            correction: Float(correction),
            keepdim,
        };
        trace::record(node, &[self], || {
            let _p = self.op_scope("std");
            require_float("std", &self.meta())?;
            decomposed!(&[self], |b, cv| decompose::std(
                b,
                &cv(self),
                dims,
                correction,
                keepdim
            ))
        })
    }
}
