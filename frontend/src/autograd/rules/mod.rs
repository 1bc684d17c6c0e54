//! Backward rules, grouped by op family. Each `record_*` function takes the
//! forward's inputs and its result, and (when a gradient is needed) attaches
//! a node whose rule is written with Tensor ops, so a tracer can record the
//! backward graph from the same definition.

pub(crate) mod builder;
pub(crate) mod index;
pub(crate) mod nn;
pub(crate) mod pointwise;
pub(crate) mod reduce;
pub(crate) mod view;

use crate::Tensor;
use kiln_ir::{BinaryOp, Result};

/// `t * s` for a Python number `s`.
pub(crate) fn mul_s(t: &Tensor, s: f64) -> Result<Tensor> {
    t.binary_scalar(BinaryOp::Mul, s, false)
}

/// `s - t`.
pub(crate) fn rsub_s(t: &Tensor, s: f64) -> Result<Tensor> {
    t.binary_scalar(BinaryOp::Sub, s, true)
}

/// `t + s`.
pub(crate) fn add_s(t: &Tensor, s: f64) -> Result<Tensor> {
    t.binary_scalar(BinaryOp::Add, s, false)
}

/// `where(cond, g, 0)`.
pub(crate) fn keep(cond: &Tensor, g: &Tensor) -> Result<Tensor> {
    Tensor::where_scalar(cond, g, 0.0)
}

/// `g` written into a zero tensor of `dims` through the view `region` of it
/// (the backward of narrow/slice/select: PyTorch's slice_scatter).
pub(crate) fn embed(
    g: &Tensor,
    dims: &[usize],
    region: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let z = Tensor::zeros(dims, g.dtype());
    crate::ops::pointwise::copy_into(g, &region(&z)?)?;
    Ok(z)
}
