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

/// Where a narrow/slice/select view sits in its input: along `dim`,
/// elements `start, start + step, ...` (as many as the view has); `keep_dim`
/// is false for select, whose view drops `dim`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Range {
    pub dim: usize,
    pub start: usize,
    pub step: usize,
    pub keep_dim: bool,
}

/// Zeros of `dt` and `dims` (a 0-dim zero expanded: one element to read).
fn zeros(dims: &[usize], dt: kiln_ir::DType) -> Result<Tensor> {
    let d: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    Tensor::zeros(&[], dt).expand(&d)
}

/// `g` laid into zeros of `dims` at `r` (the backward of narrow/slice/select:
/// PyTorch's slice_scatter). Built from cat and reshape rather than by
/// writing into a zero tensor in place: a traced backward (compiled
/// training) refuses in-place writes to traced values, so this keeps it in
/// the graph.
pub(crate) fn embed(g: &Tensor, dims: &[usize], r: Range) -> Result<Tensor> {
    let (d, dt) = (r.dim, g.dtype());
    let mut g = if r.keep_dim {
        g.clone()
    } else {
        g.unsqueeze(d as i64)?
    };
    let n = g.dims()[d];
    if r.step > 1 && n > 0 {
        // interleave step-1 zeros after each element, then drop the tail
        let gu = g.unsqueeze(d as i64 + 1)?;
        let mut zd = gu.dims_vec();
        zd[d + 1] = r.step - 1;
        let c = Tensor::cat(&[&gu, &zeros(&zd, dt)?], d as i64 + 1)?;
        let mut nd = g.dims_vec();
        nd[d] = n * r.step;
        let len = (n * r.step).min(dims[d] - r.start);
        g = c
            .contiguous()?
            .reshape_dims(&nd)?
            .narrow(d as i64, 0, len)?;
    }
    let after = dims[d] - r.start - g.dims()[d];
    let mut parts = vec![];
    let mut zd = g.dims_vec();
    if r.start > 0 {
        zd[d] = r.start;
        parts.push(zeros(&zd, dt)?);
    }
    parts.push(g.clone());
    if after > 0 {
        zd[d] = after;
        parts.push(zeros(&zd, dt)?);
    }
    if parts.len() == 1 {
        return g.contiguous();
    }
    let refs: Vec<&Tensor> = parts.iter().collect();
    Tensor::cat(&refs, d as i64)
}
