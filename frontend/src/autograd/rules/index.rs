//! Backward rules of the indexing ops: gather, index_select and embedding
//! scatter-add their gradient back. Scatter-add is one graph op
//! (`scatter_add`), run by a loop here (one pass over `src`), or on a CUDA
//! device by a generated reduction; while tracing,
//! one index per row becomes a one-hot select that fuses.

use crate::autograd::{needs_grad, record, Saved};
use crate::Tensor;
use kiln_ir::{BinaryOp, DType, Result};

/// `zeros(dims).scatter_add(dim, index, src)`: `index` (i64) has `src`'s shape.
pub(crate) fn scatter_add(
    dims: &[usize],
    dim: usize,
    index: &Tensor,
    src: &Tensor,
) -> Result<Tensor> {
    let sd = src.dims();
    let one_per_row = sd.len() == dims.len()
        && sd[dim] == 1
        && (0..dims.len()).all(|k| k == dim || sd[k] == dims[k]);
    if one_per_row && crate::compile::trace::is_tracing() {
        // one index per row (the gather of cross_entropy / nll_loss): a
        // one-hot select in pointwise Tensor ops, which fuse with their
        // neighbours in a compiled backward; the result's size, no more
        return one_hot_scatter(dims, dim, index, src);
    }
    let op = || kiln_ir::op::Op::ScatterAdd {
        dim: dim as i64,
        size: dims.to_vec(),
    };
    crate::compile::trace::record(op, &[index, src], || {
        scatter_add_loop(dims, dim, index, src)
    })
}

/// [`scatter_add`]'s loop (one generated reduction on a CUDA device).
fn scatter_add_loop(dims: &[usize], dim: usize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
    if src.device().is_cuda() {
        let index = index.to_device(src.device())?.to_dtype(DType::I64)?;
        return crate::ops::gather_kernel::scatter_add_kernel(dims, dim, &index, &src.detach());
    }
    let sd = src.dims();
    let v = src.to_f64_vec();
    let idx = index
        .expand_to(src.dims())?
        .to_dtype(DType::I64)?
        .contiguous()?
        .to_vec::<i64>()?;
    let mut out = vec![0.0f64; dims.iter().product()];
    let mut ostr = vec![1usize; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        ostr[k] = ostr[k + 1] * dims[k + 1];
    }
    let mut pos = vec![0usize; sd.len()];
    for (lin, (&x, &i)) in v.iter().zip(&idx).enumerate() {
        let _ = lin;
        let n = dims[dim] as i64;
        let i = if i < 0 { i + n } else { i } as usize;
        let mut o = 0;
        for k in 0..sd.len() {
            o += if k == dim { i } else { pos[k] } * ostr[k];
        }
        out[o] += x;
        for k in (0..pos.len()).rev() {
            pos[k] += 1;
            if pos[k] < sd[k] {
                break;
            }
            pos[k] = 0;
        }
    }
    Tensor::from_vec(out, dims)?
        .to_dtype(src.dtype())?
        .to_device(src.device())
}

/// [`scatter_add`] when `src` (and `index`) have extent 1 along `dim` and
/// `dims` elsewhere: `where(index == arange(dims[dim]), src, 0)`.
fn one_hot_scatter(dims: &[usize], dim: usize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
    let n = dims[dim] as i64;
    let idx = index.expand_to(src.dims())?.to_dtype(DType::I64)?;
    let neg = idx.binary_scalar(BinaryOp::Lt, 0, false)?;
    let idx = Tensor::where_(&neg, &idx.binary_scalar(BinaryOp::Add, n, false)?, &idx)?;
    let mut shape = vec![1usize; dims.len()];
    shape[dim] = dims[dim];
    let classes =
        Tensor::from_vec((0..n).collect::<Vec<i64>>(), &shape)?.to_device(idx.device())?;
    let hit = idx.binary(BinaryOp::Eq, &classes)?;
    let xs: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    super::keep(&hit, &src.expand(&xs)?)
}

/// Records `gather(x, dim, index)`.
pub(crate) fn gather(x: &Tensor, dim: usize, index: &Tensor, y: Tensor) -> Result<Tensor> {
    if !needs_grad(&[x]) {
        return Ok(y);
    }
    let xd = x.dims_vec();
    let si = Saved::new("gather", index);
    record("gather", y, &[x], move |g| {
        Ok(vec![Some(scatter_add(&xd, dim, &si.get()?, g)?)])
    })
}

/// Records `index_select(x, dim, index)` (1-D index).
pub(crate) fn index_select(x: &Tensor, dim: usize, index: &Tensor, y: Tensor) -> Result<Tensor> {
    if !needs_grad(&[x]) {
        return Ok(y);
    }
    let xd = x.dims_vec();
    let si = Saved::new("index_select", index);
    record("index_select", y, &[x], move |g| {
        let mut shape = vec![1usize; g.rank()];
        shape[dim] = g.dims()[dim];
        let idx = si.get()?.reshape_dims(&shape)?;
        Ok(vec![Some(scatter_add(&xd, dim, &idx, g)?)])
    })
}

/// Records `embedding(indices, weight, padding_idx)`: rows at `padding_idx` get no gradient.
pub(crate) fn embedding(
    indices: &Tensor,
    weight: &Tensor,
    padding_idx: Option<i64>,
    y: Tensor,
) -> Result<Tensor> {
    if !needs_grad(&[weight]) {
        return Ok(y);
    }
    let wd = weight.dims_vec();
    let si = Saved::new("embedding", indices);
    record("embedding", y, &[indices, weight], move |g| {
        let (v, d) = (wd[0], wd[1]);
        let idx = si.get()?.to_dtype(DType::I64)?.reshape(&[-1, 1])?;
        let mut g2 = g.reshape(&[-1, d as i64])?;
        if let Some(p) = padding_idx {
            let p = if p < 0 { p + v as i64 } else { p };
            let pad = idx.binary_scalar(BinaryOp::Eq, p, false)?;
            g2 = g2.masked_fill(&pad.expand_to(g2.dims())?, 0.0)?;
        }
        Ok(vec![None, Some(scatter_add(&wd, 0, &idx, &g2)?)])
    })
}
