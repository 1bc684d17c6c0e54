//! `F.instance_norm` and `F.local_response_norm` as compositions of graph
//! ops: instance norm is group norm with one group per channel (its
//! per-channel affine is instance norm's), or batch norm with the running
//! statistics in eval; local response norm is PyTorch's own formula, a
//! zero-padded average pool of the squares across channels.

use super::{batch_norm, group_norm, pad, pooling::avg_pool2d};
use crate::compile::trace;
use crate::nn::PaddingMode;
use crate::Tensor;
use kiln_ir::op::pool::Pool2dParams;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, BinaryOp, Result};

/// The running statistics `F.instance_norm` reads (eval) or updates in place
/// (`use_input_stats`): `(1 - m) running + m` times the batch mean of each
/// plane's mean / unbiased variance.
#[derive(Clone, Copy)]
pub struct RunningStats<'a> {
    pub mean: &'a Tensor,
    pub var: &'a Tensor,
}

/// `F.instance_norm(input, running_mean, running_var, weight, bias,
/// use_input_stats, momentum, eps)` on `(N, C, *)`.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 3.0], &[1, 1, 2]).unwrap();
/// let y = F::instance_norm(&x, None, None, None, true, 0.1, 0.0).unwrap();
/// assert_eq!(y.to_f64_vec(), vec![-1.0, 1.0]);
/// ```
pub fn instance_norm(
    x: &Tensor,
    running: Option<RunningStats>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    use_input_stats: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    if x.rank() < 3 {
        bail!(
            "instance_norm",
            "expected an input of shape (N, C, *) with at least one spatial dim, got {}",
            fmt_dims(x.dims())
        );
    }
    let c = x.dims()[1];
    if !use_input_stats {
        let Some(r) = running else {
            bail!(
                "instance_norm",
                "Expected running_mean and running_var to be defined when use_input_stats is false"
            );
        };
        return batch_norm(x, Some(r.mean), Some(r.var), weight, bias, false, 0.0, eps);
    }
    if let Some(r) = running {
        update_running_stats(x, r, momentum)?;
    }
    group_norm(x, c, weight, bias, eps)
}

/// The in-place running-statistics update of a `use_input_stats` call
/// (traced as a mutation of the stats, written back by the compiled run).
fn update_running_stats(x: &Tensor, r: RunningStats, momentum: f64) -> Result<()> {
    let _g = crate::autograd::no_grad();
    let xd = x.detach();
    let spatial: Vec<i64> = (2..x.rank() as i64).collect();
    let mean = xd.mean(Some(&spatial), false)?.mean(Some(&[0]), false)?;
    let var = xd.var(&spatial, 1.0, false)?.mean(Some(&[0]), false)?;
    for (buf, stat) in [(r.mean, mean), (r.var, var)] {
        if buf.dims() != stat.dims() {
            bail!(
                "instance_norm",
                "running stats of shape {} for input {}",
                fmt_dims(buf.dims()),
                fmt_dims(x.dims())
            );
        }
        let next = buf
            .binary_scalar(BinaryOp::Mul, 1.0 - momentum, false)?
            .add(&stat.binary_scalar(BinaryOp::Mul, momentum, false)?)?;
        trace::record_mutation(buf, &next, || buf.copy_(&next))?;
    }
    Ok(())
}

/// `F.local_response_norm(input, size, alpha, beta, k)` on `(N, C, *)`:
/// `x / (k + alpha * mean of x^2 over `size` neighbouring channels)^beta`,
/// the window zero-padded by `size / 2` before and `(size - 1) / 2` after.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let x = Tensor::from_vec(vec![2.0f32], &[1, 1, 1]).unwrap();
/// // 2 / (1 + 1 * 4)^1
/// let y = F::local_response_norm(&x, 1, 1.0, 1.0, 1.0).unwrap();
/// assert_eq!(y.to_f64_vec(), vec![0.4f32 as f64]);
/// ```
pub fn local_response_norm(
    x: &Tensor,
    size: usize,
    alpha: f64,
    beta: f64,
    k: f64,
) -> Result<Tensor> {
    if x.rank() < 3 || size == 0 {
        bail!(
            "local_response_norm",
            "expected an input of 3 or more dims and a positive size, got shape {} and size {size}",
            fmt_dims(x.dims())
        );
    }
    let (n, c) = (x.dims()[0], x.dims()[1]);
    let rest: usize = x.dims()[2..].iter().product();
    let sq = x.mul(x)?.reshape(&[n as i64, 1, c as i64, rest as i64])?;
    let before = (size / 2) as i64;
    let after = ((size - 1) / 2) as i64;
    let padded = pad(&sq, &[0, 0, before, after], PaddingMode::Zeros, 0.0)?;
    let window = Pool2dParams {
        kernel: [size, 1],
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
        ceil_mode: false,
    };
    let avg = avg_pool2d(&padded, &window, true, None)?;
    let shape: Vec<i64> = x.dims().iter().map(|&d| d as i64).collect();
    let div = avg
        .reshape(&shape)?
        .mul_scalar(alpha)?
        .add_scalar(k)?
        .pow_scalar(beta)?;
    x.div(&div)
}
