//! `F.unfold` (im2col) and `F.fold` (col2im): one `index_select` of the
//! zero-padded, flattened planes at the window positions, and its adjoint,
//! an `index_add` of the columns into zeroed padded planes (so each one's
//! gradient is the other). The positions depend on the shapes only.

use super::pad;
use crate::nn::PaddingMode;
use crate::ops::view_more::index_on;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// The window settings of `F.unfold`/`F.fold`, per (H, W).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Im2colParams {
    pub kernel: [usize; 2],
    pub dilation: [usize; 2],
    pub padding: [usize; 2],
    pub stride: [usize; 2],
}

/// The number of windows along one padded dim, or an error naming `op`.
fn windows(op: &str, size: usize, k: usize, d: usize, p: usize, s: usize) -> Result<usize> {
    let span = d * (k.max(1) - 1) + 1;
    if k == 0 || d == 0 || s == 0 || size + 2 * p < span {
        bail!(
            op,
            "kernel {k} (dilation {d}, stride {s}) does not fit a dim of {size} padded by {p}"
        );
    }
    Ok((size + 2 * p - span) / s + 1)
}

/// Flat positions in the padded `(H + 2p) x (W + 2p)` plane, ordered
/// (ki, kj, oh, ow): unfold's row-within-channel, then column.
fn positions(p: &Im2colParams, padded_w: usize, out: [usize; 2]) -> Vec<i64> {
    let mut v = Vec::with_capacity(p.kernel[0] * p.kernel[1] * out[0] * out[1]);
    for ki in 0..p.kernel[0] {
        for kj in 0..p.kernel[1] {
            for oh in 0..out[0] {
                for ow in 0..out[1] {
                    let h = oh * p.stride[0] + ki * p.dilation[0];
                    let w = ow * p.stride[1] + kj * p.dilation[1];
                    v.push((h * padded_w + w) as i64);
                }
            }
        }
    }
    v
}

/// `F.unfold(input, kernel_size, dilation, padding, stride)`: `(N, C, H, W)`
/// to `(N, C kh kw, L)` (unbatched `(C, H, W)` to `(C kh kw, L)`).
///
/// ```
/// use kiln_frontend::functional::{self as F, Im2colParams};
/// use kiln_frontend::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[1, 1, 2, 2]).unwrap();
/// let p = Im2colParams { kernel: [1, 2], dilation: [1, 1], padding: [0, 0], stride: [1, 1] };
/// let y = F::unfold(&x, &p).unwrap();
/// assert_eq!(y.dims(), &[1, 2, 2]);
/// assert_eq!(y.to_f64_vec(), vec![1.0, 3.0, 2.0, 4.0]);
/// ```
pub fn unfold(x: &Tensor, p: &Im2colParams) -> Result<Tensor> {
    let batched = match x.rank() {
        4 => true,
        3 => false,
        _ => bail!(
            "unfold",
            "Input Error: Only 3D or 4D input Tensors are supported (got {}D, shape {})",
            x.rank(),
            fmt_dims(x.dims())
        ),
    };
    let x4 = if batched { x.clone() } else { x.unsqueeze(0)? };
    let [n, c, h, w] = [x4.dims()[0], x4.dims()[1], x4.dims()[2], x4.dims()[3]];
    let oh = windows(
        "unfold",
        h,
        p.kernel[0],
        p.dilation[0],
        p.padding[0],
        p.stride[0],
    )?;
    let ow = windows(
        "unfold",
        w,
        p.kernel[1],
        p.dilation[1],
        p.padding[1],
        p.stride[1],
    )?;
    let (ph, pw) = (p.padding[0] as i64, p.padding[1] as i64);
    let xp = pad(&x4, &[pw, pw, ph, ph], PaddingMode::Zeros, 0.0)?;
    let (hp, wp) = (xp.dims()[2], xp.dims()[3]);
    let idx = index_on(x, positions(p, wp, [oh, ow]))?;
    let cols = xp
        .reshape(&[n as i64, c as i64, (hp * wp) as i64])?
        .index_select(2, &idx)?;
    let kk = (p.kernel[0] * p.kernel[1]) as i64;
    let y = cols.reshape(&[n as i64, c as i64 * kk, (oh * ow) as i64])?;
    if batched {
        Ok(y)
    } else {
        y.squeeze(Some(&[0]))
    }
}

/// `F.fold(input, output_size, kernel_size, dilation, padding, stride)`:
/// `(N, C kh kw, L)` summed back into `(N, C, H, W)` (unbatched without N).
///
/// ```
/// use kiln_frontend::functional::{self as F, Im2colParams};
/// use kiln_frontend::Tensor;
/// let cols = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 1, 2]).unwrap();
/// let p = Im2colParams { kernel: [1, 1], dilation: [1, 1], padding: [0, 0], stride: [1, 1] };
/// let y = F::fold(&cols, [1, 2], &p).unwrap();
/// assert_eq!(y.to_f64_vec(), vec![1.0, 2.0]);
/// ```
pub fn fold(x: &Tensor, output_size: [usize; 2], p: &Im2colParams) -> Result<Tensor> {
    let batched = match x.rank() {
        3 => true,
        2 => false,
        _ => bail!(
            "fold",
            "Input Error: Only unbatched (2D) or batched (3D) input Tensors are supported (got shape {})",
            fmt_dims(x.dims())
        ),
    };
    let x3 = if batched { x.clone() } else { x.unsqueeze(0)? };
    let (n, ck, l) = (x3.dims()[0], x3.dims()[1], x3.dims()[2]);
    let kk = p.kernel[0] * p.kernel[1];
    let [h, w] = output_size;
    let oh = windows(
        "fold",
        h,
        p.kernel[0],
        p.dilation[0],
        p.padding[0],
        p.stride[0],
    )?;
    let ow = windows(
        "fold",
        w,
        p.kernel[1],
        p.dilation[1],
        p.padding[1],
        p.stride[1],
    )?;
    if kk == 0 || ck % kk != 0 || l != oh * ow {
        bail!(
            "fold",
            "input {} does not match kernel {:?} and output_size {:?}: expected dim 1 divisible by {kk} and {} blocks",
            fmt_dims(x.dims()),
            p.kernel,
            output_size,
            oh * ow
        );
    }
    let c = ck / kk;
    let (hp, wp) = (h + 2 * p.padding[0], w + 2 * p.padding[1]);
    let idx = index_on(x, positions(p, wp, [oh, ow]))?;
    let src = x3.reshape(&[n as i64, c as i64, (kk * l) as i64])?;
    let planes = Tensor::zeros(&[n, c, hp * wp], x.dtype()).to_device(x.device())?;
    let y = planes
        .index_add(2, &idx, &src, 1.0)?
        .reshape(&[n as i64, c as i64, hp as i64, wp as i64])?
        .narrow(2, p.padding[0] as i64, h)?
        .narrow(3, p.padding[1] as i64, w)?;
    if batched {
        Ok(y)
    } else {
        y.squeeze(Some(&[0]))
    }
}
