//! Imported `Resize` (opsets 10-19), `Upsample` (7-9) and `LRN`.
//!
//! Resize works one axis at a time, as the ONNX reference does: each output
//! index maps to a source coordinate by `coordinate_transformation_mode`,
//! the mode's coefficients (nearest, linear, cubic; antialiased linear and
//! cubic) weight the neighbouring source indices (clamped at the edges, or
//! dropped with `exclude_outside`), and the weights form a constant
//! (out, in) matrix. A matrix of single ones (nearest) is an
//! `index_select`, exact for every value; any other is a matmul over the
//! axis moved last.

use super::attrs::Node;
use super::host::Value;
use super::ops::input;
use crate::{DType, Result, Tensor};

fn t(v: Tensor) -> Result<Vec<Value>> {
    Ok(vec![Value::T(v)])
}

/// How output indices map to source coordinates and what weights them.
struct Mode {
    kind: String,
    coord: String,
    nearest: String,
    cubic_a: f64,
    exclude_outside: bool,
    antialias: bool,
    extrapolation: f64,
}

impl Mode {
    fn coeffs(&self, ratio: f64, scale: f64) -> Vec<f64> {
        match self.kind.as_str() {
            "nearest" => {
                if ratio == 1.0 || ratio.fract() == 0.0 {
                    return vec![0.0, 1.0];
                }
                let up = match self.nearest.as_str() {
                    "round_prefer_floor" => ratio > 0.5,
                    "round_prefer_ceil" => ratio >= 0.5,
                    "floor" => false,
                    _ => true, // ceil
                };
                if up {
                    vec![0.0, 1.0]
                } else {
                    vec![1.0, 0.0]
                }
            }
            "linear" if self.antialias => {
                let s = scale.min(1.0);
                let start = (-1.0 / s).floor() as i64 + 1;
                let footprint = 2 - 2 * start;
                let c: Vec<f64> = (start..start + footprint)
                    .map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))
                    .collect();
                let sum: f64 = c.iter().sum();
                c.iter().map(|v| v / sum).collect()
            }
            "linear" => vec![1.0 - ratio, ratio],
            _ if self.antialias => {
                let s = scale.min(1.0);
                let a = self.cubic_a;
                let f = |x: f64| {
                    let x = x.abs();
                    if x <= 1.0 {
                        (a + 2.0) * x.powi(3) - (a + 3.0) * x * x + 1.0
                    } else if x < 2.0 {
                        a * x.powi(3) - 5.0 * a * x * x + 8.0 * a * x - 4.0 * a
                    } else {
                        0.0
                    }
                };
                let start = (-2.0 / s).floor() as i64 + 1;
                let c: Vec<f64> = (start..2 - start)
                    .map(|i| f(s * (i as f64 - ratio)))
                    .collect();
                let sum: f64 = c.iter().sum();
                c.iter().map(|v| v / sum).collect()
            }
            _ => {
                let (a, r) = (self.cubic_a, ratio);
                vec![
                    ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
                    ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                    ((a + 2.0) * (1.0 - r) - (a + 3.0)) * (1.0 - r) * (1.0 - r) + 1.0,
                    ((a * ((1.0 - r) + 1.0) - 5.0 * a) * ((1.0 - r) + 1.0) + 8.0 * a)
                        * ((1.0 - r) + 1.0)
                        - 4.0 * a,
                ]
            }
        }
    }

    /// The source coordinate of output index `y`; `None` when it lies
    /// outside the crop (tf_crop_and_resize: the extrapolation value).
    fn source(&self, y: f64, scale: f64, len: usize, out: usize, roi: (f64, f64)) -> Option<f64> {
        let (inw, outw) = (len as f64, scale * len as f64);
        Some(match self.coord.as_str() {
            "align_corners" if outw == 1.0 => 0.0,
            "align_corners" => y * (inw - 1.0) / (outw - 1.0),
            "asymmetric" => y / scale,
            "tf_half_pixel_for_nearest" => (y + 0.5) / scale,
            "pytorch_half_pixel" if outw == 1.0 => -0.5,
            "pytorch_half_pixel" | "half_pixel" => (y + 0.5) / scale - 0.5,
            "half_pixel_symmetric" => {
                let adjustment = out as f64 / outw;
                let offset = inw / 2.0 * (1.0 - adjustment);
                offset + (y + 0.5) / scale - 0.5
            }
            _ => {
                // tf_crop_and_resize
                let x = if outw == 1.0 {
                    (roi.1 - roi.0) * (inw - 1.0) / 2.0
                } else {
                    y * (roi.1 - roi.0) * (inw - 1.0) / (outw - 1.0)
                } + roi.0 * (inw - 1.0);
                if x < 0.0 || x > inw - 1.0 {
                    return None;
                }
                x
            }
        })
    }

    /// The (out, len) weights of one axis and, per output index, whether
    /// it takes the extrapolation value instead.
    fn matrix(&self, len: usize, out: usize, scale: f64, roi: (f64, f64)) -> (Vec<f64>, Vec<bool>) {
        let mut m = vec![0.0; out * len];
        let mut outside = vec![false; out];
        for j in 0..out {
            let Some(x) = self.source(j as f64, scale, len, out, roi) else {
                outside[j] = true;
                continue;
            };
            let floor = x.floor();
            let ratio = if x == floor { 1.0 } else { x - floor };
            let mut c = self.coeffs(ratio, scale);
            let n = c.len() as i64;
            let pad = (n + 1) / 2;
            let xp = x + pad as f64;
            let p = xp.floor();
            let frac = xp - p;
            let offset = if n % 2 == 0 {
                if frac == 0.0 {
                    -(n / 2)
                } else {
                    -(n / 2) + 1
                }
            } else if frac <= 0.5 {
                -((n - 1) / 2)
            } else {
                -((n - 1) / 2) + 1
            };
            let start = p as i64 + offset - pad;
            let idx: Vec<i64> = (0..n).map(|k| start + k).collect();
            if self.exclude_outside {
                for (k, i) in idx.iter().enumerate() {
                    if *i < 0 || *i >= len as i64 {
                        c[k] = 0.0;
                    }
                }
                let sum: f64 = c.iter().sum();
                if sum != 0.0 {
                    c.iter_mut().for_each(|v| *v /= sum);
                }
            }
            for (k, i) in idx.iter().enumerate() {
                let i = (*i).clamp(0, len as i64 - 1) as usize;
                m[j * len + i] += c[k];
            }
        }
        (m, outside)
    }
}

/// Resizes axis `axis` of `x` from its length to `out` with `scale`.
fn resize_axis(
    x: &Tensor,
    axis: usize,
    out: usize,
    scale: f64,
    roi: (f64, f64),
    mode: &Mode,
) -> Result<Tensor> {
    let len = x.dims()[axis];
    let (m, outside) = mode.matrix(len, out, scale, roi);
    let one_hot: Option<Vec<i64>> = (0..out)
        .map(|j| {
            let row = &m[j * len..(j + 1) * len];
            let ones = row.iter().filter(|v| **v == 1.0).count();
            let zeros = row.iter().filter(|v| **v == 0.0).count();
            (ones == 1 && zeros == len - 1 && !outside[j])
                .then(|| row.iter().position(|v| *v == 1.0).unwrap() as i64)
        })
        .collect();
    if let Some(idx) = one_hot {
        return x.index_select(axis as i64, &Tensor::from_vec(idx, &[out])?);
    }
    let r = x.rank() as i64;
    let mut perm: Vec<i64> = (0..r).filter(|d| *d != axis as i64).collect();
    perm.push(axis as i64);
    let moved = x.permute(&perm)?;
    // [.., len] @ [len, out]
    let mt = Tensor::from_vec(m, &[out, len])?.to_dtype(x.dtype())?.t()?;
    let mut y = crate::functional::matmul(&moved, &mt)?;
    if outside.iter().any(|o| *o) {
        let fill: Vec<f64> = outside
            .iter()
            .map(|o| if *o { mode.extrapolation } else { 0.0 })
            .collect();
        let keep: Vec<bool> = outside.iter().map(|o| !o).collect();
        let fill = Tensor::from_vec(fill, &[out])?.to_dtype(x.dtype())?;
        let keep = Tensor::from_vec(keep, &[out])?;
        y = Tensor::where_(&keep, &y, &fill)?;
    }
    let mut back = vec![0i64; r as usize];
    for (i, p) in perm.iter().enumerate() {
        back[*p as usize] = i as i64;
    }
    y.permute(&back)?.contiguous()
}

fn string_or(n: &Node, name: &str, default: &str) -> Result<String> {
    Ok(n.string(name)?.unwrap_or_else(|| default.to_string()))
}

/// An optional tensor input as floats (`None` when absent or empty).
fn opt_floats(ins: &[Value], i: usize) -> Result<Option<Vec<f64>>> {
    match ins.get(i) {
        Some(v) if !v.is_none() && v.dims().iter().product::<usize>() > 0 => Ok(Some(v.floats()?)),
        _ => Ok(None),
    }
}

/// ONNX `Resize` (10-19) and `Upsample` (7-9).
pub(super) fn resize(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let x = input(n, ins, 0)?;
    let r = x.rank();
    let upsample = n.op() == "Upsample";
    let legacy = upsample || n.opset < 11;
    let mode = resize_mode(n, upsample, legacy)?;
    let axes: Vec<usize> = match n.ints("axes")? {
        Some(a) => a
            .iter()
            .map(|v| if *v < 0 { *v + r as i64 } else { *v } as usize)
            .collect(),
        None => (0..r).collect(),
    };
    if axes.iter().any(|a| *a >= r) {
        return Err(n.err(format!("axes {axes:?} for a rank-{r} input")));
    }
    let (roi, scales, sizes) = if upsample && n.opset < 9 {
        let s = n
            .floats("scales")?
            .ok_or_else(|| n.err("attribute `scales` is required"))?;
        (None, Some(s.iter().map(|v| *v as f64).collect()), None)
    } else if legacy {
        (None, opt_floats(ins, 1)?, None)
    } else {
        let sizes = match ins.get(3) {
            Some(v) if !v.is_none() && !v.dims().contains(&0) => Some(v.ints()?),
            _ => None,
        };
        (opt_floats(ins, 1)?, opt_floats(ins, 2)?, sizes)
    };
    let (scale, out) = output_sizes(n, x.dims(), &axes, scales.as_deref(), sizes.as_deref())?;
    let k = axes.len();
    let mut y = x;
    for &a in &axes {
        let roi_a = match &roi {
            Some(v) if v.len() == 2 * k => {
                let i = axes.iter().position(|b| *b == a).unwrap();
                (v[i], v[k + i])
            }
            _ => (0.0, 1.0),
        };
        let untouched = (scale[a] - 1.0).abs() < 1e-9 && out[a] == y.dims()[a];
        if untouched && (mode.coord != "tf_crop_and_resize" || roi_a == (0.0, 1.0)) {
            continue;
        }
        if out[a] == 0 {
            return Err(n.err(format!("output size 0 along axis {a}")));
        }
        y = resize_axis(&y, a, out[a], scale[a], roi_a, &mode)?;
    }
    t(y)
}

/// The node's mode attributes, checked (`legacy`: Upsample and Resize-10,
/// asymmetric coordinates and floor rounding).
fn resize_mode(n: &Node, upsample: bool, legacy: bool) -> Result<Mode> {
    let kind = string_or(n, "mode", "nearest")?;
    let kind = match kind.as_str() {
        "nearest" | "linear" | "cubic" => kind,
        "bilinear" if upsample => "linear".into(),
        m => return Err(n.unsupported(format!("mode=`{m}`"))),
    };
    if legacy && kind == "cubic" {
        return Err(n.unsupported("mode=`cubic` before opset 11"));
    }
    let mode = Mode {
        kind,
        coord: if legacy {
            "asymmetric".into()
        } else {
            string_or(n, "coordinate_transformation_mode", "half_pixel")?
        },
        nearest: if legacy {
            "floor".into()
        } else {
            string_or(n, "nearest_mode", "round_prefer_floor")?
        },
        cubic_a: n.float_or("cubic_coeff_a", -0.75)?,
        exclude_outside: n.int_or("exclude_outside", 0)? != 0,
        antialias: n.int_or("antialias", 0)? != 0,
        extrapolation: n.float_or("extrapolation_value", 0.0)?,
    };
    let known = [
        "half_pixel",
        "half_pixel_symmetric",
        "pytorch_half_pixel",
        "align_corners",
        "asymmetric",
        "tf_half_pixel_for_nearest",
        "tf_crop_and_resize",
    ];
    if !known.contains(&mode.coord.as_str()) {
        return Err(n.unsupported(format!("coordinate_transformation_mode=`{}`", mode.coord)));
    }
    let known_nearest = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"];
    if !known_nearest.contains(&mode.nearest.as_str()) {
        return Err(n.unsupported(format!("nearest_mode=`{}`", mode.nearest)));
    }
    if mode.antialias && mode.kind == "nearest" {
        return Err(n.err("antialias=1 with mode=`nearest`"));
    }
    Ok(mode)
}

/// Each dim's scale and output size, from `scales` or from `sizes` (with
/// `keep_aspect_ratio_policy`), over `axes`.
fn output_sizes(
    n: &Node,
    dims: &[usize],
    axes: &[usize],
    scales: Option<&[f64]>,
    sizes: Option<&[i64]>,
) -> Result<(Vec<f64>, Vec<usize>)> {
    let r = dims.len();
    let k = axes.len();
    let mut scale = vec![1.0; r];
    let mut out: Vec<usize> = dims.to_vec();
    match (scales, sizes) {
        (Some(s), None) => {
            if s.len() != k {
                return Err(n.err(format!("{} scales for {k} axes", s.len())));
            }
            for (i, &a) in axes.iter().enumerate() {
                scale[a] = s[i];
                out[a] = (s[i] * dims[a] as f64) as usize;
            }
        }
        (None, Some(sz)) => {
            if sz.len() != k {
                return Err(n.err(format!("{} sizes for {k} axes", sz.len())));
            }
            let ratios: Vec<f64> = axes
                .iter()
                .enumerate()
                .map(|(i, &a)| sz[i] as f64 / dims[a] as f64)
                .collect();
            let policy = string_or(n, "keep_aspect_ratio_policy", "stretch")?;
            let common = match policy.as_str() {
                "stretch" => None,
                "not_larger" => Some(ratios.iter().cloned().fold(f64::INFINITY, f64::min)),
                "not_smaller" => Some(ratios.iter().cloned().fold(0.0, f64::max)),
                p => return Err(n.unsupported(format!("keep_aspect_ratio_policy=`{p}`"))),
            };
            for (i, &a) in axes.iter().enumerate() {
                match common {
                    None => {
                        scale[a] = ratios[i];
                        out[a] = sz[i] as usize;
                    }
                    Some(c) => {
                        scale[a] = c;
                        out[a] = (c * dims[a] as f64 + 0.5) as usize;
                    }
                }
            }
        }
        _ => return Err(n.err("exactly one of `scales` and `sizes` must be given")),
    }
    Ok((scale, out))
}

/// ONNX `LRN` over the channels of (N, C, ...):
/// `x / (bias + alpha/size * sum of x^2 over the channel window)^beta`,
/// the window `[c - floor((size-1)/2), c + ceil((size-1)/2)]`.
pub(super) fn lrn(n: &Node, ins: &[Value]) -> Result<Vec<Value>> {
    let x = input(n, ins, 0)?;
    if x.rank() < 3 || !matches!(x.dtype(), DType::F32 | DType::F64 | DType::F16) {
        return Err(n.err(format!(
            "expected a float (N, C, ...) input, got {} {:?}",
            x.dtype(),
            x.dims()
        )));
    }
    let size = n
        .int("size")?
        .ok_or_else(|| n.err("attribute `size` is required"))?;
    if size < 1 {
        return Err(n.err(format!("size {size} must be at least 1")));
    }
    let alpha = n.float_or("alpha", 1e-4)?;
    let beta = n.float_or("beta", 0.75)?;
    let bias = n.float_or("bias", 1.0)?;
    let c = x.dims()[1];
    let (before, after) = ((size - 1) / 2, (size - 1) - (size - 1) / 2);
    let sq = x.mul(&x)?;
    let mut pads = vec![(0i64, 0i64); x.rank()];
    pads[1] = (before, after);
    let padded = super::ops_nn::pad(&sq, &pads, "constant", 0.0)?;
    let mut sum: Option<Tensor> = None;
    for k in 0..size {
        let s = padded.narrow(1, k, c)?;
        sum = Some(match sum {
            None => s,
            Some(a) => a.add(&s)?,
        });
    }
    let sum = sum.expect("size >= 1");
    let denom = (&(&sum * (alpha / size as f64)) + bias).pow_scalar(beta)?;
    t(x.div(&denom)?)
}
