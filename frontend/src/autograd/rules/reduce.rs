//! Backward rules of the reductions: sum, mean, prod (zeros handled as
//! PyTorch does), amax/amin (ties share the gradient evenly), max/min along a
//! dim (the gradient goes to the returned index), log-sum-exp (the softmax),
//! Welford's biased variance (2 (x - mean) / n), softmax and log_softmax.

use super::keep;
use crate::autograd::{needs_grad, record, Saved};
use crate::Tensor;
use kiln_ir::op::infer;
use kiln_ir::{BinaryOp, DType, ReduceKind, Result};

/// `g` (the reduced result's gradient) reshaped to keepdim form and expanded to `dims`.
pub(crate) fn restore(g: &Tensor, dims: &[usize], rd: &[usize]) -> Result<Tensor> {
    let kd: Vec<usize> = (0..dims.len())
        .map(|d| if rd.contains(&d) { 1 } else { dims[d] })
        .collect();
    g.reshape_dims(&kd)?.expand_to(dims)
}

/// Records a reduction of `x` over `dims` (None = all) of kind `kind` (`mean` when `mean`).
pub(crate) fn reduction(
    name: &'static str,
    kind: ReduceKind,
    mean: bool,
    x: &Tensor,
    dims: Option<&[i64]>,
    y: Tensor,
) -> Result<Tensor> {
    if !needs_grad(&[x]) || !y.dtype().is_float() {
        return Ok(y);
    }
    if matches!(kind, ReduceKind::ArgMax | ReduceKind::ArgMin) {
        return Ok(y);
    }
    let rd = infer::reduce_dims(name, x.rank(), dims)?;
    let xd = x.dims_vec();
    let n: usize = rd.iter().map(|&d| xd[d]).product();
    let (sx, sy) = (Saved::new(name, x), Saved::new(name, &y));
    record(name, y, &[x], move |g| {
        let ge = restore(g, &xd, &rd)?;
        let gx = match kind {
            ReduceKind::Sum if mean => super::mul_s(&ge, 1.0 / n as f64)?,
            ReduceKind::Sum => ge,
            ReduceKind::Max | ReduceKind::Min => {
                let (x, y) = (sx.get()?, restore(&sy.get()?, &xd, &rd)?);
                let both_nan = keep(&x.ne(&x)?, &y.ne(&y)?.to_dtype(x.dtype())?)?;
                let mask = x.eq(&y)?.to_dtype(x.dtype())?.maximum(&both_nan)?;
                let dl: Vec<i64> = rd.iter().map(|&d| d as i64).collect();
                let count = mask.sum(Some(&dl), true)?;
                ge.div(&count)?.mul(&mask)?
            }
            ReduceKind::LogSumExp => {
                let (x, y) = (sx.get()?, restore(&sy.get()?, &xd, &rd)?);
                ge.mul(&x.sub(&y)?.exp()?)?
            }
            ReduceKind::Welford => {
                let x = sx.get()?;
                let dl: Vec<i64> = rd.iter().map(|&d| d as i64).collect();
                let d = x.sub(&x.mean(Some(&dl), true)?)?;
                ge.mul(&super::mul_s(&d, 2.0 / n as f64)?)?
            }
            _ => prod_grad(&ge, &sx.get()?, &restore(&sy.get()?, &xd, &rd)?, &rd)?,
        };
        Ok(vec![Some(gx)])
    })
}

/// d prod / d x_i = prod of the others: out / x without zeros; with exactly one
/// zero only that position gets the product of the rest; with more, all zero.
fn prod_grad(ge: &Tensor, x: &Tensor, y: &Tensor, rd: &[usize]) -> Result<Tensor> {
    let dl: Vec<i64> = rd.iter().map(|&d| d as i64).collect();
    let is0 = x.binary_scalar(BinaryOp::Eq, 0.0, false)?;
    let zeros = is0.to_dtype(x.dtype())?.sum(Some(&dl), true)?;
    let nz = Tensor::where_scalar(&is0.logical_not()?, x, 1.0)?;
    let p_nz = nz.prod_keep(&dl)?;
    let plain = y.div(x)?;
    let one_zero = keep(&is0, &p_nz.expand_to(x.dims())?)?;
    let none = zeros.binary_scalar(BinaryOp::Eq, 0.0, false)?;
    let single = zeros.binary_scalar(BinaryOp::Eq, 1.0, false)?;
    let r = Tensor::where_(&none, &plain, &keep(&single, &one_zero)?)?;
    ge.mul(&r)
}

impl Tensor {
    fn prod_keep(&self, dims: &[i64]) -> Result<Tensor> {
        let mut t = self.clone();
        for &d in dims {
            t = t.prod(Some(&[d]), true)?;
        }
        Ok(t)
    }
}

/// Records the values of `max(dim)`/`min(dim)`: the gradient goes to `idx`.
pub(crate) fn indexed(
    name: &'static str,
    x: &Tensor,
    dim: i64,
    idx: &Tensor,
    y: Tensor,
) -> Result<Tensor> {
    if !needs_grad(&[x]) {
        return Ok(y);
    }
    let d = kiln_ir::shape::norm_dim(name, dim, x.rank())?;
    let xd = x.dims_vec();
    let si = Saved::new(name, idx);
    record(name, y, &[x], move |g| {
        let mut kd = xd.clone();
        kd[d] = 1;
        let (g, i) = (g.reshape_dims(&kd)?, si.get()?.reshape_dims(&kd)?);
        let mut ad = vec![1usize; xd.len()];
        ad[d] = xd[d];
        let ar = Tensor::arange(xd[d], DType::I64)
            .reshape_dims(&ad)?
            .to_device(i.device())?;
        let mask = ar.eq(&i)?;
        Ok(vec![Some(keep(&mask, &g.expand_to(&xd)?)?)])
    })
}

/// Records `softmax` (`log == false`) or `log_softmax` along `dim`.
pub(crate) fn softmax(x: &Tensor, dim: i64, log: bool, y: Tensor) -> Result<Tensor> {
    if !needs_grad(&[x]) {
        return Ok(y);
    }
    let name = if log { "log_softmax" } else { "softmax" };
    let sy = Saved::new(name, &y);
    record(name, y, &[x], move |g| {
        let y = sy.get()?;
        let gx = if log {
            g.sub(&y.exp()?.mul(&g.sum(Some(&[dim]), true)?)?)?
        } else {
            g.sub(&g.mul(&y)?.sum(Some(&[dim]), true)?)?.mul(&y)?
        };
        Ok(vec![Some(gx)])
    })
}
