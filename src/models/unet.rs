//! A small U-Net: one encoder level, a max-pool bottleneck, a
//! `ConvTranspose2d` decoder with a bilinear skip from the bottleneck, the
//! encoder's features concatenated back in, and a 1x1 head giving per-pixel
//! class logits. Its `state_dict` keys are those of the PyTorch module below
//! (`enc1.0.weight`, `enc1.1.running_mean`, `up.weight`, `dec.0.weight`,
//! `out.bias`), the model of `real/unet_tiny` in the PyTorch fixtures with
//! `width` 8, 3 input channels and 2 classes:
//!
//! ```python
//! class TinyUNet(nn.Module):
//!     def __init__(self):
//!         super().__init__()
//!         self.enc1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
//!         self.enc2 = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
//!         self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
//!         self.dec = nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), nn.ReLU())
//!         self.out = nn.Conv2d(8, 2, 1)
//!
//!     def forward(self, x):
//!         a = self.enc1(x)
//!         b = self.enc2(F.max_pool2d(a, 2))
//!         u = self.up(b)
//!         u = u + F.interpolate(b[:, :8], scale_factor=2, mode="bilinear", align_corners=False)
//!         return self.out(self.dec(torch.cat([a, u], dim=1)))
//! ```

use crate::nn::{
    Activation, BatchNorm, Conv, ConvOptions, ConvTranspose2d, Module, Padding, Pool2d,
    Pool2dParams, Sequential, Training, Upsample, UpsampleMode,
};
use crate::{Result, Tensor};
use kiln_ir::bail;
use kiln_ir::op::conv::ConvTransposeParams;
use kiln_ir::shape::fmt_dims;

/// The U-Net's widths; `Default` is the `real/unet_tiny` fixture's model
/// (3 input channels, width 8, 2 classes).
#[derive(Debug, Clone, PartialEq)]
pub struct UNetConfig {
    pub in_channels: usize,
    /// Channels of the full-resolution level; the bottleneck has twice as many.
    pub width: usize,
    pub num_classes: usize,
}

impl Default for UNetConfig {
    fn default() -> Self {
        UNetConfig {
            in_channels: 3,
            width: 8,
            num_classes: 2,
        }
    }
}

/// A padded 3x3 conv with bias (`nn.Conv2d(c_in, c_out, 3, padding=1)`).
fn conv3x3(c_in: usize, c_out: usize) -> Result<Conv> {
    let o = ConvOptions {
        padding: Padding::Explicit(vec![1]),
        ..ConvOptions::default()
    };
    Conv::conv2d(c_in, c_out, 3, o)
}

/// `nn.Sequential(conv3x3, BatchNorm2d, ReLU)`.
fn conv_bn_relu(c_in: usize, c_out: usize) -> Result<Sequential> {
    Ok(Sequential::new()
        .add(conv3x3(c_in, c_out)?)
        .add(BatchNorm::new_2d(c_out))
        .add(Activation::relu()))
}

/// The U-Net of the module docs, sized by a [`UNetConfig`].
///
/// ```
/// use kiln::models::unet::{UNet, UNetConfig};
/// use kiln::nn::{Module, ModuleExt};
/// let m = UNet::new(&UNetConfig::default()).unwrap();
/// assert_eq!(m.state_dict()[0].0, "enc1.0.weight");
/// let y = m.forward(&kiln::Tensor::zeros(&[2, 3, 16, 16], kiln::DType::F32)).unwrap();
/// assert_eq!(y.dims(), &[2, 2, 16, 16]); // per-pixel logits
/// ```
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct UNet {
    pub enc1: Sequential,
    pub enc2: Sequential,
    pub up: ConvTranspose2d,
    pub dec: Sequential,
    pub out: Conv,
    /// `F.max_pool2d(a, 2)` and `F.interpolate(scale_factor=2, mode="bilinear")`:
    /// functional calls in PyTorch, so not children (nothing in the state_dict).
    #[module(skip)]
    pool: Pool2d,
    #[module(skip)]
    upsample: Upsample,
    #[module(skip)]
    config: UNetConfig,
    training: Training,
}

impl UNet {
    /// A fresh model (PyTorch's default initialisation).
    pub fn new(c: &UNetConfig) -> Result<UNet> {
        let w = c.width;
        if w == 0 || c.in_channels == 0 || c.num_classes == 0 {
            bail!(
                "UNet",
                "in_channels, width and num_classes must be positive, got {c:?}"
            );
        }
        let up = ConvTransposeParams {
            stride: vec![2],
            ..ConvTransposeParams::default()
        };
        Ok(UNet {
            enc1: conv_bn_relu(c.in_channels, w)?,
            enc2: conv_bn_relu(w, 2 * w)?,
            up: ConvTranspose2d::new(2 * w, w, 2, up, true)?,
            dec: Sequential::new()
                .add(conv3x3(2 * w, w)?)
                .add(Activation::relu()),
            out: Conv::conv2d(w, c.num_classes, 1, ConvOptions::default())?,
            pool: Pool2d::Max(Pool2dParams::new([2, 2])),
            upsample: Upsample::scale(&[2.0], UpsampleMode::Linear),
            config: c.clone(),
            training: Training::default(),
        })
    }

    /// Images (N, in_channels, H, W), H and W even, to per-pixel logits
    /// (N, num_classes, H, W).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let d = x.dims();
        if x.rank() != 4 || d[1] != self.config.in_channels || d[2] % 2 != 0 || d[3] % 2 != 0 {
            bail!(
                "UNet",
                "expected images (N, {}, H, W) with H and W even (one 2x2 pooling level), got {}",
                self.config.in_channels,
                fmt_dims(d)
            );
        }
        let a = self.enc1.forward(x)?;
        let b = self.enc2.forward(&self.pool.forward(&a)?)?;
        // the bilinear skip takes the bottleneck's first `width` channels
        let skip = b.narrow(1, 0, self.config.width)?;
        let u = self.up.forward(&b)?.add(&self.upsample.forward(&skip)?)?;
        self.out
            .forward(&self.dec.forward(&Tensor::cat(&[&a, &u], 1)?)?)
    }
}
