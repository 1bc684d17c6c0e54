//! `F.interpolate` with PyTorch's index conventions: nearest and
//! nearest-exact gather source rows (`index_select`) per spatial dim; the
//! linear family, bicubic, area and antialiased bilinear and bicubic are
//! separable, so
//! each spatial dim is one matmul by a `(in, out)` weight matrix built from
//! PyTorch's own source-index and weight formulas (computed in f32 as its
//! CPU kernels do). Indices and weights depend on the shapes only, so a
//! trace sees views, gathers and matmuls with constant operands.

use super::matmul;
use crate::ops::view_more::index_on;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// What sets the output size: `size=` or `scale_factor=` (one per spatial
/// dim, or one for all), with `recompute_scale_factor`.
#[derive(Debug, Clone, PartialEq)]
pub enum Resize {
    Size(Vec<usize>),
    Scale { factors: Vec<f64>, recompute: bool },
}

/// `F.interpolate(input, size | scale_factor, mode, align_corners,
/// recompute_scale_factor, antialias)` on `(N, C, *spatial)`.
///
/// ```
/// use kiln_frontend::functional::{self as F, Resize};
/// use kiln_frontend::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 3.0], &[1, 1, 2]).unwrap();
/// let y = F::interpolate(&x, &Resize::Size(vec![3]), "linear", Some(true), false).unwrap();
/// assert_eq!(y.to_f64_vec(), vec![1.0, 2.0, 3.0]);
/// let n = F::interpolate(&x, &Resize::Size(vec![4]), "nearest", None, false).unwrap();
/// assert_eq!(n.to_f64_vec(), vec![1.0, 1.0, 3.0, 3.0]);
/// ```
pub fn interpolate(
    x: &Tensor,
    resize: &Resize,
    mode: &str,
    align_corners: Option<bool>,
    antialias: bool,
) -> Result<Tensor> {
    let op = "interpolate";
    let spatial = x.rank().saturating_sub(2);
    if spatial == 0 {
        bail!(
            op,
            "expected (N, C, *spatial) input, got shape {}",
            fmt_dims(x.dims())
        );
    }
    let needs = match mode {
        "linear" => Some(1),
        "bilinear" | "bicubic" => Some(2),
        "trilinear" => Some(3),
        "nearest" | "nearest-exact" | "area" => None,
        m => bail!(op, "unknown mode '{m}' (input {})", fmt_dims(x.dims())),
    };
    if let Some(n) = needs.filter(|&n| n != spatial) {
        bail!(
            op,
            "Got {}D input, but {mode} mode needs {}D input",
            x.rank(),
            n + 2
        );
    }
    if needs.is_none() && align_corners.is_some() {
        bail!(op, "align_corners option can only be set with the interpolating modes: linear | bilinear | bicubic | trilinear");
    }
    if antialias && mode != "bilinear" && mode != "bicubic" {
        bail!(
            op,
            "Anti-alias option is restricted to bilinear and bicubic modes and requires a 4-D tensor as input (got mode {mode})"
        );
    }
    let ac = align_corners.unwrap_or(false);
    let ins: Vec<usize> = x.dims()[2..].to_vec();
    let per_dim = |v: &[f64]| -> Result<Vec<f64>> {
        match v.len() {
            1 => Ok(vec![v[0]; spatial]),
            n if n == spatial => Ok(v.to_vec()),
            n => bail!(
                op,
                "{n} values given for {spatial} spatial dims (input {})",
                fmt_dims(x.dims())
            ),
        }
    };
    let (outs, scales): (Vec<usize>, Vec<Option<f64>>) = match resize {
        Resize::Size(s) => {
            let s = per_dim(&s.iter().map(|&v| v as f64).collect::<Vec<_>>())?;
            (s.iter().map(|&v| v as usize).collect(), vec![None; spatial])
        }
        Resize::Scale { factors, recompute } => {
            let f = per_dim(factors)?;
            let outs = ins
                .iter()
                .zip(&f)
                .map(|(&i, &s)| (i as f64 * s).floor() as usize)
                .collect();
            let sc = f.iter().map(|&s| (!recompute).then_some(s)).collect();
            (outs, sc)
        }
    };
    if outs.contains(&0) {
        bail!(
            op,
            "output size {} must be positive (input {})",
            fmt_dims(&outs),
            fmt_dims(x.dims())
        );
    }
    let mut y = x.clone();
    for d in 0..spatial {
        let dim = (2 + d) as i64;
        let (i, o, s) = (ins[d], outs[d], scales[d]);
        y = match mode {
            "nearest" | "nearest-exact" => {
                let idx = nearest_indices(i, o, s, mode == "nearest-exact");
                y.index_select(dim, &index_on(x, idx)?)?
            }
            _ => {
                let w = match mode {
                    "area" => area_weights(i, o),
                    "bicubic" if antialias => antialias_weights(i, o, s, ac, AaFilter::Cubic),
                    "bicubic" => cubic_weights(i, o, s, ac),
                    _ if antialias => antialias_weights(i, o, s, ac, AaFilter::Triangle),
                    _ => linear_weights(i, o, s, ac),
                };
                apply_weights(&y, dim, &w, i, o)?
            }
        };
    }
    Ok(y)
}

/// `y` with dim `dim` (size `i`) replaced by `w^T` applied along it (`w` is
/// `(o, i)` row-major).
fn apply_weights(y: &Tensor, dim: i64, w: &[f64], i: usize, o: usize) -> Result<Tensor> {
    let mut t = vec![0.0; i * o];
    for r in 0..o {
        for c in 0..i {
            t[c * o + r] = w[r * i + c];
        }
    }
    let wt = super::consts_like(y, t, &[i, o])?;
    matmul(&y.transpose(dim, -1)?, &wt)?.transpose(dim, -1)
}

/// PyTorch's `compute_scales_value<float>`: `1 / scale` when given, else in / out.
fn scale_value(i: usize, o: usize, s: Option<f64>) -> f32 {
    match s {
        Some(s) if s > 0.0 => (1.0 / s) as f32,
        _ => i as f32 / o as f32,
    }
}

/// `area_pixel_compute_scale<float>`.
fn area_scale(i: usize, o: usize, s: Option<f64>, ac: bool) -> f32 {
    if ac {
        if o > 1 {
            (i as f32 - 1.0) / (o as f32 - 1.0)
        } else {
            0.0
        }
    } else {
        scale_value(i, o, s)
    }
}

/// `area_pixel_compute_source_index<float>` (linear clamps at 0, cubic not).
fn source_index(scale: f32, dst: usize, ac: bool, cubic: bool) -> f32 {
    if ac {
        scale * dst as f32
    } else {
        let src = scale * (dst as f32 + 0.5) - 0.5;
        if !cubic && src < 0.0 {
            0.0
        } else {
            src
        }
    }
}

/// `nearest_idx` / `nearest_exact_idx`: floor(dst * scale) or
/// floor((dst + 0.5) * scale), clamped to the last row.
fn nearest_indices(i: usize, o: usize, s: Option<f64>, exact: bool) -> Vec<i64> {
    let scale = scale_value(i, o, s);
    (0..o)
        .map(|d| {
            let src = if exact {
                (((d as f64 + 0.5) * scale as f64) as f32).floor() as i64
            } else if o == i {
                d as i64
            } else if o == 2 * i {
                (d >> 1) as i64
            } else {
                (d as f32 * scale).floor() as i64
            };
            src.min(i as i64 - 1)
        })
        .collect()
}

/// `guard_index_and_lambda`: the floor index (at most `i - 1`) and the
/// fraction past it, clamped to [0, 1].
fn guard(real: f32, i: usize) -> (i64, f32) {
    let idx = (real.floor() as i64).min(i as i64 - 1);
    let lambda = (real - idx as f32).clamp(0.0, 1.0);
    (idx, lambda)
}

/// The (o, i) matrix of linear interpolation (`compute_source_index_and_lambda`).
fn linear_weights(i: usize, o: usize, s: Option<f64>, ac: bool) -> Vec<f64> {
    let mut w = vec![0.0; o * i];
    let scale = area_scale(i, o, s, ac);
    for d in 0..o {
        if o == i {
            w[d * i + d] = 1.0;
            continue;
        }
        let (i0, l1) = guard(source_index(scale, d, ac, false), i);
        let i1 = if i0 < i as i64 - 1 { i0 + 1 } else { i0 };
        w[d * i + i0 as usize] += (1.0 - l1) as f64;
        w[d * i + i1 as usize] += l1 as f64;
    }
    w
}

/// The (o, i) matrix of bicubic interpolation (A = -0.75), taps clamped
/// to the border.
fn cubic_weights(i: usize, o: usize, s: Option<f64>, ac: bool) -> Vec<f64> {
    const A: f32 = -0.75;
    let conv1 = |x: f32| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let conv2 = |x: f32| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    let mut w = vec![0.0; o * i];
    let scale = area_scale(i, o, s, ac);
    for d in 0..o {
        let (i0, t) = guard(source_index(scale, d, ac, true), i);
        let c = [conv2(t + 1.0), conv1(t), conv1(1.0 - t), conv2(2.0 - t)];
        for (k, ck) in c.iter().enumerate() {
            let src = (i0 - 1 + k as i64).clamp(0, i as i64 - 1) as usize;
            w[d * i + src] += *ck as f64;
        }
    }
    w
}

/// `mode='area'`: adaptive average pooling's windows
/// `[floor(d i / o), ceil((d + 1) i / o))`.
fn area_weights(i: usize, o: usize) -> Vec<f64> {
    let mut w = vec![0.0; o * i];
    for d in 0..o {
        let start = d * i / o;
        let end = ((d + 1) * i).div_ceil(o);
        for c in start..end {
            w[d * i + c] = 1.0 / (end - start) as f64;
        }
    }
    w
}

/// The filter of an antialiased resize (PyTorch's `aa_filter`s).
#[derive(Clone, Copy)]
enum AaFilter {
    /// Bilinear: `max(0, 1 - |x|)`, two taps at scale 1.
    Triangle,
    /// Bicubic: Keys' cubic convolution with `a = -0.5` (PIL's, not the
    /// `-0.75` of plain bicubic), four taps at scale 1.
    Cubic,
}

impl AaFilter {
    /// Taps at scale 1 (`interp_size`).
    fn size(self) -> f64 {
        match self {
            AaFilter::Triangle => 2.0,
            AaFilter::Cubic => 4.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        const A: f64 = -0.5;
        let x = x.abs();
        match self {
            AaFilter::Triangle => (1.0 - x).max(0.0),
            AaFilter::Cubic if x < 1.0 => ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0,
            AaFilter::Cubic if x < 2.0 => ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A,
            AaFilter::Cubic => 0.0,
        }
    }
}

/// Antialiased bilinear or bicubic (`_compute_indices_min_size_weights_aa`):
/// the filter widened by the scale when downsampling, normalised per output.
fn antialias_weights(i: usize, o: usize, s: Option<f64>, ac: bool, f: AaFilter) -> Vec<f64> {
    let mut w = vec![0.0; o * i];
    let scale = area_scale(i, o, s, ac) as f64;
    let half = f.size() * 0.5;
    let support = if scale >= 1.0 { half * scale } else { half };
    let invscale = if scale >= 1.0 { 1.0 / scale } else { 1.0 };
    let max_size = support.ceil() as i64 * 2 + 1;
    for d in 0..o {
        let center = scale * (d as f64 + 0.5);
        let xmin = ((center - support + 0.5) as i64).max(0);
        let xsize = ((center + support + 0.5) as i64).min(i as i64) - xmin;
        let xsize = xsize.clamp(0, max_size);
        let taps: Vec<f64> = (0..xsize)
            .map(|j| f.weight(((j + xmin) as f64 - center + 0.5) * invscale))
            .collect();
        let total: f64 = taps.iter().sum();
        for (j, t) in taps.iter().enumerate() {
            let v = if total != 0.0 { t / total } else { *t };
            w[d * i + (xmin as usize + j)] = v;
        }
    }
    w
}
