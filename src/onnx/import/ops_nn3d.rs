//! Imported 3-d Conv, MaxPool and AveragePool over (N, C, D, H, W), built
//! from kiln's 2-d kernels: the input is padded first (every dim, so
//! asymmetric pads need nothing more), then each depth tap `kd` gathers the
//! depth slices `od * stride + kd * dilation` (`index_select`) and folds
//! them into the batch of a 2-d convolution or pool; the taps are summed
//! (convolution, average) or reduced by `maximum` (max pool). Every step is
//! a differentiable tensor op, so `compile()` traces it like the rest.

use super::attrs::Node;
use crate::functional as F;
use crate::ir::op::conv::{ConvParams, Padding};
use crate::ir::op::pool::Pool2dParams;
use crate::{Result, Tensor};

/// Strides, dilations and `(begin, end)` pads of the three spatial dims.
pub(super) struct Window3d {
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    pub pads: Vec<(usize, usize)>,
}

impl Window3d {
    fn span(&self, i: usize) -> usize {
        (self.kernel[i] - 1) * self.dilations[i] + 1
    }

    /// Output size along spatial dim `i` of a padded length `len`.
    fn out_len(&self, n: &Node, i: usize, len: usize) -> Result<usize> {
        let span = self.span(i);
        if len < span {
            return Err(n.err(format!(
                "spatial dim {i}: padded size {len} is smaller than the window's extent {span}"
            )));
        }
        Ok((len - span) / self.strides[i] + 1)
    }
}

fn pads_full(w: &Window3d) -> Vec<(i64, i64)> {
    let mut v = vec![(0, 0), (0, 0)];
    v.extend(w.pads.iter().map(|(a, b)| (*a as i64, *b as i64)));
    v
}

/// The depth slices tap `k` reads, as `(N * od, C, H, W)`; and `od`.
fn depth_tap(n: &Node, x: &Tensor, w: &Window3d, k: usize) -> Result<(Tensor, usize)> {
    let d = x.dims();
    let od = w.out_len(n, 0, d[2])?;
    let idx: Vec<i64> = (0..od)
        .map(|o| (o * w.strides[0] + k * w.dilations[0]) as i64)
        .collect();
    let slices = x.index_select(2, &Tensor::from_vec(idx, &[od])?)?;
    let planes = slices
        .permute(&[0, 2, 1, 3, 4])?
        .reshape_dims(&[d[0] * od, d[1], d[3], d[4]])?;
    Ok((planes, od))
}

/// `(N * od, C', H', W')` back to `(N, C', od, H', W')`.
fn unfold_depth(y: &Tensor, batch: usize, od: usize) -> Result<Tensor> {
    let d = y.dims();
    y.reshape_dims(&[batch, od, d[1], d[2], d[3]])?
        .permute(&[0, 2, 1, 3, 4])?
        .contiguous()
}

/// ONNX `Conv` with three spatial dims.
pub(super) fn conv3d(
    n: &Node,
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    w: &Window3d,
    groups: usize,
) -> Result<Tensor> {
    let x = super::ops_nn::pad(x, &pads_full(w), "constant", 0.0)?;
    let p2 = ConvParams {
        stride: w.strides[1..].to_vec(),
        padding: Padding::Explicit(vec![0, 0]),
        dilation: w.dilations[1..].to_vec(),
        groups,
    };
    let mut acc: Option<(Tensor, usize)> = None;
    for k in 0..w.kernel[0] {
        let (planes, od) = depth_tap(n, &x, w, k)?;
        let y = F::conv2d(
            &planes,
            &weight.select(2, k as i64)?.contiguous()?,
            None,
            &p2,
        )?;
        acc = Some(match acc {
            None => (y, od),
            Some((a, _)) => (a.add(&y)?, od),
        });
    }
    let (y, od) = acc.ok_or_else(|| n.err("the kernel has no depth taps"))?;
    let y = unfold_depth(&y, x.dims()[0], od)?;
    match bias {
        Some(b) => y.add(&b.reshape_dims(&[1, b.dims()[0], 1, 1, 1])?),
        None => Ok(y),
    }
}

/// ONNX `MaxPool` (floor mode) with three spatial dims.
pub(super) fn max_pool3d(n: &Node, x: &Tensor, w: &Window3d) -> Result<Tensor> {
    let x = super::ops_nn::pad(x, &pads_full(w), "constant", f64::NEG_INFINITY)?;
    let p2 = pool2d(w);
    let mut acc: Option<(Tensor, usize)> = None;
    for k in 0..w.kernel[0] {
        let (planes, od) = depth_tap(n, &x, w, k)?;
        let y = F::max_pool2d_values(&planes, &p2)?;
        acc = Some(match acc {
            None => (y, od),
            Some((a, _)) => (a.maximum(&y)?, od),
        });
    }
    let (y, od) = acc.ok_or_else(|| n.err("the kernel has no depth taps"))?;
    unfold_depth(&y, x.dims()[0], od)
}

/// The window sums of a zero-padded `x` (sum pooling).
fn sum_pool3d(n: &Node, x: &Tensor, w: &Window3d) -> Result<Tensor> {
    let x = super::ops_nn::pad(x, &pads_full(w), "constant", 0.0)?;
    let p2 = pool2d(w);
    let area = (w.kernel[1] * w.kernel[2]) as f64;
    let mut acc: Option<(Tensor, usize)> = None;
    for k in 0..w.kernel[0] {
        let (planes, od) = depth_tap(n, &x, w, k)?;
        let y = &F::avg_pool2d(&planes, &p2, true, None)? * area;
        acc = Some(match acc {
            None => (y, od),
            Some((a, _)) => (a.add(&y)?, od),
        });
    }
    let (y, od) = acc.ok_or_else(|| n.err("the kernel has no depth taps"))?;
    unfold_depth(&y, x.dims()[0], od)
}

/// ONNX `AveragePool` (floor mode, no dilation) with three spatial dims:
/// window sums over the window's element count, padding counted or not.
pub(super) fn avg_pool3d(n: &Node, x: &Tensor, w: &Window3d, include_pad: bool) -> Result<Tensor> {
    let sums = sum_pool3d(n, x, w)?;
    if include_pad || w.pads.iter().all(|p| *p == (0, 0)) {
        let count = w.kernel.iter().product::<usize>() as f64;
        return Ok(&sums * (1.0 / count));
    }
    // how many real (unpadded) elements each window covers
    let d = x.dims();
    let ones = Tensor::ones(&[1, 1, d[2], d[3], d[4]], x.dtype());
    let counts = sum_pool3d(n, &ones, w)?;
    sums.div(&counts)
}

fn pool2d(w: &Window3d) -> Pool2dParams {
    Pool2dParams {
        kernel: [w.kernel[1], w.kernel[2]],
        stride: [w.strides[1], w.strides[2]],
        padding: [0, 0],
        dilation: [w.dilations[1], w.dilations[2]],
        ceil_mode: false,
    }
}

/// The full (uncropped, unpadded) result of a 3-d transposed convolution
/// without bias, `(N, C_out, full_d, full_h, full_w)`: each depth tap `k`
/// is a 2-d transposed convolution of every input depth slice (folded into
/// the batch), whose slices land on output depths `id * stride + k *
/// dilation`: spread by the stride (zeros between), shifted by the tap,
/// and summed over the taps. The caller crops it to the node's window.
pub(super) fn conv_transpose3d_full(
    n: &Node,
    x: &Tensor,
    weight: &Tensor,
    strides: &[usize],
    dilations: &[usize],
    groups: usize,
) -> Result<Tensor> {
    let d = x.dims().to_vec();
    let (batch, depth, kd) = (d[0], d[2], weight.dims()[2]);
    let planes = x
        .permute(&[0, 2, 1, 3, 4])?
        .reshape_dims(&[batch * depth, d[1], d[3], d[4]])?;
    let p2 = crate::ir::op::conv::ConvTransposeParams {
        stride: strides[1..].to_vec(),
        padding: vec![0, 0],
        output_padding: vec![0, 0],
        dilation: dilations[1..].to_vec(),
        groups,
    };
    let full_d = strides[0] * (depth - 1) + (kd - 1) * dilations[0] + 1;
    let mut acc: Option<Tensor> = None;
    for k in 0..kd {
        let w2 = weight.select(2, k as i64)?.contiguous()?;
        let y = F::conv_transpose2d(&planes, &w2, None, &p2)?;
        let y = unfold_depth(&y, batch, depth)?;
        let y = spread_depth(&y, strides[0])?;
        let front = (k * dilations[0]) as i64;
        let back = full_d as i64 - front - y.dims()[2] as i64;
        let window = [(0, 0), (0, 0), (front, back), (0, 0), (0, 0)];
        let y = super::ops_nn::pad(&y, &window, "constant", 0.0)?;
        acc = Some(match acc {
            None => y,
            Some(a) => a.add(&y)?,
        });
    }
    acc.ok_or_else(|| n.err("the kernel has no depth taps"))
}

/// `(N, C, D, H, W)` with `stride - 1` zero slices between depth slices:
/// depth `(D - 1) * stride + 1`.
fn spread_depth(y: &Tensor, stride: usize) -> Result<Tensor> {
    if stride == 1 {
        return Ok(y.clone());
    }
    let d = y.dims().to_vec();
    let zeros = Tensor::zeros(&[d[0], d[1], d[2], stride - 1, d[3], d[4]], y.dtype());
    let spread = Tensor::cat(&[&y.unsqueeze(3)?, &zeros], 3)?.reshape_dims(&[
        d[0],
        d[1],
        d[2] * stride,
        d[3],
        d[4],
    ])?;
    spread.narrow(2, 0, (d[2] - 1) * stride + 1)
}

/// ONNX `AveragePool` over any number of spatial dims as a sum of strided
/// slices, one per kernel tap, over the count of elements each window
/// covers (real ones, or with `count_include_pad` padding too): the pools
/// kiln's 2-d kernels do not take (dilations; asymmetric or
/// wider-than-half-window pads with `count_include_pad=0`). In ceil mode
/// the last partial windows reach past the padding into zeros that no
/// count includes, and a window starting in the end padding is dropped.
pub(super) fn avg_pool_taps(
    n: &Node,
    x: &Tensor,
    w: &Window3d,
    include_pad: bool,
    ceil: bool,
) -> Result<Tensor> {
    let s = w.kernel.len();
    let mut outs = vec![];
    let mut extra = vec![];
    for i in 0..s {
        let (len, (b, e)) = (x.dims()[2 + i], w.pads[i]);
        let padded = len + b + e;
        let span = w.span(i);
        if padded < span {
            return Err(n.err(format!(
                "spatial dim {i}: padded size {padded} is smaller than the window's extent {span}"
            )));
        }
        let st = w.strides[i];
        let mut o = if ceil {
            (padded - span).div_ceil(st) + 1
        } else {
            (padded - span) / st + 1
        };
        if ceil && (o - 1) * st >= len + b {
            o -= 1;
        }
        outs.push(o);
        extra.push(((o - 1) * w.strides[i] + span).saturating_sub(padded));
    }
    let full: Vec<(i64, i64)> = [(0, 0), (0, 0)]
        .into_iter()
        .chain((0..s).map(|i| (w.pads[i].0 as i64, (w.pads[i].1 + extra[i]) as i64)))
        .collect();
    let pad = |t: &Tensor, p: &[(i64, i64)]| super::ops_nn::pad(t, p, "constant", 0.0);
    let sums = tap_sum(&pad(x, &full)?, w, &outs)?;
    // ones where a window's elements count: the input, or the padded input
    let mut dims = vec![1, 1];
    dims.extend_from_slice(&x.dims()[2..]);
    let counted = if include_pad {
        let around: Vec<(i64, i64)> = (0..s + 2)
            .map(|i| {
                if i < 2 {
                    (0, 0)
                } else {
                    (w.pads[i - 2].0 as i64, w.pads[i - 2].1 as i64)
                }
            })
            .collect();
        let ones = pad(&Tensor::ones(&dims, x.dtype()), &around)?;
        let rest: Vec<(i64, i64)> = (0..s + 2)
            .map(|i| {
                if i < 2 {
                    (0, 0)
                } else {
                    (0, extra[i - 2] as i64)
                }
            })
            .collect();
        pad(&ones, &rest)?
    } else {
        pad(&Tensor::ones(&dims, x.dtype()), &full)?
    };
    sums.div(&tap_sum(&counted, w, &outs)?)
}

/// The window sums of an already padded `x` at `outs` windows per dim:
/// one strided slice per tap.
fn tap_sum(x: &Tensor, w: &Window3d, outs: &[usize]) -> Result<Tensor> {
    let s = w.kernel.len();
    let taps: usize = w.kernel.iter().product();
    let mut acc: Option<Tensor> = None;
    for tap in 0..taps {
        let (mut rest, mut t) = (tap, x.clone());
        for i in (0..s).rev() {
            let k = rest % w.kernel[i];
            rest /= w.kernel[i];
            let start = (k * w.dilations[i]) as i64;
            let stop = start + ((outs[i] - 1) * w.strides[i]) as i64 + 1;
            t = t.slice((2 + i) as i64, Some(start), Some(stop), w.strides[i] as i64)?;
        }
        acc = Some(match acc {
            None => t.contiguous()?,
            Some(a) => a.add(&t)?,
        });
    }
    acc.ok_or_else(|| kiln_ir::Error::op("AveragePool", "the kernel has no taps"))
}
