//! Imported MaxPool and AveragePool: 1-d and 2-d on kiln's 2-d pooling
//! kernels (1-d over `[N, C, 1, L]`), 3-d through `ops_nn3d`'s depth taps;
//! an AveragePool those kernels do not take (dilations, asymmetric or wide
//! pads without `count_include_pad`) as tap sums; MaxPool's `Indices`
//! output counted over the whole input, as ONNX does.

use super::attrs::Node;
use super::host::Value;
use super::ops::input;
use super::ops_nn::{ints_or, pad, pads_full, spatial_pads, symmetric};
use super::ops_nn3d::{self, Window3d};
use crate::functional as F;
use crate::ir::op::pool::Pool2dParams;
use crate::ir::BinaryOp;
use crate::{DType, Result, Tensor};

fn t(v: Tensor) -> Result<Vec<Value>> {
    Ok(vec![Value::T(v)])
}

pub(super) fn pool(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let x = input(n, ins, 0)?;
    let s = x.rank().saturating_sub(2);
    if !(1..=3).contains(&s) {
        return Err(n.unsupported(format!(
            "{} with {s} spatial dims (kiln pools in 1-d to 3-d)",
            n.op()
        )));
    }
    let want_indices = n.proto.output.len() > 1 && !n.proto.output[1].is_empty();
    if want_indices && (n.op() != "MaxPool" || s != 2) {
        return Err(n.unsupported(format!("the Indices output of a {s}-d {}", n.op())));
    }
    let kernel: Vec<usize> = n
        .ints("kernel_shape")?
        .ok_or_else(|| n.err("attribute `kernel_shape` is required"))?
        .iter()
        .map(|k| *k as usize)
        .collect();
    let strides = ints_or(n, "strides", s, 1)?;
    let dilations = ints_or(n, "dilations", s, 1)?;
    let ceil = n.int_or("ceil_mode", 0)? != 0;
    // the order the Indices output counts in (nothing else depends on it)
    let column_major = n.int_or("storage_order", 0)? != 0;
    let max = n.op() == "MaxPool";
    let include_pad = n.int_or("count_include_pad", 0)? != 0;
    let pads = spatial_pads(n, &x.dims()[2..], &kernel, &strides, &dilations)?;
    // 8-bit integers are exact in f32: their maximum is the same pooled there
    let (x, int8) = match x.dtype() {
        DType::U8 if max => (x.to_dtype(DType::F32)?, Some(DType::U8)),
        d if d.is_float() => (x, None),
        _ => return Err(n.unsupported(format!("{} on {} (kiln pools floats)", n.op(), x.dtype()))),
    };
    let dilated = dilations.iter().any(|d| *d != 1);
    let sym = symmetric(&pads).is_some();
    let half = pads
        .iter()
        .zip(&kernel)
        .all(|((a, b), k)| 2 * a.max(b) <= *k);
    if !max && (dilated || (s < 3 && !include_pad && !(sym && half))) {
        let w = Window3d {
            kernel,
            strides,
            dilations,
            pads,
        };
        return t(ops_nn3d::avg_pool_taps(n, &x, &w, include_pad, ceil)?);
    }
    if s == 3 {
        return pool3d(n, &x, kernel, strides, dilations, pads, ceil, include_pad);
    }
    // kiln pools pad at most half a window: wider padding is applied first
    // (an AveragePool without count_include_pad took the tap sums above)
    let (x, pads) = match symmetric(&pads).filter(|_| half) {
        Some(p) => (x, p),
        None if want_indices => {
            return Err(
                n.unsupported("the Indices output with asymmetric or wider-than-half-window pads")
            )
        }
        None => {
            let fill = if max { f64::NEG_INFINITY } else { 0.0 };
            (pad(&x, &pads_full(&pads), "constant", fill)?, vec![0; s])
        }
    };
    if !max && dilations.iter().any(|d| *d != 1) {
        return Err(n.unsupported("AveragePool with dilations"));
    }
    // 1-d pools run as 2-d pools over [N, C, 1, L]
    let (x2, k2, s2, p2, d2) = if s == 1 {
        (
            x.unsqueeze(2)?,
            [1, kernel[0]],
            [1, strides[0]],
            [0, pads[0]],
            [1, dilations[0]],
        )
    } else {
        let a = |v: &[usize]| [v[0], v[1]];
        (x.clone(), a(&kernel), a(&strides), a(&pads), a(&dilations))
    };
    let p = Pool2dParams {
        kernel: k2,
        stride: s2,
        padding: p2,
        dilation: d2,
        ceil_mode: ceil,
    };
    if want_indices {
        let (y, idx) = F::max_pool2d(&x2, &p)?;
        return Ok(vec![
            Value::T(y),
            Value::T(flat_indices(&x2, &idx, column_major)?),
        ]);
    }
    let y = if max {
        F::max_pool2d_values(&x2, &p)?
    } else {
        F::avg_pool2d(&x2, &p, include_pad, None)?
    };
    let y = if s == 1 { y.squeeze(Some(&[2]))? } else { y };
    t(match int8 {
        Some(d) => y.to_dtype(d)?,
        None => y,
    })
}

/// ONNX's MaxPool indices count over the whole `(N, C, H, W)` input,
/// each plane row-major (`h*W + w`) or, with `storage_order=1`,
/// column-major (`h + w*H`); kiln's (PyTorch's) count row-major within
/// each plane.
fn flat_indices(x: &Tensor, idx: &Tensor, column_major: bool) -> Result<Tensor> {
    let d = x.dims();
    let (h, w) = (d[2] as i64, d[3] as i64);
    let base: Vec<i64> = (0..(d[0] * d[1]) as i64).map(|p| p * h * w).collect();
    let base = Tensor::from_vec(base, &[d[0], d[1], 1, 1])?;
    let idx = if column_major {
        let (row, col) = (
            idx.binary_scalar(BinaryOp::FloorDiv, w, false)?,
            idx.binary_scalar(BinaryOp::Remainder, w, false)?,
        );
        row.add(&col.binary_scalar(BinaryOp::Mul, h, false)?)?
    } else {
        idx.clone()
    };
    idx.add(&base)
}

#[allow(clippy::too_many_arguments)]
fn pool3d(
    n: &Node,
    x: &Tensor,
    kernel: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    pads: Vec<(usize, usize)>,
    ceil: bool,
    include_pad: bool,
) -> Result<Vec<Value>> {
    let w = Window3d {
        kernel,
        strides,
        dilations,
        pads,
    };
    // ceil mode changes the result only when a last partial window exists
    let partial = (0..3).any(|i| {
        let len = x.dims()[2 + i] + w.pads[i].0 + w.pads[i].1;
        let span = (w.kernel[i] - 1) * w.dilations[i] + 1;
        len >= span && (len - span) % w.strides[i] != 0
    });
    if ceil && partial {
        return Err(n.unsupported(format!("{} 3-d with ceil_mode=1", n.op())));
    }
    if n.op() == "MaxPool" {
        return t(ops_nn3d::max_pool3d(n, x, &w)?);
    }
    if w.dilations.iter().any(|d| *d != 1) {
        return Err(n.unsupported("AveragePool with dilations"));
    }
    t(ops_nn3d::avg_pool3d(n, x, &w, include_pad)?)
}
