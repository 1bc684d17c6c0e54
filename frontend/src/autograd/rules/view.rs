//! Backward rules of the view ops and of cat: a view's gradient is the
//! gradient laid back onto the input's shape (reshape, inverse permute, or
//! written into zeros through the same view for narrow/slice/select).

use super::embed;
pub(crate) use super::Range;
use crate::autograd::{needs_grad, record};
use crate::Tensor;
use kiln_ir::Result;

/// Records a view (or view-like copy) `y` of `x` whose gradient is `back(g, x_dims)`.
pub(crate) fn view(
    name: &'static str,
    x: &Tensor,
    y: Tensor,
    back: impl Fn(&Tensor, &[usize]) -> Result<Tensor> + Send + Sync + 'static,
) -> Result<Tensor> {
    if !needs_grad(&[x]) {
        return Ok(y);
    }
    let xd = x.dims_vec();
    record(name, y, &[x], move |g| Ok(vec![Some(back(g, &xd)?)]))
}

/// Views whose gradient is a reshape back to the input's shape.
pub(crate) fn reshape_like(name: &'static str, x: &Tensor, y: Tensor) -> Result<Tensor> {
    view(name, x, y, |g, d| g.reshape_dims(d))
}

/// Views that pick a region: the gradient is zeros with `g` written into that region.
pub(crate) fn region(name: &'static str, x: &Tensor, y: Tensor, r: super::Range) -> Result<Tensor> {
    view(name, x, y, move |g, d| embed(g, d, r))
}

/// Records `cat(xs, dim)`: each input's gradient is its slice of `g`.
pub(crate) fn cat(xs: &[&Tensor], d: usize, y: Tensor) -> Result<Tensor> {
    if !needs_grad(xs) {
        return Ok(y);
    }
    let sizes: Vec<usize> = xs.iter().map(|t| t.dims()[d]).collect();
    record("cat", y, xs, move |g| {
        let mut at = 0;
        let mut out = vec![];
        for &n in &sizes {
            out.push(Some(g.narrow(d as i64, at as i64, n)?));
            at += n;
        }
        Ok(out)
    })
}
