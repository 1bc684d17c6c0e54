//! `F.pad`: constant (with a value), reflect, replicate and circular
//! padding of the trailing dims, each side on its own; negative pads crop.
//! Constant padding is a `cat` with filled blocks; the other modes gather
//! source indices with `index_select` (whose gradient sums the copies'),
//! as the convolutions' `padding_mode` does.

use crate::nn::PaddingMode;
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// `F.pad(x, pad, mode, value)`: `pad` lists (before, after) pairs from the
/// LAST dim backwards, as PyTorch's; `PaddingMode::Zeros` is `'constant'`
/// (filled with `value`).
///
/// ```
/// use kiln_frontend::{functional as F, nn::PaddingMode, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[1, 3])?;
/// let y = F::pad(&x, &[1, 2], PaddingMode::Zeros, 9.0)?;
/// assert_eq!(y.to_vec::<f32>()?, vec![9.0, 1.0, 2.0, 3.0, 9.0, 9.0]);
/// let r = F::pad(&x, &[1, -1], PaddingMode::Reflect, 0.0)?;
/// assert_eq!(r.to_vec::<f32>()?, vec![2.0, 1.0, 2.0]);
/// # Ok::<(), kiln_frontend::Error>(())
/// ```
pub fn pad(x: &Tensor, pad: &[i64], mode: PaddingMode, value: f64) -> Result<Tensor> {
    if pad.len() % 2 != 0 || pad.len() / 2 > x.rank() {
        bail!(
            "pad",
            "padding length {} must be even and at most twice the rank of the input {}",
            pad.len(),
            fmt_dims(x.dims())
        );
    }
    let mut y = x.clone();
    for (k, side) in pad.chunks(2).enumerate() {
        let dim = x.rank() - 1 - k;
        let (before, after) = (side[0], side[1]);
        if before == 0 && after == 0 {
            continue;
        }
        y = match mode {
            PaddingMode::Zeros => pad_constant(&y, dim, before, after, value)?,
            _ => pad_gather(&y, dim, (before, after), mode, x.dims())?,
        };
    }
    Ok(y)
}

/// Dim `dim` of `y` cropped by negative pads, then `value` blocks added by positive ones.
fn pad_constant(y: &Tensor, dim: usize, before: i64, after: i64, value: f64) -> Result<Tensor> {
    let n = y.dims()[dim] as i64;
    let (lo, hi) = (before.min(0).abs(), after.min(0).abs());
    if lo + hi > n {
        bail!(
            "pad",
            "negative padding ({before}, {after}) removes more than dim {dim} of size {n}"
        );
    }
    let core = y.narrow(dim as i64, lo, (n - lo - hi) as usize)?;
    let block = |p: i64| -> Result<Tensor> {
        let mut d = core.dims_vec();
        d[dim] = p as usize;
        Tensor::full(&d, value, y.dtype()).to_device(y.device())
    };
    let (b, a) = (block(before.max(0))?, block(after.max(0))?);
    Tensor::cat(&[&b, &core, &a], dim as i64)
}

/// Dim `dim` of `y` cropped by negative pads, then extended by the
/// positive ones with the source indices of `mode` (over the cropped dim,
/// as PyTorch's circular padding wraps it).
fn pad_gather(
    y: &Tensor,
    dim: usize,
    (before, after): (i64, i64),
    mode: PaddingMode,
    input: &[usize],
) -> Result<Tensor> {
    let full = y.dims()[dim] as i64;
    let (lo, hi) = (before.min(0).abs(), after.min(0).abs());
    let n = full - lo - hi;
    let (before, after) = (before.max(0), after.max(0));
    let too_big = match mode {
        PaddingMode::Reflect => before >= n || after >= n,
        PaddingMode::Circular => before > n || after > n,
        _ => n <= 0,
    };
    if too_big || n <= 0 {
        let why = if mode == PaddingMode::Circular {
            "wraps around more than once"
        } else {
            "must be less than the padded dim"
        };
        bail!(
            "pad",
            "{} padding ({before}, {after}) {why}: dim {dim} of input {} has size {n}",
            mode.name(),
            fmt_dims(input)
        );
    }
    let idx: Vec<i64> = (-before..n + after)
        .map(|i| lo + mode.source(i, n))
        .collect();
    let len = idx.len();
    let idx = Tensor::from_vec(idx, &[len])?.to_device(y.device())?;
    y.index_select(dim as i64, &idx)
}
