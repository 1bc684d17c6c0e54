//! Imported layers: convolution, normalisation, Gemm/MatMul, pooling, Pad.

use super::attrs::Node;
use super::host::Value;
use super::ops::input;
use super::ops_nn3d::{self, Window3d};
use crate::functional as F;
use crate::ir::op::conv::{ConvParams, ConvTransposeParams, Padding};
use crate::{Result, Tensor};

fn t(v: Tensor) -> Result<Vec<Value>> {
    Ok(vec![Value::T(v)])
}

fn opt(ins: &[Value], i: usize) -> Result<Option<Tensor>> {
    match ins.get(i) {
        Some(v) if !v.is_none() => Ok(Some(v.tensor()?)),
        _ => Ok(None),
    }
}

pub(crate) fn run(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    match n.op() {
        "Conv" => conv(n, ins),
        "ConvTranspose" => conv_transpose(n, ins),
        "BatchNormalization" => batch_norm(n, ins),
        "InstanceNormalization" => {
            let x = input(n, ins, 0)?;
            let eps = n.float_or("epsilon", 1e-5)?;
            let (s, b) = (input(n, ins, 1)?, input(n, ins, 2)?);
            t(F::group_norm(&x, x.dims()[1], Some(&s), Some(&b), eps)?)
        }
        "LayerNormalization" => {
            let x = input(n, ins, 0)?;
            let axis = n.int_or("axis", -1)?;
            let eps = n.float_or("epsilon", 1e-5)?;
            if n.int_or("stash_type", 1)? != 1 {
                return Err(n.unsupported("stash_type other than 1 (f32)"));
            }
            let axis = if axis < 0 {
                axis + x.rank() as i64
            } else {
                axis
            } as usize;
            let shape = x.dims()[axis..].to_vec();
            let (s, b) = (input(n, ins, 1)?, opt(ins, 2)?);
            let s = s.expand_to(&shape)?;
            let b = b.map(|b| b.expand_to(&shape)).transpose()?;
            let y = F::layer_norm(&x, &shape, Some(&s), b.as_ref(), eps)?;
            let mut outs = vec![Value::T(y)];
            // the optional Mean and InvStdDev outputs (computed in f32, keepdim)
            if n.proto.output.len() > 1 {
                let dims: Vec<i64> = (axis as i64..x.rank() as i64).collect();
                let xf = x.to_dtype(crate::DType::F32)?;
                let mean = xf.mean(Some(&dims), true)?;
                let var = xf.var(&dims, 0.0, true)?;
                outs.push(Value::T(mean));
                outs.push(Value::T((&var + eps).rsqrt()?));
            }
            Ok(outs)
        }
        "Gemm" => gemm(n, ins),
        "MatMul" => t(F::matmul(&input(n, ins, 0)?, &input(n, ins, 1)?)?),
        "MaxPool" | "AveragePool" => super::ops_pool::pool(n, ins),
        "GlobalAveragePool" | "GlobalMaxPool" => {
            let x = input(n, ins, 0)?;
            let dims: Vec<i64> = (2..x.rank() as i64).collect();
            t(if n.op() == "GlobalAveragePool" && x.rank() == 4 {
                // kiln's own op for it (what a kiln export of AdaptiveAvgPool(1) was)
                F::adaptive_avg_pool2d(&x, [1, 1])?
            } else if n.op() == "GlobalAveragePool" {
                x.mean(Some(&dims), true)?
            } else {
                x.amax(Some(&dims), true)?
            })
        }
        "Pad" => pad_node(n, ins),
        op => unreachable!("{op} is not a layer"),
    }
}

/// Per spatial dim `(begin, end)` padding from `pads`/`auto_pad`.
pub(super) fn spatial_pads(
    n: &Node,
    in_sizes: &[usize],
    kernel: &[usize],
    strides: &[usize],
    dilations: &[usize],
) -> Result<Vec<(usize, usize)>> {
    let s = in_sizes.len();
    let auto = n.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    match auto.as_str() {
        "NOTSET" => {
            let pads = n.ints("pads")?.unwrap_or_else(|| vec![0; 2 * s]);
            if pads.len() != 2 * s || pads.iter().any(|p| *p < 0) {
                return Err(n.err(format!("pads {pads:?} for {s} spatial dims")));
            }
            Ok((0..s)
                .map(|i| (pads[i] as usize, pads[i + s] as usize))
                .collect())
        }
        "VALID" => Ok(vec![(0, 0); s]),
        "SAME_UPPER" | "SAME_LOWER" => Ok((0..s)
            .map(|i| {
                let out = in_sizes[i].div_ceil(strides[i]);
                let span = (kernel[i] - 1) * dilations[i] + 1;
                let total = ((out - 1) * strides[i] + span).saturating_sub(in_sizes[i]);
                let small = total / 2;
                if auto == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                }
            })
            .collect()),
        a => Err(n.unsupported(format!("auto_pad=`{a}`"))),
    }
}

pub(super) fn ints_or(n: &Node, name: &str, len: usize, default: usize) -> Result<Vec<usize>> {
    match n.ints(name)? {
        Some(v) if v.len() == len && v.iter().all(|x| *x >= 1) => {
            Ok(v.iter().map(|x| *x as usize).collect())
        }
        Some(v) => Err(n.err(format!("attribute `{name}` = {v:?} for {len} spatial dims"))),
        None => Ok(vec![default; len]),
    }
}

/// Symmetric padding as one value per dim, or `None` when some dim is asymmetric.
pub(super) fn symmetric(p: &[(usize, usize)]) -> Option<Vec<usize>> {
    p.iter()
        .all(|(a, b)| a == b)
        .then(|| p.iter().map(|x| x.0).collect())
}

fn conv(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let (x, w, b) = (input(n, ins, 0)?, input(n, ins, 1)?, opt(ins, 2)?);
    let s = x.rank().saturating_sub(2);
    if !(1..=3).contains(&s) {
        return Err(n.unsupported(format!("Conv with {s} spatial dims (kiln has 1-d to 3-d)")));
    }
    let kernel: Vec<usize> = w.dims()[2..].to_vec();
    if let Some(k) = n.ints("kernel_shape")? {
        if k.iter().map(|v| *v as usize).collect::<Vec<_>>() != kernel {
            return Err(n.err(format!(
                "kernel_shape {k:?} disagrees with the weight {:?}",
                w.dims()
            )));
        }
    }
    let strides = ints_or(n, "strides", s, 1)?;
    let dilations = ints_or(n, "dilations", s, 1)?;
    let pads = spatial_pads(n, &x.dims()[2..], &kernel, &strides, &dilations)?;
    let groups = n.int_or("group", 1)? as usize;
    if s == 3 {
        let w3 = Window3d {
            kernel,
            strides,
            dilations,
            pads,
        };
        return t(ops_nn3d::conv3d(n, &x, &w, b.as_ref(), &w3, groups)?);
    }
    let (x, padding) = match symmetric(&pads) {
        Some(p) => (x, p),
        None => (pad(&x, &pads_full(&pads), "constant", 0.0)?, vec![0; s]),
    };
    let p = ConvParams {
        stride: strides,
        padding: Padding::Explicit(padding),
        dilation: dilations,
        groups,
    };
    t(if s == 1 {
        F::conv1d(&x, &w, b.as_ref(), &p)?
    } else {
        F::conv2d(&x, &w, b.as_ref(), &p)?
    })
}

/// `(begin, end)` for every dim of an N-C-spatial tensor (none on N and C).
pub(super) fn pads_full(spatial: &[(usize, usize)]) -> Vec<(i64, i64)> {
    let mut v = vec![(0, 0), (0, 0)];
    v.extend(spatial.iter().map(|(a, b)| (*a as i64, *b as i64)));
    v
}

fn conv_transpose(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let (x, w, b) = (input(n, ins, 0)?, input(n, ins, 1)?, opt(ins, 2)?);
    let s = x.rank().saturating_sub(2);
    if !(1..=3).contains(&s) {
        return Err(n.unsupported(format!(
            "ConvTranspose with {s} spatial dims (kiln has 1-d to 3-d)"
        )));
    }
    let _ = n.ints("kernel_shape")?;
    let strides = ints_or(n, "strides", s, 1)?;
    let dilations = ints_or(n, "dilations", s, 1)?;
    let output_padding = match n.ints("output_padding")? {
        Some(v) => v.iter().map(|x| *x as usize).collect(),
        None => vec![0; s],
    };
    let groups = n.int_or("group", 1)? as usize;
    // the full (unpadded) result's length per dim, and which part of it the node keeps
    let full: Vec<usize> = (0..s)
        .map(|i| strides[i] * (x.dims()[2 + i] - 1) + (w.dims()[2 + i] - 1) * dilations[i] + 1)
        .collect();
    let (begin, out) = transpose_window(n, x.dims(), &full, &strides, &output_padding)?;
    // a 1-d transposed convolution runs as a 2-d one over [N, C, 1, L]
    let two = |v: &[usize], fill: usize| if s == 1 { vec![fill, v[0]] } else { v.to_vec() };
    let symmetric = (0..s).all(|i| full[i] + output_padding[i] == out[i] + 2 * begin[i]);
    let small_extra = (0..s).all(|i| output_padding[i] < strides[i].max(dilations[i]));
    let (padding, extra) = if symmetric && small_extra {
        (begin.clone(), output_padding.clone())
    } else {
        (vec![0; s], vec![0; s])
    };
    let p = ConvTransposeParams {
        stride: two(&strides, 1),
        padding: two(&padding, 0),
        output_padding: two(&extra, 0),
        dilation: two(&dilations, 1),
        groups,
    };
    let (x2, w2) = if s == 1 {
        (x.unsqueeze(2)?, w.unsqueeze(2)?)
    } else {
        (x.clone(), w.clone())
    };
    if symmetric && small_extra && s < 3 {
        let y = F::conv_transpose2d(&x2, &w2, b.as_ref(), &p)?;
        return t(if s == 1 { y.squeeze(Some(&[2]))? } else { y });
    }
    // asymmetric pads, output_shape or auto_pad: the full result, cropped
    // (or extended with zeros) to the kept window, then the bias
    let y = match s {
        3 => super::ops_nn3d::conv_transpose3d_full(n, &x, &w, &strides, &dilations, groups)?,
        _ => {
            let p = ConvTransposeParams {
                padding: vec![0, 0],
                output_padding: vec![0, 0],
                ..p
            };
            let y = F::conv_transpose2d(&x2, &w2, None, &p)?;
            if s == 1 {
                y.squeeze(Some(&[2]))?
            } else {
                y
            }
        }
    };
    let mut window = vec![(0i64, 0i64); 2];
    for i in 0..s {
        let (b0, o) = (begin[i] as i64, out[i] as i64);
        window.push((-b0, o + b0 - full[i] as i64));
    }
    let y = pad(&y, &window, "constant", 0.0)?;
    t(match b {
        Some(b) => {
            let mut dims = vec![1; y.rank()];
            dims[1] = b.dims()[0];
            y.add(&b.reshape_dims(&dims)?)?
        }
        None => y,
    })
}

/// Where a ConvTranspose's output starts in its full result, and its size
/// per spatial dim, as the ONNX reference computes them from `pads`,
/// `auto_pad` and `output_shape`.
fn transpose_window(
    n: &Node,
    xd: &[usize],
    full: &[usize],
    strides: &[usize],
    output_padding: &[usize],
) -> Result<(Vec<usize>, Vec<usize>)> {
    let s = full.len();
    let auto = n.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    let shape = n
        .ints("output_shape")?
        .map(|v| v[v.len().saturating_sub(s)..].to_vec());
    if let Some(v) = &shape {
        if v.len() != s || v.iter().any(|d| *d < 1) {
            return Err(n.err(format!("output_shape {v:?} for {s} spatial dims")));
        }
    }
    let sizes = |shape: &Option<Vec<i64>>, p: &[i64]| -> Vec<usize> {
        match shape {
            Some(v) => v.iter().map(|d| *d as usize).collect(),
            None => (0..s)
                .map(|i| {
                    (full[i] as i64 + output_padding[i] as i64 - p[i] - p[i + s]).max(0) as usize
                })
                .collect(),
        }
    };
    match (n.ints("pads")?, auto.as_str()) {
        (Some(p), _) => {
            if p.len() != 2 * s || p.iter().any(|v| *v < 0) {
                return Err(n.err(format!("pads {p:?} for {s} spatial dims")));
            }
            let out = sizes(&shape, &p);
            Ok(((0..s).map(|i| p[i] as usize).collect(), out))
        }
        (None, "NOTSET" | "VALID") => Ok((vec![0; s], sizes(&shape, &vec![0; 2 * s]))),
        (None, "SAME_UPPER" | "SAME_LOWER") => {
            let out: Vec<usize> = match &shape {
                Some(v) => v.iter().map(|d| *d as usize).collect(),
                None => (0..s).map(|i| xd[2 + i] * strides[i]).collect(),
            };
            let begin = (0..s)
                .map(|i| {
                    let total = (full[i] + output_padding[i]) as i64 - out[i] as i64;
                    let half = total.div_euclid(2);
                    (if auto == "SAME_UPPER" {
                        half
                    } else {
                        total - half
                    })
                    .max(0) as usize
                })
                .collect();
            Ok((begin, out))
        }
        (None, a) => Err(n.unsupported(format!("auto_pad=`{a}`"))),
    }
}

fn batch_norm(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    n.ignore(&["momentum", "consumed_inputs"]);
    if n.int_or("spatial", 1)? != 1 {
        return Err(n.unsupported("spatial=0"));
    }
    if n.opset < 7 && n.int_or("is_test", 0)? == 0 && n.proto.output.len() > 1 {
        return Err(n.unsupported("training mode (is_test=0 with running-stat outputs)"));
    }
    if n.opset < 7 {
        let _ = n.int("is_test")?;
    }
    if n.int_or("training_mode", 0)? != 0 {
        return Err(n.unsupported("training_mode=1"));
    }
    let eps = n.float_or("epsilon", 1e-5)?;
    let x = input(n, ins, 0)?;
    let (s, b, m, v) = (
        input(n, ins, 1)?,
        input(n, ins, 2)?,
        input(n, ins, 3)?,
        input(n, ins, 4)?,
    );
    t(F::batch_norm(
        &x,
        Some(&m),
        Some(&v),
        Some(&s),
        Some(&b),
        false,
        0.1,
        eps,
    )?)
}

fn gemm(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    n.ignore(&["broadcast"]);
    let (a, b, c) = (input(n, ins, 0)?, input(n, ins, 1)?, opt(ins, 2)?);
    let alpha = n.float_or("alpha", 1.0)?;
    let beta = n.float_or("beta", 1.0)?;
    let (ta, tb) = (n.int_or("transA", 0)? != 0, n.int_or("transB", 0)? != 0);
    let a = if ta { a.t()? } else { a };
    // y = x W^T + b with a 1-d b is exactly a Linear (PyTorch's exporter writes it so)
    if tb && alpha == 1.0 && beta == 1.0 && c.as_ref().is_none_or(|c| c.rank() == 1) {
        return t(F::linear(&a, &b, c.as_ref())?);
    }
    let b = if tb { b.t()? } else { b };
    let mut y = F::matmul(&a, &b)?;
    if alpha != 1.0 {
        y = &y * alpha;
    }
    if let Some(c) = c {
        let c = if beta != 1.0 { &c * beta } else { c };
        y = y.add(&c)?;
    }
    t(y)
}

fn pad_node(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let x = input(n, ins, 0)?;
    let mode = n.string("mode")?.unwrap_or_else(|| "constant".into());
    let r = x.rank();
    let (pads, value, axes) = if n.opset < 11 {
        let p = n
            .ints(if n.opset < 2 { "paddings" } else { "pads" })?
            .ok_or_else(|| n.err("attribute `pads` is required"))?;
        (p, n.float_or("value", 0.0)?, None)
    } else {
        let p = ins
            .get(1)
            .ok_or_else(|| n.err("input `pads` is required"))?
            .ints()?;
        let v = match ins.get(2) {
            Some(v) if !v.is_none() => v.floats()?.first().copied().unwrap_or(0.0),
            _ => 0.0,
        };
        let axes = match ins.get(3) {
            Some(a) if !a.is_none() => Some(a.ints()?),
            _ => None,
        };
        (p, v, axes)
    };
    let axes: Vec<usize> = match axes {
        Some(a) => a
            .iter()
            .map(|v| if *v < 0 { *v + r as i64 } else { *v } as usize)
            .collect(),
        None => (0..r).collect(),
    };
    let k = axes.len();
    if pads.len() != 2 * k {
        return Err(n.err(format!("{} pads for {k} axes", pads.len())));
    }
    let mut full = vec![(0i64, 0i64); r];
    for (i, &a) in axes.iter().enumerate() {
        full[a] = (pads[i], pads[i + k]);
    }
    match mode.as_str() {
        "constant" | "reflect" | "edge" | "wrap" => t(pad(&x, &full, &mode, value)?),
        m => Err(n.unsupported(format!("mode=`{m}`"))),
    }
}

/// Pads (or, with negative amounts, crops) every dim by `(begin, end)`:
/// `constant` fills with `value`, `reflect` mirrors without the edge, `edge`
/// repeats it, `wrap` continues from the other end.
pub(crate) fn pad(x: &Tensor, pads: &[(i64, i64)], mode: &str, value: f64) -> Result<Tensor> {
    let mut y = x.clone();
    for (d, &(b, e)) in pads.iter().enumerate() {
        if b == 0 && e == 0 {
            continue;
        }
        let len = y.dims()[d] as i64;
        // crop first (negative pads)
        let (cb, ce) = ((-b).max(0), (-e).max(0));
        if cb + ce > 0 {
            y = y.narrow(d as i64, cb, (len - cb - ce).max(0) as usize)?;
        }
        let (b, e) = (b.max(0), e.max(0));
        if b == 0 && e == 0 {
            continue;
        }
        let n = y.dims()[d] as i64;
        if mode == "constant" {
            let mut dims = y.dims().to_vec();
            let mut parts = vec![];
            dims[d] = b as usize;
            let before = Tensor::full(&dims, value, y.dtype());
            dims[d] = e as usize;
            let after = Tensor::full(&dims, value, y.dtype());
            if b > 0 {
                parts.push(&before);
            }
            parts.push(&y);
            if e > 0 {
                parts.push(&after);
            }
            y = Tensor::cat(&parts, d as i64)?;
        } else {
            if mode == "reflect" && (b >= n || e >= n) {
                kiln_ir::bail!(
                    "Pad",
                    "reflect padding {b},{e} needs more than {n} elements along dim {d}"
                );
            }
            let idx: Vec<i64> = (-b..n + e)
                .map(|i| match mode {
                    "reflect" if i < 0 => -i,
                    "reflect" if i >= n => 2 * (n - 1) - i,
                    "wrap" => i.rem_euclid(n),
                    _ => i.clamp(0, n - 1),
                })
                .collect();
            let len = idx.len();
            y = y.index_select(d as i64, &Tensor::from_vec(idx, &[len])?)?;
        }
    }
    Ok(y)
}
