//! `F.affine_grid` and `F.grid_sample` (2-D) as graph ops: the grid is a
//! constant base grid times `theta^T`; sampling unnormalises the grid,
//! applies the padding mode to the coordinates (clip for border, PyTorch's
//! `reflect_coordinates` for reflection), and gathers the taps from the
//! flattened planes with their weights (bilinear, nearest, bicubic with
//! A = -0.75), a tap outside the input weighing 0. The weights are
//! differentiable tensor ops of the grid, so both gradients come from the
//! primitives' rules.

use super::matmul;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, BinaryOp, DType, Result, UnaryOp};

/// PyTorch's `linspace_from_neg_one`: `steps` points over [-1, 1], scaled by
/// `(steps - 1) / steps` without `align_corners` (pixel centres).
fn neg_one_to_one(steps: usize, align_corners: bool) -> Vec<f64> {
    if steps <= 1 {
        return vec![0.0; steps];
    }
    (0..steps)
        .map(|i| {
            let v = -1.0 + 2.0 * i as f64 / (steps - 1) as f64;
            if align_corners {
                v
            } else {
                v * (steps - 1) as f64 / steps as f64
            }
        })
        .collect()
}

/// `F.affine_grid(theta, size, align_corners)` for 2-D: `theta` `(N, 2, 3)`,
/// `size` `[N, C, H, W]`, giving an `(N, H, W, 2)` grid of (x, y).
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let id = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0], &[1, 2, 3]).unwrap();
/// let g = F::affine_grid(&id, &[1, 1, 1, 2], true).unwrap();
/// assert_eq!(g.to_f64_vec(), vec![-1.0, 0.0, 1.0, 0.0]);
/// ```
pub fn affine_grid(theta: &Tensor, size: &[usize], align_corners: bool) -> Result<Tensor> {
    let op = "affine_grid";
    let &[n, _, h, w] = size else {
        bail!(
            op,
            "only 2-D sizes [N, C, H, W] are supported here, got {}",
            fmt_dims(size)
        );
    };
    if theta.dims() != [n, 2, 3] {
        bail!(
            op,
            "Expected a batch of 2D affine matrices of shape Nx2x3 for size {}. Got {}.",
            fmt_dims(size),
            fmt_dims(theta.dims())
        );
    }
    let (xs, ys) = (
        neg_one_to_one(w, align_corners),
        neg_one_to_one(h, align_corners),
    );
    let mut base = Vec::with_capacity(h * w * 3);
    for y in &ys {
        for x in &xs {
            base.extend([*x, *y, 1.0]);
        }
    }
    let base = super::consts_like(theta, base, &[1, h * w, 3])?;
    matmul(&base, &theta.transpose(1, 2)?)?.reshape(&[n as i64, h as i64, w as i64, 2])
}

/// `padding_mode=` of `F.grid_sample`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GridPadding {
    Zeros,
    Border,
    Reflection,
}

/// `mode=` of `F.grid_sample`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GridMode {
    Bilinear,
    Nearest,
    Bicubic,
}

impl GridPadding {
    /// PyTorch's spelling (`zeros`, `border`, `reflection`).
    pub fn parse(s: &str) -> Result<GridPadding> {
        match s {
            "zeros" => Ok(GridPadding::Zeros),
            "border" => Ok(GridPadding::Border),
            "reflection" => Ok(GridPadding::Reflection),
            _ => bail!(
                "grid_sample",
                "padding_mode must be zeros, border or reflection, got '{s}'"
            ),
        }
    }
}

impl GridMode {
    /// PyTorch's spelling (`bilinear`, `nearest`, `bicubic`).
    pub fn parse(s: &str) -> Result<GridMode> {
        match s {
            "bilinear" => Ok(GridMode::Bilinear),
            "nearest" => Ok(GridMode::Nearest),
            "bicubic" => Ok(GridMode::Bicubic),
            _ => bail!(
                "grid_sample",
                "mode must be bilinear, nearest or bicubic, got '{s}'"
            ),
        }
    }
}

/// One spatial axis of the sampled input: its size and the settings.
#[derive(Clone, Copy)]
struct Axis {
    size: usize,
    padding: GridPadding,
    align_corners: bool,
}

impl Axis {
    /// `grid_sampler_unnormalize`: [-1, 1] to pixel coordinates.
    fn unnormalize(&self, g: &Tensor) -> Result<Tensor> {
        let s = self.size as f64;
        if self.align_corners {
            g.add_scalar(1.0)?.mul_scalar((s - 1.0) / 2.0)
        } else {
            g.add_scalar(1.0)?.mul_scalar(s / 2.0)?.sub_scalar(0.5)
        }
    }

    /// `compute_coordinates`: the padding mode applied to a coordinate.
    fn pad(&self, x: &Tensor) -> Result<Tensor> {
        let hi = self.size as f64 - 1.0;
        match self.padding {
            GridPadding::Zeros => Ok(x.clone()),
            GridPadding::Border => x.clamp(Some(0.0), Some(hi)),
            GridPadding::Reflection => {
                let r = if self.align_corners {
                    reflect(x, 0.0, 2.0 * hi)?
                } else {
                    reflect(x, -1.0, 2.0 * self.size as f64 - 1.0)?
                };
                r.clamp(Some(0.0), Some(hi))
            }
        }
    }

    /// Whether integer coordinate `c` lies inside the axis.
    fn inside(&self, c: &Tensor) -> Result<Tensor> {
        let lo = c.binary_scalar(BinaryOp::Ge, 0.0, false)?;
        let hi = c.binary_scalar(BinaryOp::Le, self.size as f64 - 1.0, false)?;
        lo.binary(BinaryOp::And, &hi)
    }
}

/// PyTorch's `reflect_coordinates(x, twice_low, twice_high)`.
fn reflect(x: &Tensor, twice_low: f64, twice_high: f64) -> Result<Tensor> {
    if twice_low == twice_high {
        return x.mul_scalar(0.0);
    }
    let min = twice_low / 2.0;
    let span = (twice_high - twice_low) / 2.0;
    let a = x.sub_scalar(min)?.abs()?;
    // fmod(a, span) as a - flips span: the same value, its gradient 1 in a
    let flips = a.div_scalar(span)?.unary(UnaryOp::Floor)?;
    let extra = a.sub(&flips.mul_scalar(span)?)?;
    let even = flips
        .binary_scalar(BinaryOp::Remainder, 2.0, false)?
        .binary_scalar(BinaryOp::Eq, 0.0, false)?;
    let up = extra.add_scalar(min)?;
    let down = extra.neg()?.add_scalar(span + min)?;
    Tensor::where_(&even, &up, &down)
}

/// The taps' values: `planes` `(N, C, H W)` at integer coordinates
/// `(cx, cy)` `(N, Ho, Wo)`, times `weight` (0 outside the input).
fn tap(
    planes: &Tensor,
    ax: [Axis; 2],
    cx: &Tensor,
    cy: &Tensor,
    weight: &Tensor,
) -> Result<Tensor> {
    let (xa, ya) = (ax[0], ax[1]);
    let (cx, cy) = (xa.pad(cx)?, ya.pad(cy)?);
    let inside = xa.inside(&cx)?.binary(BinaryOp::And, &ya.inside(&cy)?)?;
    let w = weight.mul(&inside.to_dtype(weight.dtype())?)?;
    let ix = cx.clamp(Some(0.0), Some(xa.size as f64 - 1.0))?;
    let iy = cy.clamp(Some(0.0), Some(ya.size as f64 - 1.0))?;
    let flat = iy
        .mul_scalar(xa.size as f64)?
        .add(&ix)?
        .to_dtype(DType::I64)?;
    let (n, c) = (planes.dims()[0] as i64, planes.dims()[1] as i64);
    let (ho, wo) = (cx.dims()[1] as i64, cx.dims()[2] as i64);
    let idx = flat.reshape(&[n, 1, ho * wo])?.expand(&[n, c, ho * wo])?;
    let v = planes.gather(2, &idx)?.reshape(&[n, c, ho, wo])?;
    v.mul(&w.unsqueeze(1)?)
}

/// The bicubic convolution weights (A = -0.75) of the 4 taps around `t`.
fn cubic_coeffs(t: &Tensor) -> Result<[Tensor; 4]> {
    const A: f64 = -0.75;
    let conv1 = |x: &Tensor| -> Result<Tensor> {
        x.mul_scalar(A + 2.0)?
            .sub_scalar(A + 3.0)?
            .mul(x)?
            .mul(x)?
            .add_scalar(1.0)
    };
    let conv2 = |x: &Tensor| -> Result<Tensor> {
        x.mul_scalar(A)?
            .sub_scalar(5.0 * A)?
            .mul(x)?
            .add_scalar(8.0 * A)?
            .mul(x)?
            .sub_scalar(4.0 * A)
    };
    let one_minus = t.neg()?.add_scalar(1.0)?;
    Ok([
        conv2(&t.add_scalar(1.0)?)?,
        conv1(t)?,
        conv1(&one_minus)?,
        conv2(&one_minus.add_scalar(1.0)?)?,
    ])
}

/// `F.grid_sample(input, grid, mode, padding_mode, align_corners)` for 4-D
/// input `(N, C, H, W)` and grid `(N, Ho, Wo, 2)`.
///
/// ```
/// use kiln_frontend::functional::{self as F, GridMode, GridPadding};
/// use kiln_frontend::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 3.0], &[1, 1, 1, 2]).unwrap();
/// let g = Tensor::from_vec(vec![0.0f32, 0.0], &[1, 1, 1, 2]).unwrap();
/// let y = F::grid_sample(&x, &g, GridMode::Bilinear, GridPadding::Zeros, true).unwrap();
/// assert_eq!(y.to_f64_vec(), vec![2.0]);
/// ```
pub fn grid_sample(
    input: &Tensor,
    grid: &Tensor,
    mode: GridMode,
    padding: GridPadding,
    align_corners: bool,
) -> Result<Tensor> {
    let &[n, c, h, w] = input.dims() else {
        bail!(
            "grid_sample",
            "only 4-D input is supported here, got {}",
            fmt_dims(input.dims())
        );
    };
    if grid.rank() != 4 || grid.dims()[0] != n || grid.dims()[3] != 2 {
        bail!(
            "grid_sample",
            "expected grid of shape (N, H_out, W_out, 2) with N = {n} for input {}, got {}",
            fmt_dims(input.dims()),
            fmt_dims(grid.dims())
        );
    }
    let ax = |size| Axis {
        size,
        padding,
        align_corners,
    };
    let axes = [ax(w), ax(h)];
    let planes = input.reshape(&[n as i64, c as i64, (h * w) as i64])?;
    let gx = axes[0].unnormalize(&grid.select(3, 0)?)?;
    let gy = axes[1].unnormalize(&grid.select(3, 1)?)?;
    let ones = gx.ones_like(None)?;
    match mode {
        GridMode::Nearest => {
            let (x, y) = (axes[0].pad(&gx)?.round()?, axes[1].pad(&gy)?.round()?);
            // already padded: sample with no second padding
            let raw = axes.map(|a| Axis {
                padding: GridPadding::Zeros,
                ..a
            });
            tap(&planes, raw, &x, &y, &ones)
        }
        GridMode::Bilinear => {
            let (x, y) = (axes[0].pad(&gx)?, axes[1].pad(&gy)?);
            let (x0, y0) = (x.unary(UnaryOp::Floor)?, y.unary(UnaryOp::Floor)?);
            let (x1, y1) = (x0.add_scalar(1.0)?, y0.add_scalar(1.0)?);
            let (wx1, wy1) = (x.sub(&x0)?, y.sub(&y0)?);
            let (wx0, wy0) = (x1.sub(&x)?, y1.sub(&y)?);
            let raw = axes.map(|a| Axis {
                padding: GridPadding::Zeros,
                ..a
            });
            let mut out = tap(&planes, raw, &x0, &y0, &wx0.mul(&wy0)?)?;
            out = out.add(&tap(&planes, raw, &x1, &y0, &wx1.mul(&wy0)?)?)?;
            out = out.add(&tap(&planes, raw, &x0, &y1, &wx0.mul(&wy1)?)?)?;
            out.add(&tap(&planes, raw, &x1, &y1, &wx1.mul(&wy1)?)?)
        }
        GridMode::Bicubic => {
            let (x0, y0) = (gx.unary(UnaryOp::Floor)?, gy.unary(UnaryOp::Floor)?);
            let cx = cubic_coeffs(&gx.sub(&x0)?)?;
            let cy = cubic_coeffs(&gy.sub(&y0)?)?;
            let mut out: Option<Tensor> = None;
            for (j, wy) in cy.iter().enumerate() {
                let ty = y0.add_scalar(j as f64 - 1.0)?;
                for (i, wx) in cx.iter().enumerate() {
                    let tx = x0.add_scalar(i as f64 - 1.0)?;
                    let v = tap(&planes, axes, &tx, &ty, &wx.mul(wy)?)?;
                    out = Some(match out {
                        Some(o) => o.add(&v)?,
                        None => v,
                    });
                }
            }
            Ok(out.expect("16 taps"))
        }
    }
}
