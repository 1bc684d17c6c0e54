//! torchvision's MobileNetV3 (`mobilenet_v3_small`, `mobilenet_v3_large`)
//! with its constructor arguments (`num_classes`, `width_mult`,
//! `reduced_tail`, `dilated`, `dropout`) and state_dict key names
//! (`features.0.0.weight`, `features.1.block.1.fc1.weight`,
//! `features.12.1.running_var`, `classifier.3.bias`), so a torchvision
//! checkpoint saved as safetensors loads strictly.
//!
//! ```no_run
//! use kiln::models::mobilenetv3::{mobilenet_v3_small, MobileNetV3Options};
//! use kiln::nn::{Module, ModuleExt};
//! let m = mobilenet_v3_small(&MobileNetV3Options::default()).unwrap();
//! m.eval();
//! let y = m.forward(&kiln::Tensor::zeros(&[1, 3, 224, 224], kiln::DType::F32)).unwrap();
//! assert_eq!(y.dims(), &[1, 1000]);
//! ```

use super::ops::{conv_norm_activation, make_divisible, ConvSpec, SqueezeExcitation};
use crate::nn::init::{normal_, zeros_};
use crate::nn::{
    Activation, BatchNormOptions, Dropout, Linear, Module, Pool2d, Sequential, Training,
};
use crate::{Result, Tensor};
use kiln_ir::bail;

/// torchvision's `InvertedResidualConfig`: one block's widths (already
/// scaled by `width_mult`), kernel, squeeze-excite, activation and stride.
#[derive(Debug, Clone, PartialEq)]
pub struct InvertedResidualConfig {
    pub input_channels: usize,
    pub kernel: usize,
    pub expanded_channels: usize,
    pub out_channels: usize,
    pub use_se: bool,
    /// Hardswish ("HS") rather than ReLU ("RE").
    pub use_hs: bool,
    pub stride: usize,
    pub dilation: usize,
}

impl InvertedResidualConfig {
    /// `InvertedResidualConfig(input_channels, kernel, expanded_channels,
    /// out_channels, use_se, activation, stride, dilation, width_mult)`,
    /// `activation` being "HS" or "RE".
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        input_channels: usize,
        kernel: usize,
        expanded_channels: usize,
        out_channels: usize,
        use_se: bool,
        activation: &str,
        stride: usize,
        dilation: usize,
        width_mult: f64,
    ) -> InvertedResidualConfig {
        let adjust = |c: usize| adjust_channels(c, width_mult);
        InvertedResidualConfig {
            input_channels: adjust(input_channels),
            kernel,
            expanded_channels: adjust(expanded_channels),
            out_channels: adjust(out_channels),
            use_se,
            use_hs: activation == "HS",
            stride,
            dilation,
        }
    }
}

/// `InvertedResidualConfig.adjust_channels`: `_make_divisible(c * width_mult, 8)`.
pub fn adjust_channels(channels: usize, width_mult: f64) -> usize {
    make_divisible(channels as f64 * width_mult, 8, None)
}

/// MobileNetV3's BatchNorm: `BatchNorm2d(eps=0.001, momentum=0.01)`.
const NORM: BatchNormOptions = BatchNormOptions {
    eps: 1e-3,
    momentum: Some(0.01),
    affine: true,
    track_running_stats: true,
};

/// torchvision's MobileNetV3 `InvertedResidual`: 1x1 expand (when the width
/// changes), depthwise k x k, squeeze-excite with a hardsigmoid gate, 1x1
/// project; the input added back when stride and width are kept.
#[derive(crate::nn::Module)]
#[module(crate = "crate", describe = "describe_block")]
pub struct InvertedResidual {
    pub block: Sequential,
    #[module(skip)]
    use_res_connect: bool,
    training: Training,
}

fn describe_block(_: &InvertedResidual) -> String {
    "InvertedResidual".into()
}

impl InvertedResidual {
    pub fn new(c: &InvertedResidualConfig) -> Result<InvertedResidual> {
        if !(1..=2).contains(&c.stride) {
            bail!("InvertedResidual", "illegal stride value {}", c.stride);
        }
        let act = || {
            Some(if c.use_hs {
                Activation::hardswish()
            } else {
                Activation::relu()
            })
        };
        let (c_in, exp) = (c.input_channels, c.expanded_channels);
        let mut block = Sequential::new();
        if exp != c_in {
            block = block.add(conv_norm_activation(
                c_in,
                exp,
                ConvSpec::new(1),
                NORM,
                act(),
            )?);
        }
        let stride = if c.dilation > 1 { 1 } else { c.stride };
        let dw = ConvSpec::new(c.kernel)
            .stride(stride)
            .dilation(c.dilation)
            .depthwise(exp);
        block = block.add(conv_norm_activation(exp, exp, dw, NORM, act())?);
        if c.use_se {
            let squeeze = make_divisible((exp / 4) as f64, 8, None);
            let gate = Activation::hardsigmoid();
            block = block.add(SqueezeExcitation::new(
                exp,
                squeeze,
                Activation::relu(),
                gate,
            )?);
        }
        let project = conv_norm_activation(exp, c.out_channels, ConvSpec::new(1), NORM, None)?;
        Ok(InvertedResidual {
            block: block.add(project),
            use_res_connect: c.stride == 1 && c_in == c.out_channels,
            training: Training::default(),
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.block.forward(x)?;
        if self.use_res_connect {
            y.add(x)
        } else {
            Ok(y)
        }
    }
}

/// torchvision's `MobileNetV3(inverted_residual_setting, last_channel,
/// num_classes, dropout)`: a strided 3x3 stem, the blocks, a 1x1 conv to 6x
/// the last width (`features`), global average pool, and
/// Linear-Hardswish-Dropout-Linear (`classifier`).
#[derive(crate::nn::Module)]
#[module(crate = "crate")]
pub struct MobileNetV3 {
    pub features: Sequential,
    pub avgpool: Pool2d,
    pub classifier: Sequential,
    training: Training,
}

impl MobileNetV3 {
    /// The model for a block list (torchvision's initialisation: kaiming
    /// normal convs, Linear weights N(0, 0.01), zero biases).
    pub fn new(
        setting: &[InvertedResidualConfig],
        last_channel: usize,
        num_classes: usize,
        dropout: f64,
    ) -> Result<MobileNetV3> {
        let (Some(first), Some(last)) = (setting.first(), setting.last()) else {
            bail!(
                "MobileNetV3",
                "The inverted_residual_setting should not be empty"
            );
        };
        let stem = ConvSpec::new(3).stride(2);
        let mut features = Sequential::new().add(conv_norm_activation(
            3,
            first.input_channels,
            stem,
            NORM,
            Some(Activation::hardswish()),
        )?);
        for c in setting {
            features = features.add(InvertedResidual::new(c)?);
        }
        let lastconv = 6 * last.out_channels;
        features = features.add(conv_norm_activation(
            last.out_channels,
            lastconv,
            ConvSpec::new(1),
            NORM,
            Some(Activation::hardswish()),
        )?);
        let linear = |i, o| -> Result<Linear> {
            let l = Linear::new(i, o, true)?;
            normal_(&l.weight, 0.0, 0.01)?;
            zeros_(l.bias.as_ref().expect("a bias"))?;
            Ok(l)
        };
        Ok(MobileNetV3 {
            features,
            avgpool: Pool2d::AdaptiveAvg([1, 1]),
            classifier: Sequential::new()
                .add(linear(lastconv, last_channel)?)
                .add(Activation::hardswish())
                .add(Dropout::new(dropout)?)
                .add(linear(last_channel, num_classes)?),
            training: Training::default(),
        })
    }

    /// Images (N, 3, H, W) to logits (N, num_classes).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.avgpool.forward(&self.features.forward(x)?)?;
        self.classifier.forward(&y.flatten(1, -1)?)
    }
}

/// The keyword arguments of `mobilenet_v3_small(...)` / `mobilenet_v3_large(...)`;
/// `Default` is torchvision's.
#[derive(Debug, Clone, PartialEq)]
pub struct MobileNetV3Options {
    pub num_classes: usize,
    /// Scales every width (`_make_divisible(c * width_mult, 8)`).
    pub width_mult: f64,
    /// Halves the widths of the last stage (torchvision's `reduced_tail`).
    pub reduced_tail: bool,
    /// Dilation 2 instead of stride 2 in the last stage (`dilated`).
    pub dilated: bool,
    pub dropout: f64,
}

impl Default for MobileNetV3Options {
    fn default() -> Self {
        MobileNetV3Options {
            num_classes: 1000,
            width_mult: 1.0,
            reduced_tail: false,
            dilated: false,
            dropout: 0.2,
        }
    }
}

/// Where a row sits: `reduced_tail` halves the last stage's widths (all but
/// its first block's input and expansion) and `dilated` swaps its stride
/// for dilation 2, as torchvision's tables write `160 // reduce_divider`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Body,
    TailFirst,
    Tail,
}

/// One row of torchvision's tables: input, kernel, expanded, output,
/// squeeze-excite, activation ("HS" or "RE"), stride, stage.
type Row = (usize, usize, usize, usize, bool, &'static str, usize, Stage);

/// torchvision's `_mobilenet_v3_conf`: the block list and `last_channel`.
fn conf(
    rows: &[Row],
    last_channel: usize,
    o: &MobileNetV3Options,
) -> (Vec<InvertedResidualConfig>, usize) {
    let reduce = if o.reduced_tail { 2 } else { 1 };
    let setting = rows
        .iter()
        .map(|&(i, k, e, out, se, act, s, stage)| {
            let (i, e, out, d) = match stage {
                Stage::Body => (i, e, out, 1),
                Stage::TailFirst => (i, e, out / reduce, 1 + usize::from(o.dilated)),
                Stage::Tail => (
                    i / reduce,
                    e / reduce,
                    out / reduce,
                    1 + usize::from(o.dilated),
                ),
            };
            InvertedResidualConfig::new(i, k, e, out, se, act, s, d, o.width_mult)
        })
        .collect();
    (
        setting,
        adjust_channels(last_channel / reduce, o.width_mult),
    )
}

/// torchvision's `mobilenet_v3_small(**options)` (freshly initialised; load
/// torchvision's weights with `load_state_dict`).
pub fn mobilenet_v3_small(o: &MobileNetV3Options) -> Result<MobileNetV3> {
    use Stage::*;
    #[rustfmt::skip]
    let rows: [Row; 11] = [
        (16, 3, 16, 16, true, "RE", 2, Body),
        (16, 3, 72, 24, false, "RE", 2, Body),
        (24, 3, 88, 24, false, "RE", 1, Body),
        (24, 5, 96, 40, true, "HS", 2, Body),
        (40, 5, 240, 40, true, "HS", 1, Body),
        (40, 5, 240, 40, true, "HS", 1, Body),
        (40, 5, 120, 48, true, "HS", 1, Body),
        (48, 5, 144, 48, true, "HS", 1, Body),
        (48, 5, 288, 96, true, "HS", 2, TailFirst),
        (96, 5, 576, 96, true, "HS", 1, Tail),
        (96, 5, 576, 96, true, "HS", 1, Tail),
    ];
    let (setting, last) = conf(&rows, 1024, o);
    MobileNetV3::new(&setting, last, o.num_classes, o.dropout)
}

/// torchvision's `mobilenet_v3_large(**options)`.
pub fn mobilenet_v3_large(o: &MobileNetV3Options) -> Result<MobileNetV3> {
    use Stage::*;
    #[rustfmt::skip]
    let rows: [Row; 15] = [
        (16, 3, 16, 16, false, "RE", 1, Body),
        (16, 3, 64, 24, false, "RE", 2, Body),
        (24, 3, 72, 24, false, "RE", 1, Body),
        (24, 5, 72, 40, true, "RE", 2, Body),
        (40, 5, 120, 40, true, "RE", 1, Body),
        (40, 5, 120, 40, true, "RE", 1, Body),
        (40, 3, 240, 80, false, "HS", 2, Body),
        (80, 3, 200, 80, false, "HS", 1, Body),
        (80, 3, 184, 80, false, "HS", 1, Body),
        (80, 3, 184, 80, false, "HS", 1, Body),
        (80, 3, 480, 112, true, "HS", 1, Body),
        (112, 3, 672, 112, true, "HS", 1, Body),
        (112, 5, 672, 160, true, "HS", 2, TailFirst),
        (160, 5, 960, 160, true, "HS", 1, Tail),
        (160, 5, 960, 160, true, "HS", 1, Tail),
    ];
    let (setting, last) = conf(&rows, 1280, o);
    MobileNetV3::new(&setting, last, o.num_classes, o.dropout)
}
