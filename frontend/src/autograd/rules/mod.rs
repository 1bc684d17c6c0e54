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
    // While tracing, an in-place write records no graph node. A narrow is
    // a cat with zero blocks: the copies a cat costs, where a gather would
    // build and read an index as large as the result.
    let v = region(&z)?;
    if let (Some((d, before)), true) = (narrow_of(&z, &v), g.dims() == v.dims()) {
        let after = dims[d] - before - v.dims()[d];
        let block = |n: usize| {
            let mut bd = dims.to_vec();
            bd[d] = n;
            Tensor::zeros_on(&bd, g.dtype(), g.device())
        };
        let mut parts = vec![];
        if before > 0 {
            parts.push(block(before)?);
        }
        parts.push(g.clone());
        if after > 0 {
            parts.push(block(after)?);
        }
        return match parts.len() {
            1 => Ok(g.clone()),
            _ => Tensor::cat(&parts.iter().collect::<Vec<_>>(), d as i64),
        };
    }
    // Any other region: gather. The region's layout (shapes only, no values) says which element of the
    // result each element of `g` lands on; the result reads `g` through that
    // inverse map and is zero elsewhere.
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

/// `(dim, start)` when the view `v` of the contiguous `z` is `z.narrow(dim,
/// start, len)`: same rank and strides, one dim shortened (or none: the
/// whole of `z`, start 0).
fn narrow_of(z: &Tensor, v: &Tensor) -> Option<(usize, usize)> {
    if v.rank() != z.rank() || v.strides() != z.strides() || !z.is_contiguous() {
        return None;
    }
    let short: Vec<usize> = (0..z.rank())
        .filter(|&k| v.dims()[k] != z.dims()[k])
        .collect();
    let off = v.offset().checked_sub(z.offset())?;
    match short.as_slice() {
        [] => (off == 0).then_some((0, 0)),
        [d] => {
            let stride = z.strides()[*d] as usize;
            (stride > 0 && off % stride == 0).then_some((*d, off / stride))
        }
        _ => None,
    }
}
