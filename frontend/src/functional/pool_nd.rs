//! 1-D and 3-D pooling built on the 2-D pool ops: a 1-D pool is the 2-D one
//! over `[N, C, 1, L]` (its flat indices are then the 1-D ones), and a 3-D
//! max or average pool is separable: the 2-D pool over (H, W) of each depth
//! slice, then a `(kd, 1)` pool over (D, H'W'). Max is separable exactly; the
//! average is too, because a box window's element count (with or without the
//! padding) is the product of its per-dim counts. Every step is a traced
//! graph op with its own backward, so eager, compiled and both backward
//! modes share one definition.

use super::consts_like;
use super::pooling::{adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, max_pool2d};
use crate::Tensor;
use kiln_ir::op::pool::{self, Pool2dParams};
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, BinaryOp, Result};

/// The settings of a 1-D pool (PyTorch's `kernel_size`, `stride` (default:
/// the kernel), `padding`, `dilation`, `ceil_mode`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pool1dParams {
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
    pub ceil_mode: bool,
}

/// The settings of a 3-D pool, per (D, H, W).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pool3dParams {
    pub kernel: [usize; 3],
    pub stride: [usize; 3],
    pub padding: [usize; 3],
    pub dilation: [usize; 3],
    pub ceil_mode: bool,
}

impl Pool1dParams {
    fn as_2d(&self) -> Pool2dParams {
        Pool2dParams {
            kernel: [1, self.kernel],
            stride: [1, self.stride],
            padding: [0, self.padding],
            dilation: [1, self.dilation],
            ceil_mode: self.ceil_mode,
        }
    }
}

/// `x` as `[.., 1, L]` for a 1-D pool (rank 2 or 3 only).
fn as_2d_input(op: &str, x: &Tensor) -> Result<Tensor> {
    if !(2..=3).contains(&x.rank()) {
        bail!(
            op,
            "expected a 2-D or 3-D input (unbatched or batched), got shape {}",
            fmt_dims(x.dims())
        );
    }
    x.unsqueeze(-2)
}

fn drop_h(t: Tensor) -> Result<Tensor> {
    t.squeeze(Some(&[-2]))
}

/// `F.max_pool1d(..., return_indices=True)`: values and indices along L.
pub fn max_pool1d(x: &Tensor, p: &Pool1dParams) -> Result<(Tensor, Tensor)> {
    let (v, i) = max_pool2d(&as_2d_input("max_pool1d", x)?, &p.as_2d())?;
    Ok((drop_h(v)?, drop_h(i)?))
}

/// `F.avg_pool1d` (count_include_pad, ceil_mode).
pub fn avg_pool1d(x: &Tensor, p: &Pool1dParams, count_include_pad: bool) -> Result<Tensor> {
    if p.dilation != 1 {
        bail!("avg_pool1d", "has no dilation (got {})", p.dilation);
    }
    drop_h(avg_pool2d(
        &as_2d_input("avg_pool1d", x)?,
        &p.as_2d(),
        count_include_pad,
        None,
    )?)
}

/// `F.adaptive_avg_pool1d`.
pub fn adaptive_avg_pool1d(x: &Tensor, output_size: usize) -> Result<Tensor> {
    drop_h(adaptive_avg_pool2d(
        &as_2d_input("adaptive_avg_pool1d", x)?,
        [1, output_size],
    )?)
}

/// `F.adaptive_max_pool1d(..., return_indices=True)`.
pub fn adaptive_max_pool1d(x: &Tensor, output_size: usize) -> Result<(Tensor, Tensor)> {
    let x2 = as_2d_input("adaptive_max_pool1d", x)?;
    let (v, i) = adaptive_max_pool2d(&x2, [1, output_size])?;
    Ok((drop_h(v)?, drop_h(i)?))
}

/// `(n, c, d, h, w)` of a 4-D or 5-D pool3d input, and whether it is batched.
fn split_3d(op: &str, x: &Tensor) -> Result<(bool, [usize; 5])> {
    match *x.dims() {
        [n, c, d, h, w] => Ok((true, [n, c, d, h, w])),
        [c, d, h, w] => Ok((false, [1, c, d, h, w])),
        _ => bail!(
            op,
            "expected a 4-D or 5-D input (unbatched or batched), got shape {}",
            fmt_dims(x.dims())
        ),
    }
}

/// The 2-D pools of a separable 3-D pool: over (H, W), then over (D, H'W').
fn split_params(p: &Pool3dParams) -> (Pool2dParams, Pool2dParams) {
    let hw = Pool2dParams {
        kernel: [p.kernel[1], p.kernel[2]],
        stride: [p.stride[1], p.stride[2]],
        padding: [p.padding[1], p.padding[2]],
        dilation: [p.dilation[1], p.dilation[2]],
        ceil_mode: p.ceil_mode,
    };
    let d = Pool2dParams {
        kernel: [p.kernel[0], 1],
        stride: [p.stride[0], 1],
        padding: [p.padding[0], 0],
        dilation: [p.dilation[0], 1],
        ceil_mode: p.ceil_mode,
    };
    (hw, d)
}

/// Runs a separable 3-D pool: `pool2d` over (H, W) of each depth slice, then
/// over (D, H'W').
fn separable_3d(
    op: &str,
    x: &Tensor,
    p: &Pool3dParams,
    pool2d: &dyn Fn(&Tensor, &Pool2dParams) -> Result<Tensor>,
) -> Result<Tensor> {
    let (batched, [n, c, d, h, w]) = split_3d(op, x)?;
    let (hw, dp) = split_params(p);
    let as_i = |v: &[usize]| v.iter().map(|&s| s as i64).collect::<Vec<_>>();
    let y = pool2d(&x.reshape(&as_i(&[n, c * d, h, w]))?, &hw)?;
    let (h2, w2) = (y.dims()[2], y.dims()[3]);
    let z = pool2d(&y.reshape(&as_i(&[n, c, d, h2 * w2]))?, &dp)?;
    let d2 = z.dims()[2];
    let out = if batched {
        vec![n, c, d2, h2, w2]
    } else {
        vec![c, d2, h2, w2]
    };
    z.reshape(&as_i(&out))
}

/// `F.max_pool3d` (values only; see [`max_pool3d_with_indices`]).
pub fn max_pool3d(x: &Tensor, p: &Pool3dParams) -> Result<Tensor> {
    separable_3d("max_pool3d", x, p, &|t, q| Ok(max_pool2d(t, q)?.0))
}

/// `F.max_pool3d(..., return_indices=True)`: values and PyTorch's flat
/// `d*H*W + h*W + w` indices into each input plane. The separable pools
/// pick the first maximum of each depth slice, then the first slice, so a
/// tie goes to the first position in (d, h, w) order, as PyTorch's does;
/// the gradient flows through both 2-D pools' argmaxes.
///
/// ```
/// use kiln_frontend::functional::{self as F, Pool3dParams};
/// use kiln_frontend::Tensor;
/// let x = Tensor::from_vec((0..8).map(|v| v as f32).collect(), &[1, 1, 2, 2, 2]).unwrap();
/// let p = Pool3dParams { kernel: [2; 3], stride: [2; 3], padding: [0; 3], dilation: [1; 3], ceil_mode: false };
/// let (y, i) = F::max_pool3d_with_indices(&x, &p).unwrap();
/// assert_eq!((y.to_f64_vec(), i.to_f64_vec()), (vec![7.0], vec![7.0]));
/// ```
pub fn max_pool3d_with_indices(x: &Tensor, p: &Pool3dParams) -> Result<(Tensor, Tensor)> {
    let op = "max_pool3d";
    let (batched, [n, c, d, h, w]) = split_3d(op, x)?;
    let (hw, dp) = split_params(p);
    let as_i = |v: &[usize]| v.iter().map(|&s| s as i64).collect::<Vec<_>>();
    let (y, i_hw) = max_pool2d(&x.reshape(&as_i(&[n, c * d, h, w]))?, &hw)?;
    let (h2, w2) = (y.dims()[2], y.dims()[3]);
    let (z, i_d) = max_pool2d(&y.reshape(&as_i(&[n, c, d, h2 * w2]))?, &dp)?;
    // i_d = slice * (H'W') + position: the slice each output took, and that
    // slice's in-plane index at the same position
    let slice = i_d.binary_scalar(BinaryOp::FloorDiv, (h2 * w2) as i64, false)?;
    let in_plane = i_hw
        .reshape(&as_i(&[n, c, d, h2 * w2]))?
        .gather(2, &slice)?;
    let idx = slice
        .binary_scalar(BinaryOp::Mul, (h * w) as i64, false)?
        .add(&in_plane)?;
    let d2 = z.dims()[2];
    let out = if batched {
        vec![n, c, d2, h2, w2]
    } else {
        vec![c, d2, h2, w2]
    };
    Ok((z.reshape(&as_i(&out))?, idx.reshape(&as_i(&out))?))
}

/// `F.avg_pool3d` (count_include_pad, ceil_mode, divisor_override).
pub fn avg_pool3d(
    x: &Tensor,
    p: &Pool3dParams,
    count_include_pad: bool,
    divisor_override: Option<i64>,
) -> Result<Tensor> {
    pool::check_divisor_override("avg_pool3d", divisor_override)?;
    if p.dilation != [1, 1, 1] {
        bail!("avg_pool3d", "has no dilation (got {:?})", p.dilation);
    }
    let incl = count_include_pad || divisor_override.is_some();
    let y = separable_3d("avg_pool3d", x, p, &|t, q| avg_pool2d(t, q, incl, None))?;
    match divisor_override {
        None => Ok(y),
        Some(dv) => {
            let (_, [_, _, d, h, w]) = split_3d("avg_pool3d", x)?;
            let dims = [d, h, w];
            let sizes: Vec<Vec<usize>> = (0..3)
                .map(|k| {
                    window_sizes(
                        dims[k],
                        p.kernel[k],
                        p.stride[k],
                        p.padding[k],
                        y.dims()[y.rank() - 3 + k],
                    )
                })
                .collect();
            let mut f = vec![];
            for a in &sizes[0] {
                for b in &sizes[1] {
                    for c in &sizes[2] {
                        f.push((a * b * c) as f64 / dv as f64);
                    }
                }
            }
            let shape = [sizes[0].len(), sizes[1].len(), sizes[2].len()];
            y.mul(&consts_like(&y, f, &shape)?)
        }
    }
}

/// The element count (padding included, as PyTorch's `count_include_pad`
/// divisor) of each of `out` windows along one dim.
pub(crate) fn window_sizes(
    input: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    out: usize,
) -> Vec<usize> {
    (0..out)
        .map(|o| {
            let start = (o * stride) as i64 - pad as i64;
            let end = (start + kernel as i64).min((input + pad) as i64);
            (end - start).max(0) as usize
        })
        .collect()
}

/// `avg_pool2d` with `divisor_override` as graph ops: the padded-window
/// average times each window's size over the divisor (a constant of the
/// shapes), so a trace needs no pool node with a divisor of its own.
pub(crate) fn avg_pool2d_divisor(x: &Tensor, p: &Pool2dParams, divisor: i64) -> Result<Tensor> {
    pool::check_divisor_override("avg_pool2d", Some(divisor))?;
    let g = pool::pool2d_geometry("avg_pool2d", x.dims(), p)?;
    let y = avg_pool2d(x, p, true, None)?;
    let r = x.rank();
    let (h, w) = (x.dims()[r - 2], x.dims()[r - 1]);
    let hs = window_sizes(h, p.kernel[0], p.stride[0], p.padding[0], g.out_size[0]);
    let ws = window_sizes(w, p.kernel[1], p.stride[1], p.padding[1], g.out_size[1]);
    let f: Vec<f64> = hs
        .iter()
        .flat_map(|a| ws.iter().map(move |b| (a * b) as f64 / divisor as f64))
        .collect();
    y.mul(&consts_like(&y, f, &[hs.len(), ws.len()])?)
}
