//! `torch.nn.utils.clip_grad_norm_` and `clip_grad_value_`.

use crate::{autograd, Tensor};
use kiln_ir::{BinaryOp, Result};

/// `torch.linalg.vector_norm(t, p)` over all elements (a 0-dim tensor).
pub fn vector_norm(t: &Tensor, p: f64) -> Result<Tensor> {
    if p == f64::INFINITY {
        t.abs()?.amax(None, false)
    } else if p == f64::NEG_INFINITY {
        t.abs()?.amin(None, false)
    } else if p == 0.0 {
        t.binary_scalar(BinaryOp::Ne, 0.0, false)?
            .to_dtype(t.dtype())?
            .sum(None, false)
    } else if p == 1.0 {
        t.abs()?.sum(None, false)
    } else if p == 2.0 {
        t.mul(t)?.sum(None, false)?.sqrt()
    } else {
        t.abs()?
            .binary_scalar(BinaryOp::Pow, p, false)?
            .sum(None, false)?
            .binary_scalar(BinaryOp::Pow, 1.0 / p, false)
    }
}

/// Scales the gradients of `params` in place so that their joint `norm_type`
/// norm is at most `max_norm`; returns the total norm before clipping (a
/// 0-dim tensor), as PyTorch does. The scale is
/// `min(1, max_norm / (total + 1e-6))`. `norm_type` may be `f64::INFINITY`.
///
/// ```
/// use kiln_frontend::{optim::clip_grad_norm_, DType, Tensor};
/// let p = Tensor::zeros(&[2], DType::F32).requires_grad_(true);
/// p.set_grad(Some(Tensor::from_vec(vec![3.0f32, 4.0], &[2]).unwrap()));
/// let total = clip_grad_norm_(&[p.clone()], 1.0, 2.0).unwrap();
/// assert_eq!(total.item().unwrap(), 5.0);
/// let g = p.grad().unwrap().to_f64_vec();
/// assert!((g[0] - 0.6).abs() < 1e-5 && (g[1] - 0.8).abs() < 1e-5);
/// ```
pub fn clip_grad_norm_(params: &[Tensor], max_norm: f64, norm_type: f64) -> Result<Tensor> {
    let _g = autograd::no_grad();
    let grads: Vec<Tensor> = params.iter().filter_map(Tensor::grad).collect();
    if grads.is_empty() {
        return Ok(Tensor::scalar(0.0f32));
    }
    let dt = grads[0].dtype();
    let norms = grads
        .iter()
        .map(|g| vector_norm(g, norm_type)?.to_dtype(dt))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&Tensor> = norms.iter().collect();
    let total = vector_norm(&Tensor::stack(&refs, 0)?, norm_type)?;
    let coef = total
        .binary_scalar(BinaryOp::Add, 1e-6, false)?
        .binary_scalar(BinaryOp::Div, max_norm, true)?
        .binary_scalar(BinaryOp::Minimum, 1.0, false)?;
    for g in &grads {
        g.copy_(&g.mul(&coef)?.to_dtype(g.dtype())?)?;
    }
    Ok(total)
}

/// Clamps every gradient of `params` in place to `[-clip_value, clip_value]`.
pub fn clip_grad_value_(params: &[Tensor], clip_value: f64) -> Result<()> {
    let _g = autograd::no_grad();
    for g in params.iter().filter_map(Tensor::grad) {
        let c = g
            .binary_scalar(BinaryOp::Maximum, -clip_value, false)?
            .binary_scalar(BinaryOp::Minimum, clip_value, false)?;
        g.copy_(&c)?;
    }
    Ok(())
}
