//! torchvision's EfficientNet (V1: `efficientnet_b0`) with its constructor
//! arguments and state_dict key names (`features.0.0.weight`,
//! `features.2.1.block.2.fc1.weight`, `features.8.1.running_mean`,
//! `classifier.1.weight`), so a torchvision checkpoint saved as safetensors
//! loads strictly.
//!
//! ```no_run
//! use kiln::models::efficientnet::{efficientnet_b0, EfficientNetOptions};
//! use kiln::nn::{Module, ModuleExt};
//! let m = efficientnet_b0(&EfficientNetOptions::default()).unwrap();
//! m.eval();
//! let y = m.forward(&kiln::Tensor::zeros(&[1, 3, 224, 224], kiln::DType::F32)).unwrap();
//! assert_eq!(y.dims(), &[1, 1000]);
//! ```

use super::ops::{
    conv_norm_activation, make_divisible, ConvSpec, SqueezeExcitation, StochasticDepth,
};
use crate::nn::init::{uniform_, zeros_};
use crate::nn::{
    Activation, BatchNormOptions, Dropout, Linear, Module, Pool2d, Sequential, Training,
};
use crate::{Result, Tensor};
use kiln_ir::bail;

/// torchvision's `MBConvConfig`: one stage of MBConv blocks, widths and
/// depth already scaled by `width_mult` and `depth_mult`.
#[derive(Debug, Clone, PartialEq)]
pub struct MBConvConfig {
    pub expand_ratio: f64,
    pub kernel: usize,
    pub stride: usize,
    pub input_channels: usize,
    pub out_channels: usize,
    pub num_layers: usize,
}

impl MBConvConfig {
    /// `MBConvConfig(expand_ratio, kernel, stride, input_channels,
    /// out_channels, num_layers, width_mult, depth_mult)`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        expand_ratio: f64,
        kernel: usize,
        stride: usize,
        input_channels: usize,
        out_channels: usize,
        num_layers: usize,
        width_mult: f64,
        depth_mult: f64,
    ) -> MBConvConfig {
        let adjust = |c: usize| make_divisible(c as f64 * width_mult, 8, None);
        MBConvConfig {
            expand_ratio,
            kernel,
            stride,
            input_channels: adjust(input_channels),
            out_channels: adjust(out_channels),
            num_layers: (num_layers as f64 * depth_mult).ceil() as usize,
        }
    }
}

/// torchvision's `MBConv`: 1x1 expand (when `expand_ratio` widens), depthwise
/// k x k, squeeze-excite (SiLU, sigmoid gate; squeezed to a quarter of the
/// block's input width), 1x1 project; with stride 1 and equal widths the
/// input is added back after stochastic depth.
#[derive(crate::nn::Module)]
#[module(crate = "crate", describe = "describe_block")]
pub struct MBConv {
    pub block: Sequential,
    pub stochastic_depth: StochasticDepth,
    #[module(skip)]
    use_res_connect: bool,
    training: Training,
}

fn describe_block(_: &MBConv) -> String {
    "MBConv".into()
}

impl MBConv {
    pub fn new(
        c: &MBConvConfig,
        stochastic_depth_prob: f64,
        norm: BatchNormOptions,
    ) -> Result<MBConv> {
        if !(1..=2).contains(&c.stride) {
            bail!("MBConv", "illegal stride value {}", c.stride);
        }
        let c_in = c.input_channels;
        let exp = make_divisible(c_in as f64 * c.expand_ratio, 8, None);
        let mut block = Sequential::new();
        if exp != c_in {
            let expand = ConvSpec::new(1);
            block = block.add(conv_norm_activation(
                c_in,
                exp,
                expand,
                norm,
                Some(Activation::silu()),
            )?);
        }
        let dw = ConvSpec::new(c.kernel).stride(c.stride).depthwise(exp);
        block = block
            .add(conv_norm_activation(
                exp,
                exp,
                dw,
                norm,
                Some(Activation::silu()),
            )?)
            .add(SqueezeExcitation::new(
                exp,
                (c_in / 4).max(1),
                Activation::silu(),
                Activation::sigmoid(),
            )?)
            .add(conv_norm_activation(
                exp,
                c.out_channels,
                ConvSpec::new(1),
                norm,
                None,
            )?);
        Ok(MBConv {
            block,
            stochastic_depth: StochasticDepth::new(stochastic_depth_prob)?,
            use_res_connect: c.stride == 1 && c_in == c.out_channels,
            training: Training::default(),
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.block.forward(x)?;
        if self.use_res_connect {
            self.stochastic_depth.forward(&y)?.add(x)
        } else {
            Ok(y)
        }
    }
}

/// torchvision's `EfficientNet(inverted_residual_setting, dropout,
/// stochastic_depth_prob, num_classes, norm_layer, last_channel)`: a strided
/// 3x3 stem, one Sequential of MBConv blocks per stage, a 1x1 conv to
/// `last_channel` (default 4x the last width), global average pool,
/// Dropout-Linear.
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct EfficientNet {
    pub features: Sequential,
    pub avgpool: Pool2d,
    pub classifier: Sequential,
    training: Training,
}

impl EfficientNet {
    /// The model for a stage list (torchvision's initialisation: kaiming
    /// normal convs, the Linear uniform(+-1/sqrt(num_classes)), zero biases).
    /// Block `i` of `n` gets stochastic depth `stochastic_depth_prob * i / n`.
    pub fn new(
        setting: &[MBConvConfig],
        dropout: f64,
        stochastic_depth_prob: f64,
        num_classes: usize,
        norm: BatchNormOptions,
        last_channel: Option<usize>,
    ) -> Result<EfficientNet> {
        let (Some(first), Some(last)) = (setting.first(), setting.last()) else {
            bail!(
                "EfficientNet",
                "The inverted_residual_setting should not be empty"
            );
        };
        let silu = || Some(Activation::silu());
        let stem = ConvSpec::new(3).stride(2);
        let mut features = Sequential::new().add(conv_norm_activation(
            3,
            first.input_channels,
            stem,
            norm,
            silu(),
        )?);
        let total: usize = setting.iter().map(|c| c.num_layers).sum();
        let mut block_id = 0;
        for c in setting {
            let mut stage = Sequential::new();
            for b in 0..c.num_layers {
                // later blocks of a stage take its output width at stride 1
                let mut cb = c.clone();
                if b > 0 {
                    cb.input_channels = cb.out_channels;
                    cb.stride = 1;
                }
                let sd = stochastic_depth_prob * block_id as f64 / total as f64;
                stage = stage.add(MBConv::new(&cb, sd, norm)?);
                block_id += 1;
            }
            features = features.add(stage);
        }
        let lastconv = last_channel.unwrap_or(4 * last.out_channels);
        features = features.add(conv_norm_activation(
            last.out_channels,
            lastconv,
            ConvSpec::new(1),
            norm,
            silu(),
        )?);
        let head = Linear::new(lastconv, num_classes, true)?;
        let range = 1.0 / (num_classes as f64).sqrt();
        uniform_(&head.weight, -range, range)?;
        zeros_(head.bias.as_ref().expect("a bias"))?;
        Ok(EfficientNet {
            features,
            avgpool: Pool2d::AdaptiveAvg([1, 1]),
            classifier: Sequential::new().add(Dropout::new(dropout)?).add(head),
            training: Training::default(),
        })
    }

    /// Images (N, 3, H, W) to logits (N, num_classes).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.avgpool.forward(&self.features.forward(x)?)?;
        self.classifier.forward(&y.flatten(1, -1)?)
    }
}

/// The keyword arguments of `efficientnet_b0(...)`; `Default` is torchvision's.
#[derive(Debug, Clone, PartialEq)]
pub struct EfficientNetOptions {
    pub num_classes: usize,
    pub dropout: f64,
    pub stochastic_depth_prob: f64,
}

impl Default for EfficientNetOptions {
    fn default() -> Self {
        EfficientNetOptions {
            num_classes: 1000,
            dropout: 0.2,
            stochastic_depth_prob: 0.2,
        }
    }
}

/// torchvision's `_efficientnet_conf("efficientnet_bN", width_mult, depth_mult)`:
/// the seven MBConv stages of EfficientNet-B0 scaled.
pub fn efficientnet_conf(width_mult: f64, depth_mult: f64) -> Vec<MBConvConfig> {
    let rows: [(f64, usize, usize, usize, usize, usize); 7] = [
        (1.0, 3, 1, 32, 16, 1),
        (6.0, 3, 2, 16, 24, 2),
        (6.0, 5, 2, 24, 40, 2),
        (6.0, 3, 2, 40, 80, 3),
        (6.0, 5, 1, 80, 112, 3),
        (6.0, 5, 2, 112, 192, 4),
        (6.0, 3, 1, 192, 320, 1),
    ];
    rows.iter()
        .map(|&(e, k, s, i, o, n)| MBConvConfig::new(e, k, s, i, o, n, width_mult, depth_mult))
        .collect()
}

/// torchvision's `efficientnet_b0(**options)` (freshly initialised; load
/// torchvision's weights with `load_state_dict`). Its BatchNorm is
/// PyTorch's default (eps 1e-5, momentum 0.1).
pub fn efficientnet_b0(o: &EfficientNetOptions) -> Result<EfficientNet> {
    let setting = efficientnet_conf(1.0, 1.0);
    let norm = BatchNormOptions::default();
    EfficientNet::new(
        &setting,
        o.dropout,
        o.stochastic_depth_prob,
        o.num_classes,
        norm,
        None,
    )
}
