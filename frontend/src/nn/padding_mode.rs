//! Convolution `padding_mode`s other than zeros: the input is padded
//! explicitly (reflect, replicate, circular) by gathering source indices,
//! so the gradient flows back through `index_select` (reflected and
//! replicated borders receive the sum of their copies' gradients).

use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// `padding_mode` of PyTorch's convolutions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PaddingMode {
    #[default]
    Zeros,
    Reflect,
    Replicate,
    Circular,
}

impl PaddingMode {
    /// `'zeros'`, `'reflect'`, `'replicate'` or `'circular'`.
    ///
    /// ```
    /// use kiln_frontend::nn::PaddingMode;
    /// assert_eq!(PaddingMode::from_name("reflect").unwrap(), PaddingMode::Reflect);
    /// assert!(PaddingMode::from_name("mirror").is_err());
    /// ```
    pub fn from_name(name: &str) -> Result<PaddingMode> {
        Ok(match name {
            "zeros" => PaddingMode::Zeros,
            "reflect" => PaddingMode::Reflect,
            "replicate" => PaddingMode::Replicate,
            "circular" => PaddingMode::Circular,
            other => bail!(
                "padding_mode",
                "expected 'zeros', 'reflect', 'replicate' or 'circular', got '{other}'"
            ),
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            PaddingMode::Zeros => "zeros",
            PaddingMode::Reflect => "reflect",
            PaddingMode::Replicate => "replicate",
            PaddingMode::Circular => "circular",
        }
    }

    /// Source index of padded position `i` (in `-pad .. n + pad`) of a dim of size `n`.
    pub(crate) fn source(self, i: i64, n: i64) -> i64 {
        match self {
            PaddingMode::Reflect if i < 0 => -i,
            PaddingMode::Reflect if i >= n => 2 * (n - 1) - i,
            PaddingMode::Replicate => i.clamp(0, n - 1),
            PaddingMode::Circular => i.rem_euclid(n),
            _ => i,
        }
    }
}

/// Pads each of the trailing `pads.len()` dims of `x` by `pads[i]` on both
/// sides in `mode`.
///
/// ```
/// use kiln_frontend::nn::{pad_symmetric, PaddingMode};
/// use kiln_frontend::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[1, 3]).unwrap();
/// let y = pad_symmetric(&x, &[2], PaddingMode::Reflect).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0, 2.0, 1.0, 2.0, 3.0, 2.0, 1.0]);
/// ```
pub fn pad_symmetric(x: &Tensor, pads: &[usize], mode: PaddingMode) -> Result<Tensor> {
    if pads.len() > x.rank() {
        bail!(
            "pad",
            "{} padded dims for an input of rank {} ({})",
            pads.len(),
            x.rank(),
            fmt_dims(x.dims())
        );
    }
    let first = x.rank() - pads.len();
    let mut y = x.clone();
    for (i, &p) in pads.iter().enumerate() {
        if p == 0 {
            continue;
        }
        let dim = first + i;
        let n = y.dims()[dim];
        if mode == PaddingMode::Reflect && p >= n
            || n == 0
            || mode == PaddingMode::Circular && p > n
        {
            bail!(
                "pad",
                "{} padding {p} is too large for dim {dim} of size {n} (input {})",
                mode.name(),
                fmt_dims(x.dims())
            );
        }
        y = match mode {
            PaddingMode::Zeros => {
                let mut zd = y.dims().to_vec();
                zd[dim] = p;
                let z = Tensor::zeros(&zd, y.dtype());
                Tensor::cat(&[&z, &y, &z], dim as i64)?
            }
            _ => {
                let (n, p) = (n as i64, p as i64);
                let idx: Vec<i64> = (-p..n + p).map(|i| mode.source(i, n)).collect();
                let len = idx.len();
                y.index_select(dim as i64, &Tensor::from_vec(idx, &[len])?)?
            }
        };
    }
    Ok(y)
}

/// `x` (N, C, D, H, W) with `p` zero planes before and after along D.
pub(crate) fn pad_depth_zeros(x: &Tensor, p: usize) -> Result<Tensor> {
    if p == 0 {
        return Ok(x.clone());
    }
    let mut zd = x.dims().to_vec();
    zd[2] = p;
    // on the input's device: cat takes one device
    let z = Tensor::zeros(&zd, x.dtype()).to_device(x.device())?;
    Tensor::cat(&[&z, x, &z], 2)
}
