//! Backward rules, grouped by op family. Each `record_*` function takes the
//! forward's inputs and its result, and (when a gradient is needed) attaches
//! a node whose rule is written with Tensor ops, so a tracer can record the
//! backward graph from the same definition.

pub(crate) mod builder;
pub(crate) mod index;
pub(crate) mod nn;
pub(crate) mod norm;
pub(crate) mod pointwise;
mod pointwise_special;
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
    let z = Tensor::zeros_on(dims, g.dtype(), g.device())?;
    // an empty region (a zero-length narrow) adds nothing
    if g.numel() == 0 {
        return Ok(z);
    }
    if !crate::compile::trace::is_tracing() {
        crate::ops::pointwise::copy_into(g, &region(&z)?)?;
        return Ok(z);
    }
    // While tracing, an in-place write records no graph node: gather instead.
    // The region's layout (shapes only, no values) says which element of the
    // result each element of `g` lands on; the result reads `g` through that
    // inverse map and is zero elsewhere.
    let v = region(&z)?;
    let n: usize = dims.iter().product();
    let mut from = vec![-1i64; n];
    let (vd, vs) = (v.dims().to_vec(), v.strides().to_vec());
    let mut pos = vec![0usize; vd.len()];
    for i in 0..vd.iter().product::<usize>() {
        let p = v.offset() as isize
            + pos
                .iter()
                .zip(&vs)
                .map(|(&k, &s)| k as isize * s)
                .sum::<isize>();
        from[p as usize] = i as i64;
        for k in (0..pos.len()).rev() {
            pos[k] += 1;
            if pos[k] < vd[k] {
                break;
            }
            pos[k] = 0;
        }
    }
    let hit = Tensor::from_vec(from.clone(), &[n])?
        .binary_scalar(BinaryOp::Ge, 0, false)?
        .to_device(g.device())?;
    let idx = Tensor::from_vec(from.iter().map(|&i| i.max(0)).collect::<Vec<_>>(), &[n])?
        .to_device(g.device())?;
    let picked = g.reshape(&[-1])?.index_select(0, &idx)?;
    keep(&hit, &picked)?.reshape_dims(dims)
}
