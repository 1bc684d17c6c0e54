//! The non-fusing decomposition builder: runs a composite (`layer_norm`,
//! losses, ...) as recorded primitive Tensor ops, so its gradient comes from
//! the primitives' rules. Used instead of the fusing `Fuser` when a gradient is needed.

use crate::ops::fuse::scalar_for;
use crate::Tensor;
use kiln_ir::shape::Dims;
use kiln_ir::{BinaryOp, DType, ReduceKind, Result, UnaryOp};
use kiln_passes::decompose::Builder;

pub struct TensorBuilder;

impl Builder for TensorBuilder {
    type T = Tensor;
    fn dims(&self, x: &Tensor) -> Dims {
        x.dims_vec()
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
        a.binary_scalar(op, scalar_for(a.dtype(), s), false)
    }
    fn select(&mut self, c: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        Tensor::where_(c, a, b)
    }
    fn select_scalar(&mut self, c: &Tensor, a: &Tensor, s: f64) -> Result<Tensor> {
        Tensor::where_scalar(c, a, scalar_for(a.dtype(), s))
    }
    fn reduce(
        &mut self,
        kind: ReduceKind,
        x: &Tensor,
        dims: &[i64],
        keepdim: bool,
    ) -> Result<Tensor> {
        match kind {
            ReduceKind::Sum => x.sum(Some(dims), keepdim),
            ReduceKind::Prod => x.prod(Some(dims), keepdim),
            ReduceKind::Max => x.amax(Some(dims), keepdim),
            ReduceKind::Min => x.amin(Some(dims), keepdim),
            ReduceKind::ArgMax => x.argmax(Some(dims[0]), keepdim),
            ReduceKind::ArgMin => x.argmin(Some(dims[0]), keepdim),
            ReduceKind::LogSumExp | ReduceKind::Welford => {
                x.simple_reduce(kind, Some(dims), keepdim)
            }
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
