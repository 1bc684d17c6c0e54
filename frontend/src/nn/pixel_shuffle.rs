//! `nn.PixelShuffle`: channels rearranged into space (sub-pixel convolution).

use super::{Entry, Module};
use crate::Tensor;
use kiln_ir::shape::fmt_dims;
use kiln_ir::{bail, Result};

/// `nn.PixelShuffle(upscale_factor)`: (*, C r², H, W) to (*, C, H r, W r),
/// `out[c, h r + i, w r + j] = in[c r² + i r + j, h, w]`; a reshape and a
/// permute, so gradients flow back through the views.
///
/// ```
/// use kiln_frontend::nn::{Module, PixelShuffle};
/// use kiln_frontend::{DType, Tensor};
/// let y = PixelShuffle::new(2).forward(&Tensor::zeros(&[1, 8, 3, 3], DType::F32)).unwrap();
/// assert_eq!(y.dims(), &[1, 2, 6, 6]);
/// ```
pub struct PixelShuffle {
    pub upscale_factor: usize,
}

impl PixelShuffle {
    pub fn new(upscale_factor: usize) -> PixelShuffle {
        PixelShuffle { upscale_factor }
    }
}

impl Module for PixelShuffle {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::hooks::run(self, x, |x| {
            // errors name the layer, as PyTorch's module does
            pixel_shuffle(x, self.upscale_factor).map_err(|e| match e {
                kiln_ir::Error::Op { msg, .. } => kiln_ir::Error::op("PixelShuffle", msg),
                e => e,
            })
        })
    }
    fn visit<'a>(&'a self, _f: &mut dyn FnMut(Entry<'a>)) {}
    fn describe(&self) -> String {
        format!("PixelShuffle(upscale_factor={})", self.upscale_factor)
    }
}

/// `(*, C, H, W)`: the leading dims multiplied into one, and C, H, W.
fn split_dims(op: &str, x: &Tensor) -> Result<(Vec<usize>, usize, usize, usize, usize)> {
    let d = x.dims();
    if d.len() < 3 {
        bail!(
            op,
            "expected an input of at least 3 dims (*, C, H, W), got {}",
            fmt_dims(d)
        );
    }
    let lead = d[..d.len() - 3].to_vec();
    let b = lead.iter().product();
    Ok((lead, b, d[d.len() - 3], d[d.len() - 2], d[d.len() - 1]))
}

/// `F.pixel_shuffle(input, upscale_factor)`: `(*, C r^2, H, W)` to `(*, C, H r, W r)`.
///
/// ```
/// use kiln_frontend::{functional as F, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[1, 4, 1, 1]).unwrap();
/// let y = F::pixel_shuffle(&x, 2).unwrap();
/// assert_eq!(y.dims(), &[1, 1, 2, 2]);
/// assert_eq!(F::pixel_unshuffle(&y, 2).unwrap().to_f64_vec(), x.to_f64_vec());
/// ```
pub fn pixel_shuffle(x: &Tensor, r: usize) -> Result<Tensor> {
    let (mut out, b, c, h, w) = split_dims("pixel_shuffle", x)?;
    if r == 0 || c % (r * r) != 0 {
        bail!(
            "pixel_shuffle",
            "expected (*, C * {r}^2, H, W) with C * {r}^2 channels, got {}",
            fmt_dims(x.dims())
        );
    }
    let c = c / (r * r);
    let y = x
        .reshape_dims(&[b, c, r, r, h, w])?
        .permute(&[0, 1, 4, 2, 5, 3])?;
    out.extend([c, h * r, w * r]);
    y.reshape_dims(&out)
}

/// `F.pixel_unshuffle(input, downscale_factor)`: `(*, C, H r, W r)` to `(*, C r^2, H, W)`.
pub fn pixel_unshuffle(x: &Tensor, r: usize) -> Result<Tensor> {
    let (mut out, b, c, h, w) = split_dims("pixel_unshuffle", x)?;
    if r == 0 || h % r != 0 || w % r != 0 {
        bail!(
            "pixel_unshuffle",
            "height and width must be divisible by downscale_factor {r}, got {}",
            fmt_dims(x.dims())
        );
    }
    let (h, w) = (h / r, w / r);
    let y = x
        .reshape_dims(&[b, c, h, r, w, r])?
        .permute(&[0, 1, 3, 5, 2, 4])?;
    out.extend([c * r * r, h, w]);
    y.reshape_dims(&out)
}
