//! 3-D convolution for `nn.Conv3d`, as a sum over the kernel's depth taps
//! of 2-D convolutions: tap `kd` convolves the depth slices
//! `od * stride + kd * dilation` (batched into the 2-D batch dim) with
//! `weight[:, :, kd]`. Every step is a differentiable tensor op, so the
//! gradients of input, weight and bias and `compile` come with it.

use crate::functional as F;
use crate::Tensor;
use kiln_ir::op::conv::{ConvParams, Padding};
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// `F.conv3d(x, weight, bias, stride, padding, dilation, groups)` with one
/// stride, zero padding and dilation for all three dims.
///
/// ```
/// use kiln_frontend::{functional as F, DType, Tensor};
/// let x = Tensor::ones(&[1, 1, 2, 2, 2], DType::F32);
/// let w = Tensor::ones(&[1, 1, 2, 2, 2], DType::F32);
/// assert_eq!(F::conv3d(&x, &w, None, 1, 0, 1, 1).unwrap().to_f64_vec(), vec![8.0]);
/// ```
pub fn conv3d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: usize,
    padding: usize,
    dilation: usize,
    groups: usize,
) -> Result<Tensor> {
    let (xd, wd) = (x.dims(), weight.dims());
    if x.rank() != 5 || weight.rank() != 5 || stride == 0 || dilation == 0 {
        bail!(
            "conv3d",
            "expected a 5-D input (N, C, D, H, W) and 5-D weight, stride and dilation >= 1; got input {}, weight {}",
            fmt_dims(xd),
            fmt_dims(wd)
        );
    }
    let (n, kd) = (xd[0], wd[2]);
    let span = dilation * (kd - 1) + 1;
    if xd[2] + 2 * padding < span {
        bail!(
            "conv3d",
            "input depth {} (padded by {padding}) is smaller than the kernel's extent {span} (input {}, weight {})",
            xd[2],
            fmt_dims(xd),
            fmt_dims(wd)
        );
    }
    let x = super::padding_mode::pad_depth_zeros(x, padding)?;
    let od = (x.dims()[2] - span) / stride + 1;
    let p2 = ConvParams {
        stride: vec![stride],
        padding: Padding::Explicit(vec![padding]),
        dilation: vec![dilation],
        groups,
    };
    let mut acc: Option<Tensor> = None;
    for k in 0..kd {
        let idx: Vec<i64> = (0..od)
            .map(|o| (o * stride + k * dilation) as i64)
            .collect();
        let slices = x.index_select(2, &Tensor::from_vec(idx, &[od])?)?;
        let (c, h, w) = (xd[1], x.dims()[3], x.dims()[4]);
        let planes = slices
            .permute(&[0, 2, 1, 3, 4])?
            .reshape_dims(&[n * od, c, h, w])?;
        let y = F::conv2d(
            &planes,
            &weight.select(2, k as i64)?.contiguous()?,
            None,
            &p2,
        )?;
        acc = Some(match acc {
            None => y,
            Some(a) => a.add(&y)?,
        });
    }
    let y = acc.expect("a kernel has at least one depth tap");
    let (co, oh, ow) = (y.dims()[1], y.dims()[2], y.dims()[3]);
    let y = y
        .reshape_dims(&[n, od, co, oh, ow])?
        .permute(&[0, 2, 1, 3, 4])?;
    match bias {
        Some(b) => y.add(&b.reshape_dims(&[1, co, 1, 1, 1])?),
        None => Ok(y),
    }
}
