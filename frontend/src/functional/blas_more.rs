//! Small compositions over matmul, norms and softmax: `addmm`, `baddbmm`,
//! `addbmm`, `outer`, `normalize`, `cosine_similarity`, `glu`, `softmin`,
//! with PyTorch's formulas (a `beta` of 0 ignores the added input, NaN
//! included; norm clamps are not differentiated).

use super::{bmm, matmul};
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// `beta * input + alpha * product`; a `beta` of 0 does not read `input`.
fn scaled_sum(input: &Tensor, product: Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
    let product = if alpha == 1.0 {
        product
    } else {
        product.mul_scalar(alpha)?
    };
    if beta == 0.0 {
        // the shapes must still broadcast, as in PyTorch
        kiln_ir::shape::broadcast_shapes("addmm", input.dims(), product.dims())?;
        return Ok(product);
    }
    let input = if beta == 1.0 {
        input.clone()
    } else {
        input.mul_scalar(beta)?
    };
    input.add(&product)
}

/// `torch.addmm(input, mat1, mat2, beta, alpha)`: `beta * input + alpha * mat1 @ mat2`.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let i = Tensor::from_vec(vec![f32::NAN], &[1, 1]).unwrap();
/// let a = Tensor::from_vec(vec![2.0f32], &[1, 1]).unwrap();
/// // beta = 0: the NaN input is not read
/// assert_eq!(F::addmm(&i, &a, &a, 0.0, 1.0).unwrap().to_f64_vec(), vec![4.0]);
/// ```
pub fn addmm(
    input: &Tensor,
    mat1: &Tensor,
    mat2: &Tensor,
    beta: f64,
    alpha: f64,
) -> Result<Tensor> {
    if mat1.rank() != 2 || mat2.rank() != 2 {
        bail!(
            "addmm",
            "mat1 and mat2 must be matrices, got {} and {}",
            fmt_dims(mat1.dims()),
            fmt_dims(mat2.dims())
        );
    }
    scaled_sum(input, matmul(mat1, mat2)?, beta, alpha)
}

/// `torch.baddbmm(input, batch1, batch2, beta, alpha)`: per batch `beta * input + alpha * b1 @ b2`.
///
/// ```
/// use kiln_frontend::{functional as F, DType, Tensor};
/// let b = Tensor::ones(&[2, 1, 3], DType::F32);
/// let c = Tensor::ones(&[2, 3, 1], DType::F32);
/// let i = Tensor::ones(&[1, 1], DType::F32);
/// assert_eq!(F::baddbmm(&i, &b, &c, 1.0, 2.0).unwrap().to_f64_vec(), vec![7.0, 7.0]);
/// ```
pub fn baddbmm(input: &Tensor, b1: &Tensor, b2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
    scaled_sum(input, bmm(b1, b2)?, beta, alpha)
}

/// `torch.addbmm(input, batch1, batch2, beta, alpha)`: `beta * input + alpha * sum_b b1[b] @ b2[b]`.
///
/// ```
/// use kiln_frontend::{functional as F, DType, Tensor};
/// let b = Tensor::ones(&[2, 1, 3], DType::F32);
/// let c = Tensor::ones(&[2, 3, 1], DType::F32);
/// let i = Tensor::zeros(&[1, 1], DType::F32);
/// assert_eq!(F::addbmm(&i, &b, &c, 1.0, 1.0).unwrap().to_f64_vec(), vec![6.0]);
/// ```
pub fn addbmm(input: &Tensor, b1: &Tensor, b2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
    scaled_sum(input, bmm(b1, b2)?.sum(Some(&[0]), false)?, beta, alpha)
}

/// `torch.outer(input, vec2)`: `input[i] * vec2[j]`.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let a = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
/// assert_eq!(F::outer(&a, &a).unwrap().to_f64_vec(), vec![1.0, 2.0, 2.0, 4.0]);
/// ```
pub fn outer(input: &Tensor, vec2: &Tensor) -> Result<Tensor> {
    if input.rank() != 1 || vec2.rank() != 1 {
        bail!(
            "outer",
            "expects two 1-D vectors, got {} and {}",
            fmt_dims(input.dims()),
            fmt_dims(vec2.dims())
        );
    }
    input.unsqueeze(1)?.mul(&vec2.unsqueeze(0)?)
}

/// The p-norm of `x` over `dim` (kept): `|x|` summed for p = 1, the
/// Euclidean norm for p = 2, else `sum(|x|^p)^(1/p)`.
fn norm_keep(x: &Tensor, p: f64, dim: i64) -> Result<Tensor> {
    match p {
        1.0 => x.abs()?.sum(Some(&[dim]), true),
        2.0 => {
            // PyTorch's norm has gradient 0 at a zero vector (not sqrt's inf * 0)
            let s = x.mul(x)?.sum(Some(&[dim]), true)?;
            let zero = s.eq(&Tensor::scalar(0.0).to_dtype(s.dtype())?)?;
            let safe = Tensor::where_scalar(&zero.logical_not()?, &s, 1.0)?.sqrt()?;
            Tensor::where_scalar(&zero.logical_not()?, &safe, 0.0)
        }
        f64::INFINITY => x.abs()?.amax(Some(&[dim]), true),
        _ => x
            .abs()?
            .pow_scalar(p)?
            .sum(Some(&[dim]), true)?
            .pow_scalar(1.0 / p),
    }
}

/// `max(t, eps)` whose clamp is not differentiated (`t + (max - t).detach()`),
/// as PyTorch clamps norms under `no_grad`.
fn clamp_no_grad(t: &Tensor, eps: f64) -> Result<Tensor> {
    t.add(&t.clamp_min(eps)?.sub(t)?.detach())
}

/// `F.normalize(input, p, dim, eps)`: `x / max(||x||_p, eps)` over `dim`.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let x = Tensor::from_vec(vec![3.0f32, 4.0], &[1, 2]).unwrap();
/// let y = F::normalize(&x, 2.0, 1, 1e-12).unwrap();
/// assert_eq!(y.to_f64_vec(), vec![0.6000000238418579, 0.800000011920929]);
/// ```
pub fn normalize(x: &Tensor, p: f64, dim: i64, eps: f64) -> Result<Tensor> {
    // PyTorch: input / norm.clamp_min(eps).expand_as(input), the clamp differentiated
    x.div(&norm_keep(x, p, dim)?.clamp_min(eps)?)
}

/// `F.cosine_similarity(x1, x2, dim, eps)`: `sum(x1 / ||x1|| * x2 / ||x2||)`
/// over `dim` (inputs broadcast), each norm clamped at `eps` without
/// differentiating the clamp, as PyTorch does.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let a = Tensor::from_vec(vec![1.0f32, 0.0], &[1, 2]).unwrap();
/// let b = Tensor::from_vec(vec![2.0f32, 0.0], &[1, 2]).unwrap();
/// assert_eq!(F::cosine_similarity(&a, &b, 1, 1e-8).unwrap().to_f64_vec(), vec![1.0]);
/// ```
pub fn cosine_similarity(x1: &Tensor, x2: &Tensor, dim: i64, eps: f64) -> Result<Tensor> {
    let dims = kiln_ir::shape::broadcast_shapes("cosine_similarity", x1.dims(), x2.dims())?;
    let d: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let (x1, x2) = (x1.expand(&d)?, x2.expand(&d)?);
    let n1 = clamp_no_grad(&norm_keep(&x1, 2.0, dim)?, eps)?;
    let n2 = clamp_no_grad(&norm_keep(&x2, 2.0, dim)?, eps)?;
    x1.div(&n1)?.mul(&x2.div(&n2)?)?.sum(Some(&[dim]), false)
}

/// `F.glu(input, dim)`: the first half of `dim` times the sigmoid of the second.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let x = Tensor::from_vec(vec![2.0f32, 0.0], &[2]).unwrap();
/// assert_eq!(F::glu(&x, -1).unwrap().to_f64_vec(), vec![1.0]);
/// ```
pub fn glu(x: &Tensor, dim: i64) -> Result<Tensor> {
    let d = kiln_ir::shape::norm_dim("glu", dim, x.rank())?;
    if x.dims()[d] % 2 != 0 {
        bail!(
            "glu",
            "Halving dimension must be even, but dimension {d} is size {} (input {})",
            x.dims()[d],
            fmt_dims(x.dims())
        );
    }
    let h = x.chunk(2, dim)?;
    h[0].mul(&h[1].sigmoid()?)
}

/// `F.softmin(input, dim)`: `softmax(-input, dim)`.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let x = Tensor::from_vec(vec![0.0f32, 0.0], &[2]).unwrap();
/// assert_eq!(F::softmin(&x, 0).unwrap().to_f64_vec(), vec![0.5, 0.5]);
/// ```
pub fn softmin(x: &Tensor, dim: i64) -> Result<Tensor> {
    x.neg()?.softmax(dim)
}
