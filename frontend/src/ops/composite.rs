//! Composite ops for eager tensors: the decomposition table of
//! `kiln_passes::decompose`, run op by op through [`Eager`].

use crate::{Scalar, Tensor};
use kiln_ir::shape::Dims;
use kiln_ir::{BinaryOp, DType, ReduceKind, Result, UnaryOp};
use kiln_passes::decompose::{self, Builder};

/// Runs each primitive of a decomposition immediately as an eager kernel.
pub struct Eager;

fn scalar_for(t: &Tensor, s: f64) -> Scalar {
    // an integral value against an integer tensor stays integer (e.g. where(mask, idx, 0))
    if !t.dtype().is_float() && s.fract() == 0.0 {
        Scalar::Int(s as i64)
    } else {
        Scalar::Float(s)
    }
}

impl Builder for Eager {
    type T = Tensor;
    fn dims(&self, x: &Tensor) -> Dims {
        x.dims().into()
    }
    fn dtype(&self, x: &Tensor) -> DType {
        x.dtype()
    }
    fn unary(&mut self, op: UnaryOp, x: &Tensor) -> Result<Tensor> {
        x.unary(op)
    }
    fn binary(&mut self, op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        a.binary(op, b)
    }
    fn scalar(&mut self, op: BinaryOp, a: &Tensor, s: f64) -> Result<Tensor> {
        a.binary_scalar(op, scalar_for(a, s), false)
    }
    fn select(&mut self, c: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        Tensor::where_(c, a, b)
    }
    fn select_scalar(&mut self, c: &Tensor, a: &Tensor, s: f64) -> Result<Tensor> {
        Tensor::where_scalar(c, a, scalar_for(a, s))
    }
    fn reduce(&mut self, kind: ReduceKind, x: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        match kind {
            ReduceKind::Sum => x.sum(Some(dims), keepdim),
            ReduceKind::Prod => x.prod(Some(dims), keepdim),
            ReduceKind::Max => x.amax(Some(dims), keepdim),
            ReduceKind::Min => x.amin(Some(dims), keepdim),
            ReduceKind::ArgMax => x.argmax(dims.first().copied(), keepdim),
            ReduceKind::ArgMin => x.argmin(dims.first().copied(), keepdim),
        }
    }
    fn mean(&mut self, x: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        x.mean(Some(dims), keepdim)
    }
    fn reshape(&mut self, x: &Tensor, shape: &[i64]) -> Result<Tensor> {
        x.reshape(shape)
    }
    fn cast(&mut self, x: &Tensor, dt: DType) -> Result<Tensor> {
        x.to_dtype(dt)
    }
    fn gather(&mut self, x: &Tensor, dim: i64, index: &Tensor) -> Result<Tensor> {
        x.gather(dim, index)
    }
}

impl Tensor {
    /// `F.softmax(x, dim)`.
    pub fn softmax(&self, dim: i64) -> Result<Tensor> {
        kiln_ir::op::infer::require_float("softmax", &self.meta())?;
        decompose::softmax(&mut Eager, self, dim)
    }
    /// `F.log_softmax(x, dim)`.
    pub fn log_softmax(&self, dim: i64) -> Result<Tensor> {
        kiln_ir::op::infer::require_float("log_softmax", &self.meta())?;
        decompose::log_softmax(&mut Eager, self, dim)
    }
    /// `torch.logsumexp(x, dims, keepdim)`.
    pub fn logsumexp(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        kiln_ir::op::infer::require_float("logsumexp", &self.meta())?;
        decompose::logsumexp(&mut Eager, self, dims, keepdim)
    }
    /// `torch.var(x, dims, correction=..., keepdim)`; empty `dims` = all.
    pub fn var(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
        kiln_ir::op::infer::require_float("var", &self.meta())?;
        decompose::var(&mut Eager, self, dims, correction, keepdim)
    }
    pub fn std(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
        kiln_ir::op::infer::require_float("std", &self.meta())?;
        decompose::std(&mut Eager, self, dims, correction, keepdim)
    }
}
