//! `torch.cdist`: the p-norm of every pair of rows, as PyTorch computes it:
//! the norm of the broadcast differences, or for p = 2 with more than 25
//! rows on a side its matmul form `|a|^2 - 2 a.b + |b|^2` (clamped at 1e-30
//! before the square root).

use super::matmul;
use crate::ops::reduce_more::NormOrd;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// `torch.cdist(x1, x2, p, compute_mode)`: `(.., P, M)` and `(.., R, M)` to
/// `(.., P, R)`; `compute_mode` is PyTorch's string.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let a = Tensor::from_vec(vec![0.0f32, 0.0], &[1, 2]).unwrap();
/// let b = Tensor::from_vec(vec![3.0f32, 4.0], &[1, 2]).unwrap();
/// let d = F::cdist(&a, &b, 2.0, "use_mm_for_euclid_dist_if_necessary").unwrap();
/// assert_eq!(d.to_f64_vec(), vec![5.0]);
/// ```
pub fn cdist(x1: &Tensor, x2: &Tensor, p: f64, compute_mode: &str) -> Result<Tensor> {
    let (r1, r2) = (x1.rank(), x2.rank());
    if r1 < 2 || r2 < 2 || x1.dims()[r1 - 1] != x2.dims()[r2 - 1] {
        bail!(
            "cdist",
            "X1 and X2 must have at least 2 dims and the same number of columns, got {} and {}",
            fmt_dims(x1.dims()),
            fmt_dims(x2.dims())
        );
    }
    if p < 0.0 || p.is_nan() {
        bail!("cdist", "only supports non-negative p values, got {p}");
    }
    let (rows1, rows2) = (x1.dims()[r1 - 2], x2.dims()[r2 - 2]);
    let mm = match compute_mode {
        "use_mm_for_euclid_dist_if_necessary" => p == 2.0 && (rows1 > 25 || rows2 > 25),
        "use_mm_for_euclid_dist" => p == 2.0,
        "donot_use_mm_for_euclid_dist" => false,
        m => bail!("cdist", "{m} is not a valid value for compute_mode"),
    };
    if mm {
        return euclidean_mm(x1, x2);
    }
    let diff = x1.unsqueeze(-2)?.sub(&x2.unsqueeze(-3)?)?;
    diff.vector_norm(NormOrd::from_f64(p), Some(&[-1]), false)
}

/// PyTorch's `_euclidean_dist`: `[-2 a, |a|^2, 1] . [b, 1, |b|^2]`.
fn euclidean_mm(x1: &Tensor, x2: &Tensor) -> Result<Tensor> {
    let n1 = x1.mul(x1)?.sum(Some(&[-1]), true)?;
    let n2 = x2.mul(x2)?.sum(Some(&[-1]), true)?;
    let a = Tensor::cat(&[&x1.mul_scalar(-2.0)?, &n1, &n1.ones_like(None)?], -1)?;
    let b = Tensor::cat(&[x2, &n2.ones_like(None)?, &n2], -1)?;
    matmul(&a, &b.transpose(-2, -1)?)?.clamp_min(1e-30)?.sqrt()
}
