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
            let r = self.upscale_factor;
            let d = x.dims();
            if d.len() < 3 || r == 0 || d[d.len() - 3] % (r * r) != 0 {
                bail!(
                    "PixelShuffle",
                    "expected (*, C * {r}^2, H, W) with C * {r}^2 channels, got {}",
                    fmt_dims(d)
                );
            }
            let lead: Vec<usize> = d[..d.len() - 3].to_vec();
            let (c, h, w) = (d[d.len() - 3] / (r * r), d[d.len() - 2], d[d.len() - 1]);
            let b: usize = lead.iter().product();
            let y = x
                .reshape_dims(&[b, c, r, r, h, w])?
                .permute(&[0, 1, 4, 2, 5, 3])?;
            let mut out = lead;
            out.extend([c, h * r, w * r]);
            y.reshape_dims(&out)
        })
    }
    fn visit<'a>(&'a self, _f: &mut dyn FnMut(Entry<'a>)) {}
    fn describe(&self) -> String {
        format!("PixelShuffle(upscale_factor={})", self.upscale_factor)
    }
}
