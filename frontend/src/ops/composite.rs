//! Composite ops for eager tensors: the decomposition table of
//! `kiln_passes::decompose`, run through the fusing eager builder ([`Fuser`]).

use super::fuse::{Fuser, Lazy};
use crate::Tensor;
use kiln_ir::op::infer::require_float;
use kiln_ir::Result;
use kiln_passes::decompose;

/// Runs a decomposition on `x` and materialises the result.
pub(crate) fn run(x: &Tensor, f: impl FnOnce(&mut Fuser, &Lazy) -> Result<Lazy>) -> Result<Tensor> {
    f(&mut Fuser, &Lazy::tensor(x))?.materialize()
}

/// Optional tensor arguments as lazy values.
pub(crate) fn lazy(t: Option<&Tensor>) -> Option<Lazy> {
    t.map(Lazy::tensor)
}

impl Tensor {
    /// `F.softmax(x, dim)`: max, exp(x - max) stored once, its sum, the division.
    pub fn softmax(&self, dim: i64) -> Result<Tensor> {
        require_float("softmax", &self.meta())?;
        run(self, |b, x| decompose::softmax(b, x, dim))
    }
    /// `F.log_softmax(x, dim)`.
    pub fn log_softmax(&self, dim: i64) -> Result<Tensor> {
        require_float("log_softmax", &self.meta())?;
        run(self, |b, x| decompose::log_softmax(b, x, dim))
    }
    /// `torch.logsumexp(x, dims, keepdim)`.
    pub fn logsumexp(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        require_float("logsumexp", &self.meta())?;
        run(self, |b, x| decompose::logsumexp(b, x, dims, keepdim))
    }
    /// `torch.var(x, dims, correction=..., keepdim)`; empty `dims` = all.
    pub fn var(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
        require_float("var", &self.meta())?;
        run(self, |b, x| decompose::var(b, x, dims, correction, keepdim))
    }
    pub fn std(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
        require_float("std", &self.meta())?;
        run(self, |b, x| decompose::std(b, x, dims, correction, keepdim))
    }
}
