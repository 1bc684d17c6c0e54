//! torchvision's `roi_align` and `roi_pool` as tensor ops of the boxes, so
//! the sampling positions stay in the graph: roi_align samples each bin
//! bilinearly (torchvision's `bilinear_interpolate`: a sample more than one
//! pixel outside is 0, one inside the border clamps) on a fixed grid and
//! averages; roi_pool takes the max over each bin's pixel window (a mask
//! over the plane, coordinates rounded half away from zero). Only
//! roi_align's adaptive grid (`sampling_ratio <= 0`: ceil(roi size / bins)
//! samples, a count read from the boxes) stops a trace.

use crate::compile::trace;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, BinaryOp, DType, Result, UnaryOp};

/// The graph break of an adaptive roi_align grid.
const ADAPTIVE_GRID: &str =
    "its number of samples per bin depends on the input's values (sampling_ratio <= 0)";

/// The settings of `torchvision.ops.roi_align`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoiAlignOpts {
    pub output_size: [usize; 2],
    pub spatial_scale: f64,
    pub sampling_ratio: i64,
    pub aligned: bool,
}

fn check(op: &str, x: &Tensor, boxes: &Tensor) -> Result<()> {
    if x.rank() != 4 || boxes.rank() != 2 || boxes.dims()[1] != 5 {
        bail!(
            op,
            "expected input (N, C, H, W) and boxes (K, 5) of (batch index, x1, y1, x2, y2), got {} and {}",
            fmt_dims(x.dims()),
            fmt_dims(boxes.dims())
        );
    }
    Ok(())
}

/// Each box's feature plane `(K, C, H W)`, chosen by its batch index.
fn planes(x: &Tensor, boxes: &Tensor) -> Result<Tensor> {
    let b = boxes.select(1, 0)?.to_dtype(DType::I64)?;
    let (c, h, w) = (x.dims()[1], x.dims()[2], x.dims()[3]);
    x.index_select(0, &b)?
        .reshape(&[-1, c as i64, (h * w) as i64])
}

/// A box column times `scale` (minus `offset`), as `(K, 1)`.
fn coord(boxes: &Tensor, col: i64, scale: f64, offset: f64) -> Result<Tensor> {
    boxes
        .select(1, col)?
        .mul_scalar(scale)?
        .sub_scalar(offset)?
        .unsqueeze(1)
}

/// One axis of the samples: the low and high pixel and the weights of
/// each, `(K, bins * grid)`, for positions `start + bin * frac` in a dim of
/// `size` (torchvision's clamping rules).
fn sample_axis(start: &Tensor, bin: &Tensor, frac: &Tensor, size: usize) -> Result<[Tensor; 5]> {
    let p = start.add(&bin.mul(frac)?)?;
    let hi = size as f64;
    let valid = p
        .binary_scalar(BinaryOp::Ge, -1.0, false)?
        .binary(BinaryOp::And, &p.binary_scalar(BinaryOp::Le, hi, false)?)?;
    let q = p.clamp(Some(0.0), Some(hi - 1.0))?;
    let low = q.unary(UnaryOp::Floor)?;
    let high = low.add_scalar(1.0)?.clamp_max(hi - 1.0)?;
    let l = q.sub(&low)?;
    let h = l.neg()?.add_scalar(1.0)?;
    Ok([low, high, h, l, valid.to_dtype(p.dtype())?])
}

/// `torchvision.ops.roi_align(input, boxes, output_size, spatial_scale,
/// sampling_ratio, aligned)` with boxes `(K, 5)`.
pub fn roi_align(x: &Tensor, boxes: &Tensor, o: RoiAlignOpts) -> Result<Tensor> {
    check("roi_align", x, boxes)?;
    if o.sampling_ratio > 0 {
        let g = o.sampling_ratio as usize;
        return roi_align_grid(x, boxes, &o, [g, g]);
    }
    trace::unsupported("roi_align", ADAPTIVE_GRID)?;
    // one box at a time, each with its own grid
    let v = boxes.to_f64_vec();
    let mut outs = vec![];
    for k in 0..boxes.dims()[0] {
        let r = &v[5 * k..5 * k + 5];
        let mut size = [
            (r[4] - r[2]) * o.spatial_scale,
            (r[3] - r[1]) * o.spatial_scale,
        ];
        if !o.aligned {
            size = size.map(|s| s.max(1.0));
        }
        let grid = [0, 1].map(|a| (size[a] / o.output_size[a] as f64).ceil().max(0.0) as usize);
        outs.push(roi_align_grid(x, &boxes.narrow(0, k as i64, 1)?, &o, grid)?);
    }
    if outs.is_empty() {
        let (c, [ph, pw]) = (x.dims()[1], o.output_size);
        return Tensor::zeros(&[0, c, ph, pw], x.dtype()).to_device(x.device());
    }
    Tensor::cat(&outs.iter().collect::<Vec<_>>(), 0)
}

/// roi_align with a `grid` (per H, W) of samples in every bin.
fn roi_align_grid(
    x: &Tensor,
    boxes: &Tensor,
    o: &RoiAlignOpts,
    grid: [usize; 2],
) -> Result<Tensor> {
    let (c, h, w) = (x.dims()[1], x.dims()[2], x.dims()[3]);
    let k = boxes.dims()[0] as i64;
    let [ph, pw] = o.output_size;
    let off = if o.aligned { 0.5 } else { 0.0 };
    let s = o.spatial_scale;
    let (x1, y1) = (coord(boxes, 1, s, off)?, coord(boxes, 2, s, off)?);
    let (x2, y2) = (coord(boxes, 3, s, off)?, coord(boxes, 4, s, off)?);
    let (mut rw, mut rh) = (x2.sub(&x1)?, y2.sub(&y1)?);
    if !o.aligned {
        rw = rw.clamp_min(1.0)?;
        rh = rh.clamp_min(1.0)?;
    }
    let (bw, bh) = (rw.div_scalar(pw as f64)?, rh.div_scalar(ph as f64)?);
    // bin index plus the sample's offset inside it, per sample along an axis
    let frac = |bins: usize, g: usize| -> Result<Tensor> {
        let v: Vec<f64> = (0..bins * g)
            .map(|i| (i / g) as f64 + ((i % g) as f64 + 0.5) / g as f64)
            .collect();
        Ok(super::consts_like(x, v, &[bins * g])?.unsqueeze(0)?)
    };
    let [yl, yh, wyl, wyh, vy] = sample_axis(&y1, &bh, &frac(ph, grid[0])?, h)?;
    let [xl, xh, wxl, wxh, vx] = sample_axis(&x1, &bw, &frac(pw, grid[1])?, w)?;
    let valid = vy.unsqueeze(2)?.mul(&vx.unsqueeze(1)?)?;
    let src = planes(x, boxes)?;
    let (ny, nx) = ((ph * grid[0]) as i64, (pw * grid[1]) as i64);
    let mut acc: Option<Tensor> = None;
    for (yi, wy) in [(&yl, &wyl), (&yh, &wyh)] {
        for (xi, wx) in [(&xl, &wxl), (&xh, &wxh)] {
            let idx = yi
                .mul_scalar(w as f64)?
                .unsqueeze(2)?
                .add(&xi.unsqueeze(1)?)?
                .to_dtype(DType::I64)?
                .reshape(&[k, 1, ny * nx])?
                .expand(&[k, c as i64, ny * nx])?;
            let wt = wy.unsqueeze(2)?.mul(&wx.unsqueeze(1)?)?.mul(&valid)?;
            let v = src.gather(2, &idx)?.mul(&wt.reshape(&[k, 1, ny * nx])?)?;
            acc = Some(match acc {
                Some(a) => a.add(&v)?,
                None => v,
            });
        }
    }
    let count = (grid[0] * grid[1]).max(1) as f64;
    let shape = [
        k,
        c as i64,
        ph as i64,
        grid[0] as i64,
        pw as i64,
        grid[1] as i64,
    ];
    acc.expect("four corners")
        .reshape(&shape)?
        .sum(Some(&[3, 5]), false)?
        .div_scalar(count)
}

/// `round` half away from zero (C's `round`, which torchvision uses).
fn round_away(t: &Tensor) -> Result<Tensor> {
    let r = t.abs()?.add_scalar(0.5)?.unary(UnaryOp::Floor)?;
    r.mul(&t.unary(UnaryOp::Sign)?)
}

/// Each bin's pixel window along one axis as a `(K, bins, size)` mask.
fn bin_mask(
    start: &Tensor,
    len: &Tensor,
    bins: usize,
    size: usize,
    like: &Tensor,
) -> Result<Tensor> {
    let bin = len.div_scalar(bins as f64)?;
    let p =
        super::consts_like(like, (0..bins).map(|i| i as f64).collect(), &[bins])?.unsqueeze(0)?;
    let lo = bin.mul(&p)?.unary(UnaryOp::Floor)?.add(start)?;
    let hi = bin
        .mul(&p.add_scalar(1.0)?)?
        .unary(UnaryOp::Ceil)?
        .add(start)?;
    let (lo, hi) = (
        lo.clamp(Some(0.0), Some(size as f64))?,
        hi.clamp(Some(0.0), Some(size as f64))?,
    );
    let pos = super::consts_like(like, (0..size).map(|i| i as f64).collect(), &[1, 1, size])?;
    pos.ge(&lo.unsqueeze(2)?)?
        .binary(BinaryOp::And, &pos.lt(&hi.unsqueeze(2)?)?)
}

/// `torchvision.ops.roi_pool(input, boxes, output_size, spatial_scale)`:
/// the max of each bin (0 for an empty bin), boxes `(K, 5)`.
pub fn roi_pool(
    x: &Tensor,
    boxes: &Tensor,
    output_size: [usize; 2],
    spatial_scale: f64,
) -> Result<Tensor> {
    check("roi_pool", x, boxes)?;
    let (c, h, w) = (x.dims()[1], x.dims()[2], x.dims()[3]);
    let k = boxes.dims()[0] as i64;
    let [ph, pw] = output_size;
    let r = |col| {
        round_away(
            &boxes
                .select(1, col)?
                .mul_scalar(spatial_scale)?
                .unsqueeze(1)?,
        )
    };
    let (sx, sy, ex, ey) = (r(1)?, r(2)?, r(3)?, r(4)?);
    let rw = ex.sub(&sx)?.add_scalar(1.0)?.clamp_min(1.0)?;
    let rh = ey.sub(&sy)?.add_scalar(1.0)?.clamp_min(1.0)?;
    let mh = bin_mask(&sy, &rh, ph, h, x)?;
    let mw = bin_mask(&sx, &rw, pw, w, x)?;
    // (K, PH, PW, H, W)
    let mask = mh
        .unsqueeze(2)?
        .unsqueeze(4)?
        .binary(BinaryOp::And, &mw.unsqueeze(1)?.unsqueeze(3)?)?;
    let src = planes(x, boxes)?.reshape(&[k, c as i64, 1, 1, h as i64, w as i64])?;
    let inside = mask.unsqueeze(1)?;
    let m = Tensor::where_scalar(&inside, &src, f64::NEG_INFINITY)?.amax(Some(&[-2, -1]), false)?;
    let empty = mask
        .any(Some(&[-2, -1]), false)?
        .logical_not()?
        .unsqueeze(1)?;
    m.masked_fill(&empty, 0.0)
}
