//! The backward rule of batch_norm in training mode, in closed form over
//! the batch statistics (PyTorch's `native_batch_norm_backward`): two
//! per-channel reductions, where differentiating through the decomposition's
//! mean and variance would take five or more.

use crate::autograd::{needs_grad, record, Saved};
use crate::Tensor;
use kiln_ir::Result;

/// Records `y = (x - mean) * rstd * weight + bias` (training mode: `mean`
/// and `rstd` are the batch's, dims kept) with its closed-form backward:
///
/// ```text
/// xhat = (x - mean) * rstd
/// db = sum(dy)            dw = sum(dy * xhat)        (over all dims but 1)
/// dx = weight * rstd / n * (n * dy - db - xhat * dw)
/// ```
pub(crate) fn batch_norm_train(
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    mean: &Tensor,
    rstd: &Tensor,
    y: Tensor,
) -> Result<Tensor> {
    let mut ins = vec![x];
    ins.extend(weight);
    ins.extend(bias);
    if !needs_grad(&ins) {
        return Ok(y);
    }
    let op = "batch_norm";
    let (sx, sm, sr) = (
        Saved::new(op, x),
        Saved::new(op, mean),
        Saved::new(op, rstd),
    );
    let sw = weight.map(|w| Saved::new(op, w));
    let has_bias = bias.is_some();
    let rank = x.rank();
    let c = x.dims()[1];
    let n = (x.numel() / c.max(1)) as f64;
    record(op, y, &ins, move |g| {
        let (x, mean, rstd) = (sx.get()?, sm.get()?, sr.get()?);
        let red: Vec<i64> = std::iter::once(0).chain(2..rank as i64).collect();
        let mut per_channel = vec![1i64; rank];
        per_channel[1] = c as i64;
        let xhat = x.sub(&mean)?.mul(&rstd)?;
        let db = g.sum(Some(&red), true)?;
        let dw = g.mul(&xhat)?.sum(Some(&red), true)?;
        let scale = match &sw {
            Some(w) => w.get()?.reshape(&per_channel)?.mul(&rstd)?,
            None => rstd.clone(),
        };
        let inner = super::mul_s(g, n)?.sub(&db)?.sub(&xhat.mul(&dw)?)?;
        let dx = inner.mul(&super::mul_s(&scale, 1.0 / n)?)?;
        let mut out = vec![Some(dx)];
        if sw.is_some() {
            out.push(Some(dw.reshape(&[c as i64])?));
        }
        if has_bias {
            out.push(Some(db.reshape(&[c as i64])?));
        }
        Ok(out)
    })
}
